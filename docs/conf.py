"""Sphinx configuration of the documentation site: bash scripts/docs.sh builds it.

The pages are MyST Markdown, so that they read the same on GitHub; the API reference is
autodoc, which imports the package, so Django is set up here on an in-memory SQLite database
(nothing is queried).
"""

import sys
from pathlib import Path

import django
from django.conf import settings

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

settings.configure(
    INSTALLED_APPS=[
        "django.contrib.admin",
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django_periodic",
    ],
    DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
    USE_TZ=True,
    TIME_ZONE="UTC",
)
django.setup()

project = "django-periodic"
author = "the django-periodic authors"
copyright = "the django-periodic authors"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "conftest.py"]
# Headings get anchors, so that links such as semantics.md#graceful-shutdown resolve (and are
# checked) on the site as they do on GitHub.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
# Optional integrations the docs' venv does not install.
autodoc_mock_imports = ["health_check"]

# -n checks every reference; types from outside the package (no intersphinx, so that the
# build needs no network) and the package's internals behind the public names are not pages.
nitpick_ignore_regex = [
    ("py:class", r"(datetime|collections\.abc|typing|types|django(\.\w+)*)\.\w+"),
    ("py:class", r"django_periodic\.(choices|triggers|registry|scopes)\.\w+"),
    # What Schedule.backfill() returns: its fields are described under "Backfill", not a page.
    ("py:class", r"BackfillResult"),
    # prometheus-client's, an optional dependency without intersphinx here.
    ("py:class", r"(prometheus_client\.)?CollectorRegistry"),
]

html_theme = "furo"
html_title = "django-periodic"
