"""The Python examples of README.md and docs/*.md, run as tests (Sybil), so the docs cannot drift.

- A ```python block runs as code. One that starts with a file comment (``# billing/jobs.py``)
  runs as that module, so its ``@job`` functions get the names the text promises
  (``billing.jobs.send_report``).
- A ```pycon block is a doctest: its output must match ("..." stands for anything).
- ``% skip: next`` before a block (a MyST comment, invisible on the site) skips it, for code
  that needs a project around it (your models, your URLs).

Each page is one namespace, top to bottom; each block gets the test database in a
transaction of its own (pytest-django's ``db``: rows do not outlive their block), and the
jobs and scope providers a page registers are forgotten after it.
"""

import doctest
import re

from sybil import Example, Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.myst import CodeBlockParser, SkipParser

from django_periodic import registry, scopes

# Each run of scripts/test.sh compares its skips with those it declares (tests/skips.py).
pytest_plugins = ["tests.skips"]

# "# billing/jobs.py" on a block's first line: the module the block stands for.
MODULE_COMMENT = re.compile(r"#\s*([\w/]+)\.py\b")

# "..." stands for what changes between runs (times, ids); line breaks are not significant.
DOCTEST_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


class ModuleEvaluator(PythonEvaluator):
    """Runs a block with ``__name__`` set to the module its file comment names."""

    def __call__(self, example: Example) -> None:
        first_line = example.parsed.lstrip().partition("\n")[0]
        match = MODULE_COMMENT.match(first_line)
        example.namespace["__name__"] = match[1].replace("/", ".") if match else "docs_example"
        super().__call__(example)


def run_session(example: Example) -> str | None:
    """Runs a ```pycon block as one doctest, so that one example (one database transaction)
    holds the whole session; returns doctest's report when an output differs."""
    session = doctest.DocTestParser().get_doctest(
        example.parsed, example.namespace, str(example.path), str(example.path), example.line
    )
    session.globs = example.namespace  # not a copy: the page's later blocks see its names
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=DOCTEST_FLAGS)
    runner.run(session, out=report.append, clear_globs=False)
    return "".join(report) if runner.failures else None


def forget_registrations(namespace):
    namespace["_saved_registrations"] = (registry.registered_jobs(), scopes.registered_providers())


def restore_registrations(namespace):
    jobs, providers = namespace.pop("_saved_registrations")
    registry._registry.clear()
    registry._registry.update(jobs)
    scopes._registry.clear()
    scopes._registry.update(providers)


pytest_collect_file = Sybil(
    parsers=[
        CodeBlockParser("python", ModuleEvaluator()),
        CodeBlockParser("pycon", run_session),
        SkipParser(),
    ],
    patterns=["docs/*.md", "README.md"],
    fixtures=["db"],
    setup=forget_registrations,
    teardown=restore_registrations,
).pytest()
