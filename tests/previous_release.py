"""The previous release, checked out beside this one, and its processes on the test database.

Its code runs from a temporary ``git worktree``, first on PYTHONPATH so that its
``django_periodic`` and ``tests`` packages shadow ours, with this virtualenv's other packages:
the environment it shares with us is that of a deploy that changes our package only.
"""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.db import connection

from tests import crash, processes

# The release before this one: the commit issue 29 ("Upgrades without downtime") started
# from. Move it to the last released commit at each release.
COMMIT = "b1de8e5"


def git(*args: str) -> subprocess.CompletedProcess[str]:
    # safe.directory: CI runs as root on a clone another user may own.
    command = ["git", "-c", f"safe.directory={processes.ROOT}", "-C", str(processes.ROOT)]
    return subprocess.run([*command, *args], capture_output=True, text=True, check=False)


@contextmanager
def worktree(parent: Path) -> Iterator[Path]:
    """The previous release checked out under ``parent``; removed at the end."""
    if git("cat-file", "-e", f"{COMMIT}^{{commit}}").returncode != 0:
        pytest.fail(
            f"The previous release, commit {COMMIT}, is not in this clone: a shallow clone "
            "lacks it (git fetch --unshallow, or clone with full history).",
            pytrace=False,
        )
    path = parent / f"release-{COMMIT}"
    added = git("worktree", "add", "--detach", str(path), COMMIT)
    assert added.returncode == 0, added.stderr
    try:
        yield path
    finally:
        git("worktree", "remove", "--force", str(path))
        git("worktree", "prune")


def environment(path: Path, settings: dict | None = None) -> dict[str, str]:
    """A child's environment: the previous release's code first, on the test database."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PERIODIC_TEST_DB_NAME": connection.settings_dict["NAME"],
        "PERIODIC_TEST_SETTINGS": json.dumps(settings or {}),
        "PYTHONPATH": str(path),
    }


def shell(path: Path, code: str) -> str:
    """Run ``code`` in ``manage.py shell`` of the previous release; return what it printed.

    The working directory is the worktree too: ``python -m`` puts it first on sys.path.
    """
    command = [sys.executable, "-m", "django", "shell", "--verbosity", "0", "-c", code]
    done = subprocess.run(
        command, env=environment(path), cwd=path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


class Scheduler(crash.LoggedChild):
    """A ``run_scheduler`` of the previous release, its output in a file."""

    def __init__(self, path: Path, *args: str, settings: dict, log_path: Path) -> None:
        self.log_path = log_path
        command = [sys.executable, "-m", *processes.SchedulerProcess.COMMAND, *args]
        with open(log_path, "wb") as log:
            self.popen = subprocess.Popen(
                command,
                env=environment(path, settings),
                cwd=path,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
