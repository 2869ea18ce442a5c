"""Previewing a change as a diff of fires (``Schedule.fire_diff()``): which fires of the next
days it adds, removes or moves, with DST and calendar flags; nothing is saved."""

from datetime import UTC, date, datetime, time, timedelta
from zoneinfo import ZoneInfo

import pytest

from django_periodic.db import clock
from django_periodic.models import Calendar, FireOverride, Schedule
from django_periodic.timing import fire_diff
from tests.factories import ScheduleFactory
from tests.helpers import far_hour

BERLIN = ZoneInfo("Europe/Berlin")


def daily(cron: str = "0 9 * * *", **fields) -> Schedule:
    return ScheduleFactory(
        cron=cron, timezone=fields.pop("timezone", "UTC"), interval=None, **fields
    )


@pytest.mark.django_db
def test_a_cron_edit_to_another_hour_moves_each_days_fire():
    hour = far_hour()
    schedule = daily(f"0 {hour} * * *")
    found = schedule.fire_diff(days=7, cron=f"0 {(hour + 1) % 24} * * *")
    assert found.added == () and found.removed == () and found.kept == 0
    assert len(found.moved) in (7, 8)  # a fire today or not, then each day's
    assert all(move.new.at - move.old.at == timedelta(hours=1) for move in found.moved)
    assert Schedule.objects.get(pk=schedule.pk).cron == f"0 {hour} * * *"  # nothing saved


@pytest.mark.django_db
def test_a_cron_edit_that_adds_an_hour_adds_fires_and_keeps_the_others():
    schedule = daily()
    found = schedule.fire_diff(days=7, cron="0 9,17 * * *")
    assert found.removed == () and found.moved == ()
    assert {fire.at.hour for fire in found.added} == {17}
    assert found.kept >= 6
    assert not schedule.fire_diff(days=7, cron="0 9 * * *")  # no change: an empty diff


@pytest.mark.django_db
def test_a_calendar_added_removes_its_closed_fires_and_flags_them():
    schedule = daily()
    weekends = Calendar.objects.create(name="weekends", timezone="UTC", closed_weekdays=[5, 6])
    found = schedule.fire_diff(days=14, calendars=[weekends])
    now = clock.now()
    days = [now + timedelta(days=n) for n in range(16)]
    nine = [d.replace(hour=9, minute=0, second=0, microsecond=0) for d in days]
    weekend = [at for at in nine if now < at <= now + timedelta(days=14) and at.weekday() >= 5]
    assert [fire.at for fire in found.removed] == weekend
    assert all(fire.flags == ("closed",) for fire in found.removed)
    assert found.added == () and found.moved == ()
    assert not schedule.calendars.exists()  # nothing saved


@pytest.mark.django_db
def test_a_dst_choice_changes_the_fires_of_the_repeated_and_skipped_hours():
    schedule = daily("30 2 * * *", timezone="Europe/Berlin")
    # A year ahead holds one spring-forward (02:30 skipped) and one fall-back (02:30 twice).
    both = schedule.fire_diff(days=366, dst_repeat="both")
    (added,) = both.added
    local = added.at.astimezone(BERLIN)
    assert (local.hour, local.minute, local.utcoffset()) == (2, 30, timedelta(hours=1))
    assert added.flags == ("dst_repeat",)
    assert both.removed == () and both.moved == ()
    skip = schedule.fire_diff(days=366, dst_gap="skip")
    (removed,) = skip.removed
    assert removed.flags == ("dst_gap",)
    # cron(8) runs the skipped 02:30 right after the change: 03:00 CEST.
    local = removed.at.astimezone(BERLIN)
    assert (local.hour, local.minute, local.month) == (3, 0, 3)


@pytest.mark.django_db
def test_a_timezone_change_moves_each_fire_within_its_day():
    hour = far_hour()
    schedule = daily(f"0 {hour} * * *")
    found = schedule.fire_diff(days=3, timezone="Asia/Tokyo")
    assert len(found.moved) == 3 and not found.removed and not found.added
    tokyo = ZoneInfo("Asia/Tokyo")
    assert all(move.new.at.astimezone(tokyo).hour == hour for move in found.moved)
    assert all(move.old.at - move.new.at == timedelta(hours=9) for move in found.moved)


@pytest.mark.parametrize("hour", range(24))
def test_a_timezone_change_pairs_each_days_fire_by_its_own_zones_day_at_any_hour(hour):
    """The diff itself, at a fixed time: each side's fires are ranked by the day in its own
    zone. A window starting at 03:14 UTC, daily at 15:00 UTC edited to Tokyo: 15:00 UTC of
    the 29th pairs with 15:00 in Tokyo of the 29th (06:00 UTC), not of the 30th."""
    since = datetime(2026, 11, 29, 3, 14, tzinfo=UTC)
    until = since + timedelta(days=3)
    tokyo = ZoneInfo("Asia/Tokyo")
    days = [date(2026, 11, 28) + timedelta(days=n) for n in range(6)]
    old = [at for day in days if since <= (at := wall(day, hour, UTC)) < until]
    new = [at for day in days if since <= (at := wall(day, hour, tokyo)) < until]
    found = fire_diff.diff(old, new, (UTC, tokyo), {}, since=since, until=until)
    assert all(move.old.at - move.new.at == timedelta(hours=9) for move in found.moved)
    assert len(found.moved) + len(found.added) == len(new)
    assert len(found.moved) + len(found.removed) == len(old)
    assert len(found.added) + len(found.removed) <= 2  # only a day cut off by the window


def wall(day: date, hour: int, zone: ZoneInfo) -> datetime:
    return datetime.combine(day, time(hour), zone).astimezone(UTC)


@pytest.mark.django_db
def test_overrides_given_replace_its_own():
    schedule = daily()
    fire = schedule.next_fire_times(1)[0]
    skip = FireOverride(schedule=schedule, plan_time=fire, action="skip", reason="x")
    found = schedule.fire_diff(days=3, overrides=[skip])
    assert [(f.at, f.flags) for f in found.removed] == [(fire, ("overridden",))]


@pytest.mark.django_db
def test_a_field_that_does_not_decide_fires_is_refused():
    schedule = daily()
    with pytest.raises(ValueError, match="job"):
        schedule.fire_diff(job="tests.jobs.add")
    with pytest.raises(ValueError, match="days"):
        schedule.fire_diff(days=0)
    assert daily(cron="* * * * * ").fire_diff(days=1, cron="*/2 * * * *").as_dict()["kept"] > 0


@pytest.mark.django_db
def test_a_dense_window_ends_at_its_most_fires():
    schedule = daily("* * * * *")
    found = schedule.fire_diff(days=30, max_fires=100, cron="*/2 * * * *")
    assert len(found.removed) == 50 and found.kept == 50
    # Ends at the 100th fire of the schedule as it is: an hour and 40 minutes on.
    assert timedelta(minutes=99) < found.until - found.since <= timedelta(minutes=100)
    assert found.until.second == 0 and max(fire.at for fire in found.removed) <= found.until
