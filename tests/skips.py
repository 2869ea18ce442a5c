"""The skips each run of the test command expects, and a check that no other happens.

scripts/test.sh names the run it starts in ``PERIODIC_EXPECTED_SKIPS`` (its stage part,
``ENV/DB`` or ``ENV/DB:MARKERS``) when it runs the whole suite. At the end of that run, the
skips are counted by reason and compared with ``EXPECTED``: a skip of another reason, or
another count, fails the run and prints both tables. So a service that did not start, a
package that did not install or a fixture that skips too eagerly cannot leave a green run
with a suite missing. A run narrowed by the caller (``-k``, paths) is not checked.

The PostgreSQL-only tests are counted, not declared: on SQLite, every collected test that
uses the ``postgres`` fixture skips for it, and no other test does. When a change adds or
removes tests that skip for another reason, update the counts here in the same change.
"""

import os
from collections import Counter

import pytest

ENV_VAR = "PERIODIC_EXPECTED_SKIPS"

_POSTGRES = "needs PostgreSQL (PERIODIC_TEST_DB=postgres)"
_POSTGRES_SESSIONS = "PostgreSQL backends and sessions"
_ROW_LOCKS = "row locks: PostgreSQL"
_VENDOR = "postgresql only: the other database refuses the value"
_MAILERS = "MAILERS are Django 6.1's"
_BROWSER_ONCE = "browser tests run once per test.sh, in its first run"

_SQLITE_ONLY = "only on SQLite (PERIODIC_TEST_DB=sqlite)"
_SQLITE_VENDOR = "sqlite only: the other database refuses the value"
_PGBOUNCER = "needs PgBouncer (PERIODIC_TEST_PGBOUNCER_URL)"

# What SQLite cannot run besides the PostgreSQL-only tests (counted at collection): the
# worker-connection tests of PostgreSQL's sessions, a row lock, an importer value only
# PostgreSQL's column takes.
_ON_SQLITE = {_POSTGRES_SESSIONS: 3, _ROW_LOCKS: 1, _VENDOR: 1}
# What PostgreSQL (direct) leaves out: SQLite's own behaviour, and the PgBouncer tests.
_ON_POSTGRES = {_SQLITE_ONLY: 4, _SQLITE_VENDOR: 2, _PGBOUNCER: 6}

# Per run: each reason a test may skip for, and how many tests skip for it. The browser
# tests run in the first run (py311-django52/sqlite) and skip in the other SQLite runs;
# MAILERS are tested on Django 6.1 only.
EXPECTED: dict[str, dict[str, int]] = {
    "py311-django52/sqlite": {**_ON_SQLITE, _MAILERS: 1},
    "py311-django52/pgbouncer": {},
    "py311-django52/postgres:not crash and not upgrade": {**_ON_POSTGRES, _MAILERS: 1},
    "py311-django52/postgres:crash or upgrade": {},
    "py313-django6/sqlite": {**_ON_SQLITE, _BROWSER_ONCE: 24},
    "py312-django6/postgres": _ON_POSTGRES,
    "py312-django6/sqlite": {**_ON_SQLITE, _BROWSER_ONCE: 24},
}

_seen: Counter[str] = Counter()
_mismatch: list[str] = []
_postgres_only = 0


def pytest_collection_finish(session: pytest.Session) -> None:
    global _postgres_only
    _postgres_only = sum("postgres" in item.fixturenames for item in session.items)


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, "wasxfail"):
        _seen[_reason(report)] += 1


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    run = os.environ.get(ENV_VAR)
    if not run:
        return
    expected = Counter(EXPECTED.get(run, {}))
    if run.partition(":")[0].endswith("/sqlite"):
        expected[_POSTGRES] = _postgres_only
    if run not in EXPECTED:
        _mismatch.append(f"no skips are declared for the run {run!r} in tests/skips.py")
    for reason in sorted(set(expected) | set(_seen)):
        if expected[reason] != _seen[reason]:
            _mismatch.append(f"{_seen[reason]:5} skipped (expected {expected[reason]}): {reason}")
    if _mismatch and exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _mismatch:
        terminalreporter.section("unexpected skips (tests/skips.py)", red=True)
        for line in _mismatch:
            terminalreporter.write_line(line)
