"""What the jobs of the concurrency tests noted (tests.jobs.occupy): when each really ran,
read from its own notes, never from the ledger."""

from dataclasses import dataclass
from pathlib import Path


@dataclass
class Job:
    run: int
    pid: int
    scope: str
    start: float
    end: float | None = None  # None: never noted (its process was killed)


def jobs_of(notes: Path, killed: dict[int, float] | None = None) -> list[Job]:
    """Each job's start and end; one whose process was killed (``killed``: pid -> when, in
    epoch seconds) before it noted its end ended at the kill."""
    jobs: dict[tuple[int, int], Job] = {}
    for line in notes.read_text().splitlines():
        kind, run, pid, scope, at = line.split()
        key = (int(run), int(pid))
        if kind == "start":
            jobs[key] = Job(int(run), int(pid), "" if scope == "-" else scope, float(at))
        else:
            jobs[key].end = float(at)
    for job in jobs.values():
        if job.end is None and killed and job.pid in killed:
            job.end = killed[job.pid]
    return list(jobs.values())


def most_at_once(jobs: list[Job]) -> int:
    """The most jobs between their start and end at any one time (a job never ended counts
    to the end)."""
    events = [(job.start, 1) for job in jobs]
    events += [(job.end, -1) for job in jobs if job.end is not None]
    most = current = 0
    for _at, step in sorted(events):  # at the same instant, an end (-1) before a start
        current += step
        most = max(most, current)
    return most
