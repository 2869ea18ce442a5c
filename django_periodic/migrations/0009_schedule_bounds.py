# Every bounded field of a schedule gets a CHECK constraint (django_periodic/bounds.py), so that
# no path (update(), bulk_create(), raw SQL) stores a value Python or PostgreSQL cannot compute
# with; next_fire_at gets a database default, UNPLANNED, for rows stored without save().

import datetime

from django.db import migrations, models
from django.db.models import F, Value
from django.db.models.functions import Concat

# The rows that a lookup's bound leaves outside: "gte" keeps x >= bound, so x < bound is out.
OUTSIDE = {"gte": "lt", "gt": "lte", "lte": "gt", "lt": "gte"}
RULE = {"gte": "at least", "gt": "more than", "lte": "at most", "lt": "before"}
MICROSECOND = datetime.timedelta(microseconds=1)


def move_into_range(apps, schema_editor):
    """Move each value that a constraint below would refuse into its range, disable its
    schedule and say why in last_error, so that the constraints can be added to a table of
    old rows. Done in SQL: a value out of range may not even load (a year past 9999)."""
    Schedule = apps.get_model("django_periodic", "Schedule")
    schedules = Schedule.objects.using(schema_editor.connection.alias)
    for operation in Migration.operations:  # the ranges exactly as the constraints hold them
        if isinstance(operation, migrations.AddConstraint):
            for lookup, bound in operation.constraint.condition.children:
                name, side = lookup.rsplit("__", 1)
                field = Schedule._meta.get_field(name)
                out = schedules.filter(**{f"{name}__{OUTSIDE[side]}": bound})
                out.update(**_moved(field, side, bound))


def _moved(field, side, bound):
    """The update that moves a value on the wrong ``side`` of ``bound`` into its range."""
    if side in ("gte", "lte"):
        nearest = bound  # an end included in the range
    elif isinstance(bound, datetime.datetime):
        nearest = bound + MICROSECOND if side == "gt" else bound - MICROSECOND
    else:
        nearest = field.get_default()  # "must be positive": the default (or empty)
    note = (
        f"Disabled by migration 0009: {field.name} must be {RULE[side]} {bound} and was not; "
        f"it is now {'empty' if nearest is None else nearest}. Check the schedule, then "
        "enable it again. "
    )
    note_first = Concat(Value(note), F("last_error"), output_field=models.TextField())
    return {field.name: nearest, "enabled": False, "last_error": note_first}


class Migration(migrations.Migration):
    dependencies = [
        ("django_periodic", "0008_backfill_in_ledger"),
    ]

    operations = [
        migrations.AlterField(
            model_name="schedule",
            name="keep_runs",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="Keep at least its last N finished runs; empty: the KEEP_RUNS setting.",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="schedule",
            name="max_attempts",
            field=models.PositiveIntegerField(default=1),
        ),
        migrations.AlterField(
            model_name="schedule",
            name="max_concurrent",
            field=models.PositiveIntegerField(
                blank=True,
                help_text="With overlap “concurrent”: most runs active at once; empty for no limit.",
                null=True,
            ),
        ),
        migrations.AlterField(
            model_name="schedule",
            name="next_fire_at",
            field=models.DateTimeField(
                blank=True,
                db_default=datetime.datetime(1800, 1, 1, 0, 0, tzinfo=datetime.timezone.utc),
                editable=False,
                null=True,
            ),
        ),
        migrations.RunPython(move_into_range, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("interval__gte", datetime.timedelta(microseconds=1000)),
                    ("interval__lte", datetime.timedelta(days=36525)),
                ),
                name="periodic_schedule_interval_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "run_at__gte",
                        datetime.datetime(1900, 1, 1, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "run_at__lt",
                        datetime.datetime(9000, 1, 1, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                name="periodic_schedule_run_at_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "start_at__gte",
                        datetime.datetime(1900, 1, 1, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "start_at__lt",
                        datetime.datetime(9000, 1, 1, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                name="periodic_schedule_start_at_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    (
                        "end_at__gte",
                        datetime.datetime(1900, 1, 1, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                    (
                        "end_at__lt",
                        datetime.datetime(9000, 1, 1, 0, 0, tzinfo=datetime.timezone.utc),
                    ),
                ),
                name="periodic_schedule_end_at_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("misfire_grace__gte", datetime.timedelta(0)),
                    ("misfire_grace__lte", datetime.timedelta(days=36525)),
                ),
                name="periodic_schedule_misfire_grace_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("retry_backoff__gte", datetime.timedelta(0)),
                    ("retry_backoff__lte", datetime.timedelta(seconds=43200)),
                ),
                name="periodic_schedule_retry_backoff_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("timeout__gt", datetime.timedelta(0)),
                    ("timeout__lte", datetime.timedelta(days=365)),
                ),
                name="periodic_schedule_timeout_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("lease_timeout__gt", datetime.timedelta(0)),
                    ("lease_timeout__lte", datetime.timedelta(days=7)),
                ),
                name="periodic_schedule_lease_timeout_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("keep_runs_for__gt", datetime.timedelta(0)),
                    ("keep_runs_for__lte", datetime.timedelta(days=36525)),
                ),
                name="periodic_schedule_keep_runs_for_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("keep_failed_runs_for__gt", datetime.timedelta(0)),
                    ("keep_failed_runs_for__lte", datetime.timedelta(days=36525)),
                ),
                name="periodic_schedule_keep_failed_runs_for_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("max_attempts__gte", 1), ("max_attempts__lte", 1000)),
                name="periodic_schedule_max_attempts_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("max_queued__gte", 0), ("max_queued__lte", 1000)),
                name="periodic_schedule_max_queued_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("max_concurrent__gte", 1), ("max_concurrent__lte", 1000)),
                name="periodic_schedule_max_concurrent_range",
            ),
        ),
        migrations.AddConstraint(
            model_name="schedule",
            constraint=models.CheckConstraint(
                condition=models.Q(("keep_runs__gte", 1), ("keep_runs__lte", 1000000)),
                name="periodic_schedule_keep_runs_range",
            ),
        ),
    ]
