"""The pure core's decisions (policies.py), without a database: overlap, misfire and the
arithmetic of deadlines, stated as properties."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from django_periodic import policies
from django_periodic.choices import ErrorCode, Misfire, Overlap, RunStatus
from django_periodic.timing import bounds

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
times = st.datetimes(
    min_value=bounds.EARLIEST.replace(tzinfo=None),
    max_value=bounds.LATEST.replace(tzinfo=None),
    timezones=st.just(UTC),
)
durations = st.timedeltas(min_value=-timedelta(days=999_999), max_value=timedelta(days=999_999))


@dataclass
class Policy:
    overlap: str = Overlap.SKIP
    max_queued: int = 1
    max_concurrent: int | None = None
    misfire: str = Misfire.LATEST
    misfire_grace: timedelta = timedelta(minutes=1)


def decide(policy: Policy, fires: int, occupancy: policies.Occupancy) -> list[tuple[str, str]]:
    return [policies.overlap_status(policy, occupancy) for _ in range(fires)]


@given(fires=st.integers(1, 20), active=st.integers(0, 3), max_queued=st.integers(0, 5))
def test_an_exclusive_schedule_never_has_two_runs_active(fires, active, max_queued):
    for overlap in (Overlap.SKIP, Overlap.QUEUE):
        policy = Policy(overlap=overlap, max_queued=max_queued)
        occupancy = policies.Occupancy(active=active)
        decided = decide(policy, fires, occupancy)
        started = [status for status, _ in decided].count(RunStatus.PENDING)
        assert started == (0 if active else 1)
        queued = [status for status, _ in decided].count(RunStatus.QUEUED)
        room = max_queued if overlap == Overlap.QUEUE else 0
        assert queued == min(room, fires - started)
        skipped = [reason for status, reason in decided if status == RunStatus.SKIPPED]
        reason = ErrorCode.QUEUE_FULL if overlap == Overlap.QUEUE else ErrorCode.OVERLAP
        assert skipped == [reason] * (fires - started - queued)


@given(fires=st.integers(1, 20), active=st.integers(0, 5), cap=st.none() | st.integers(1, 5))
def test_a_concurrent_schedule_starts_up_to_its_cap_and_skips_the_rest(fires, active, cap):
    policy = Policy(overlap=Overlap.CONCURRENT, max_concurrent=cap)
    occupancy = policies.Occupancy(active=active)
    decided = decide(policy, fires, occupancy)
    room = fires if cap is None else max(cap - active, 0)
    expected = [(RunStatus.PENDING, "")] * min(room, fires)
    expected += [(RunStatus.SKIPPED, ErrorCode.OVERLAP)] * (fires - len(expected))
    assert decided == expected
    assert occupancy.active == active + min(room, fires)


@given(
    ages=st.lists(st.integers(0, 600), min_size=1, max_size=30, unique=True),
    misfire=st.sampled_from(list(Misfire)),
    limit=st.integers(0, 10),
)
def test_misfire_marks_keep_every_time_and_miss_only_late_ones(ages, misfire, limit):
    """Due times ``ages`` seconds ago, oldest first; the grace is a minute."""
    due = sorted(NOW - timedelta(seconds=age) for age in ages)
    policy = Policy(misfire=misfire)
    marks = list(policies.misfire_marks(policy, due, NOW, limit))
    assert [t for t, _ in marks] == due
    missed = [t for t, was_missed in marks if was_missed]
    late = [t for t in due if t < NOW - policy.misfire_grace]
    if not late:
        assert missed == []
    elif misfire == Misfire.SKIP:
        assert missed == late
    elif misfire == Misfire.ALL:
        assert missed == due[limit:]
    else:
        assert missed == due[:-1]  # only the latest runs


@given(at=times, by=durations)
def test_shifted_stays_within_the_stored_range_and_is_exact_inside_it(at, by):
    shifted = policies.shifted(at, by)
    assert bounds.EARLIEST <= shifted <= bounds.LATEST
    if _fits(at, by) and bounds.EARLIEST < at + by < bounds.LATEST:
        assert shifted == at + by


def _fits(at: datetime, by: timedelta) -> bool:
    try:
        at + by
    except OverflowError:
        return False
    return True


@given(grace=st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=999_999)), at=times)
def test_a_start_deadline_is_a_grace_after_the_later_of_plan_time_and_now(grace, at):
    deadline = policies.start_deadline(grace, at, NOW)
    if deadline is not None:
        assert deadline >= max(at, NOW)
        assert deadline == max(at, NOW) + grace
