"""The job APScheduler runs in the comparison (importable by its textual reference)."""


def noop() -> None:
    """Does nothing."""
