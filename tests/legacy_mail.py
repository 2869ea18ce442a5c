"""Tests that send through Django's email settings (``EMAIL_*``, ``get_connection()``): the
path of a project without ``MAILERS``, which Django 6.1 deprecates, so its warnings are
expected there and nowhere else."""

import pytest

WARNINGS = [
    pytest.mark.filterwarnings(f"ignore:{message}")
    for message in (
        r"The EMAIL_\w+ setting is deprecated",
        r"get_connection\(\) is deprecated",
        r"Django 2028 will not have a default mailer",
        r"The 'connection' argument is deprecated",
        r"Using \(name, address\) pairs in the ADMINS setting is deprecated",
    )
]


def legacy_mail(test):
    """Expect Django 6.1's warnings about the email settings in ``test``."""
    for mark in WARNINGS:
        test = mark(test)
    return test
