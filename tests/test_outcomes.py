"""Outcomes always land: results and error texts are made storable by one rule, a batch the
database refuses is recorded one outcome at a time, and a run whose outcome could not be
recorded at all is left to the sweeper, its lease no longer renewed.

The end-to-end promises are checked with real ``run_scheduler`` and ``db_worker``
processes on PostgreSQL, the database that refuses what Python's json writes.
"""

import math
import re
from datetime import timedelta

import pytest
from django.db import connection
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from django_periodic import tasks
from django_periodic.db import clock
from django_periodic.engine import records
from django_periodic.engine.loop.outcome_writer import Recorder
from django_periodic.engine.runs import outcomes, storable
from django_periodic.models import Lease, Run, Schedule
from tests.factories import RunFactory, ScheduleFactory
from tests.helpers import claimed
from tests.jobs import UNSTORABLE_RESULTS
from tests.processes import wait_for

NAN, INF = float("nan"), float("inf")

# What tests.jobs.return_unstorable's results are stored as, by kind.
STORED = {
    "nan": {"value": "NaN"},
    "infinities": ["Infinity", {"low": "-Infinity"}],
    "nul": {"key\ufffd": ["value\ufffd", {"deeper\ufffd": "\ufffd"}]},
    "surrogate": "file \ufffd.txt",
    "huge": {"preview": '"' + "x" * 65535, "note": "result truncated from 100002 bytes"},
    "not_json": {
        "repr": "{'when': <module 'time' (built-in)>}",
        "note": "result is not JSON-serializable",
    },
}
# What tests.jobs.raise_unstorable's message is stored as.
STORED_MESSAGE = "bad byte \ufffd in file \ufffd.txt"


@pytest.fixture
def refuse():
    """``refuse(condition)``: the database refuses every update of a run for which the SQL
    ``condition`` (on OLD and NEW) holds, as a constraint or a database bug would."""
    table = connection.ops.quote_name(Run._meta.db_table)
    created = []

    def create(condition: str) -> None:
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(REFUSE_FUNCTION_POSTGRESQL.format(condition=condition))
                cursor.execute(REFUSE_TRIGGER_POSTGRESQL.format(table=table))
            else:
                cursor.execute(REFUSE_TRIGGER_SQLITE.format(table=table, condition=condition))
        created.append(condition)

    yield create
    if created:  # a flush between tests empties tables, but leaves triggers
        with connection.cursor() as cursor:
            if connection.vendor == "postgresql":
                cursor.execute(f"DROP TRIGGER periodic_test_refuse ON {table}")
                cursor.execute("DROP FUNCTION periodic_test_refuse()")
            else:
                cursor.execute("DROP TRIGGER periodic_test_refuse")


REFUSE_FUNCTION_POSTGRESQL = """
CREATE FUNCTION periodic_test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF {condition} THEN
        RAISE EXCEPTION 'refused by the test''s trigger';
    END IF;
    RETURN NEW;
END $$
"""
REFUSE_TRIGGER_POSTGRESQL = """
CREATE TRIGGER periodic_test_refuse BEFORE UPDATE ON {table}
FOR EACH ROW EXECUTE FUNCTION periodic_test_refuse()
"""
REFUSE_TRIGGER_SQLITE = """
CREATE TRIGGER periodic_test_refuse BEFORE UPDATE ON {table} FOR EACH ROW WHEN {condition}
BEGIN SELECT RAISE(ABORT, 'refused by the test''s trigger'); END
"""


# The rule, value by value.


def test_nan_and_the_infinities_are_stored_as_their_names_in_keys_and_values():
    result = {"value": NAN, "range": (-INF, INF), NAN: [1.5, {"inner": INF}]}
    assert storable.storable_result(result) == {
        "value": "NaN",
        "range": ["-Infinity", "Infinity"],
        "NaN": [1.5, {"inner": "Infinity"}],
    }


def test_nul_and_lone_surrogates_become_the_replacement_character_in_keys_and_values():
    result = {"key\x00": ["a\x00b", {"file \udcff": "\ud800\udc00"}]}
    assert storable.storable_result(result) == {
        "key\ufffd": ["a\ufffdb", {"file \ufffd": "\ufffd\ufffd"}]
    }


def test_text_that_only_looks_like_an_escaped_nul_is_kept():
    assert storable.storable_result(["\\u0000", "\\\x00"]) == ["\\u0000", "\\\ufffd"]


def test_any_other_text_is_stored_as_it_is():
    text = 'naïve 😀 \u2028 \t \x01 \\ "'
    assert storable.storable_result({text: [text]}) == {text: [text]}


def test_a_result_whose_json_is_too_long_is_stored_as_a_preview_of_its_first_bytes(settings):
    settings.DJANGO_PERIODIC = {"RESULT_MAX_BYTES": 21}
    assert storable.storable_result("x" * 19) == "x" * 19  # 21 bytes with its quotes
    # 44 bytes: the 21st is the first of a two-byte character, which the preview leaves out.
    assert storable.storable_result(["é" * 20]) == {
        "preview": '["' + "é" * 9,
        "note": "result truncated from 44 bytes",
    }


def test_a_result_with_no_json_form_is_stored_as_its_repr(settings):
    settings.DJANGO_PERIODIC = {"RESULT_MAX_BYTES": 30}
    cycle: list = []
    cycle.append(cycle)

    class Unprintable:
        def __repr__(self):
            raise RuntimeError("no repr")

    note = storable.NOT_JSON_NOTE
    assert storable.storable_result(cycle) == {"repr": "[[...]]", "note": note}
    assert storable.storable_result({"\x00": object()})["repr"].startswith("{'\\x00': <object")
    assert storable.storable_result(Unprintable()) == {
        "repr": "<Unprintable object whose repr",  # the first 30 characters
        "note": note,
    }
    # More digits than Python turns into text: neither JSON nor repr() can write it.
    assert storable.storable_result(10**5000)["note"] == note


@pytest.mark.django_db
def test_error_texts_are_cleaned_and_capped_the_message_at_its_start_the_traceback_at_its_end(
    process, now, settings
):
    settings.DJANGO_PERIODIC = {"ERROR_MAX_CHARS": 10}
    failure = records.Failure(
        code="Bad\x00Error" + "x" * 300,
        message="bad byte \x00 in file \udcff.txt",
        traceback="Traceback ...\nValueError: \x00",
    )
    outcome = outcomes.failed(claimed(process, now), failure)
    assert outcome.error_code == "Bad\ufffdError" + "x" * 191  # Run.error_code's 200
    assert outcome.error_message == "bad byte \ufffd"
    assert outcome.traceback == "ueError: \ufffd"


# The rule, for any value.

# Floats beyond 2**53 are left out: jsonb keeps a number's decimal digits, and Python reads
# a large one back as an int that is not quite the float (PostgreSQL's, not our rule).
floats = st.floats(min_value=-(2.0**53), max_value=2.0**53) | st.sampled_from([NAN, INF, -INF])
any_text = st.text(st.characters(exclude_categories=()))  # NUL and lone surrogates too
json_like = st.recursive(
    st.none() | st.booleans() | st.integers() | floats | any_text,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(any_text | floats, inner, max_size=4)
    ),
    max_leaves=20,
)
clean_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
clean_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | clean_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(clean_text, inner, max_size=4),
    max_leaves=20,
)


@given(clean_json)
def test_a_json_value_without_nan_nul_or_lone_surrogates_is_stored_as_it_is(value):
    assert storable.storable_result(value) == value


@pytest.mark.django_db
@hypothesis_settings(deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_like)
def test_any_json_like_value_is_recorded_and_read_back_as_the_rule_made_it(process, now, value):
    claim = claimed(process, now)
    outcome = outcomes.succeeded(claim, value)
    assert outcomes.record([outcome]) == {claim.run.pk}
    run = Run.objects.get(pk=claim.run.pk)
    assert (run.status, run.result) == ("succeeded", outcome.result)
    for leaf in leaves(run.result):
        assert math.isfinite(leaf) if isinstance(leaf, float) else not UNSTORABLE.search(leaf)


UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def leaves(value):
    """The floats and texts (keys too) of a JSON value."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from leaves(item)
    elif isinstance(value, float | str):
        yield value


# Recording: a batch the database refuses, and an outcome it refuses even alone.


@pytest.mark.django_db
def test_a_batch_the_database_refuses_is_recorded_one_by_one_and_only_the_refused_run_fails(
    process, now, refuse
):
    refuse("OLD.job_name = 'tests.jobs.noop' AND NEW.status = 'succeeded'")
    first = claimed(process, now, job="tests.jobs.add")
    refused = claimed(process, now, job="tests.jobs.noop")
    last = claimed(process, now, job="tests.jobs.add")
    batch = [outcomes.succeeded(claim, n) for n, claim in enumerate((first, refused, last))]
    assert outcomes.record(batch) == {first.run.pk, refused.run.pk, last.run.pk}

    runs = Run.objects.in_bulk()
    assert [(runs[c.run.pk].status, runs[c.run.pk].result) for c in (first, last)] == [
        ("succeeded", 0),
        ("succeeded", 2),
    ]
    run = runs[refused.run.pk]
    assert (run.status, run.error_code, run.result) == ("failed", "outcome_not_storable", None)
    assert run.error_message.startswith("Its outcome (succeeded) could not be stored: ")
    assert "refused by the test's trigger" in run.error_message
    assert Lease.objects.get(token=refused.token).outcome == "failed"


@pytest.mark.django_db
def test_an_outcome_refused_even_as_a_failure_leaves_its_run_to_its_lease(process, now, refuse):
    refuse("OLD.job_name = 'tests.jobs.noop' AND NEW.status <> 'running'")
    claim = claimed(process, now)
    assert outcomes.record([outcomes.succeeded(claim, 1)]) == set()
    assert Run.objects.get().status == "running"
    assert Lease.objects.get().released_at is None  # the sweeper settles it once it expires


@pytest.mark.django_db(transaction=True)
def test_the_recorder_holds_no_more_an_outcome_refused_even_as_a_failure(process, now, refuse):
    """Its process then no longer renews the run's lease: the sweeper settles the run."""
    refuse("OLD.job_name = 'tests.jobs.noop' AND NEW.status <> 'running'")
    claim = claimed(process, now)
    recorder = Recorder()
    try:
        recorder.put(outcomes.succeeded(claim, 1))
        assert recorder.flush(timeout=10)
    finally:
        recorder.stop()
    assert recorder.holding() == set()
    assert Run.objects.get().status == "running"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("kind", ["nan", "nul", "surrogate"])
def test_a_task_on_a_tasks_backend_stores_its_result_by_the_same_rule(kind):
    schedule = ScheduleFactory(job="tests.jobs.return_unstorable", kwargs={"kind": kind})
    run = RunFactory(schedule=schedule, tasks_backend="dummy")
    assert tasks.execute(run.pk) == "succeeded"
    assert Run.objects.get().result == STORED[kind]


@pytest.mark.django_db(transaction=True)
def test_a_task_on_a_tasks_backend_stores_its_error_by_the_same_rule():
    schedule = ScheduleFactory(job="tests.jobs.raise_unstorable")
    run = RunFactory(schedule=schedule, tasks_backend="dummy")
    assert tasks.execute(run.pk) == "failed"
    run.refresh_from_db()
    assert (run.error_code, run.error_message) == ("ValueError", STORED_MESSAGE)
    assert run.traceback.endswith(f"ValueError: {STORED_MESSAGE}\n")


# Real processes.

FAST = {"HEARTBEAT_INTERVAL": 1, "SWEEP_INTERVAL": 1, "POLL_INTERVAL": 1, "SHUTDOWN_GRACE": 1}


def one_shot(job: str, **fields) -> Schedule:
    """A schedule firing ``job`` once, now."""
    return ScheduleFactory(job=job, interval=None, run_at=clock.now(), **fields)


@pytest.mark.processes
@pytest.mark.parametrize("executed_by", ["run_scheduler", "db_worker"])
def test_unstorable_results_and_errors_land_beside_normal_runs(postgres, children, executed_by):
    """One scheduler (or one task worker) executes them all, so their outcomes are recorded
    together; each ends final with what the rule stores, none left running."""
    fields = {"tasks_backend": "database"} if executed_by == "db_worker" else {}
    bad = {
        kind: one_shot("tests.jobs.return_unstorable", kwargs={"kind": kind}, **fields)
        for kind in UNSTORABLE_RESULTS
    }
    raising = one_shot("tests.jobs.raise_unstorable", **fields)
    normal = [one_shot("tests.jobs.add", args=[n, 1], **fields) for n in range(20)]
    if executed_by == "db_worker":
        scheduler = children.start("--plan-only", settings=FAST)
        worker = children.start_worker()
    else:
        scheduler = children.start("--workers", "8", settings=FAST)
    every = len(bad) + 1 + len(normal)
    ended = Run.objects.filter(status__in=Run.FINAL_STATUSES)
    wait_for(lambda: ended.count() == every, 60, f"{every} runs to end")
    assert scheduler.terminate() == 0, scheduler.output()
    if executed_by == "db_worker":
        worker.kill()  # how db_worker exits is django-tasks-db's business

    assert not Run.objects.exclude(status__in=Run.FINAL_STATUSES).exists()
    assert not Lease.objects.held().exists()
    results = {kind: Run.objects.get(schedule=s) for kind, s in bad.items()}
    assert {kind: (run.status, run.result) for kind, run in results.items()} == {
        kind: ("succeeded", stored) for kind, stored in STORED.items()
    }
    run = Run.objects.get(schedule=raising)
    assert (run.status, run.error_code, run.error_message) == (
        "failed",
        "ValueError",
        STORED_MESSAGE,
    )
    assert run.traceback.endswith(f"ValueError: {STORED_MESSAGE}\n")
    sums = sorted(Run.objects.filter(schedule__in=normal).values_list("result", flat=True))
    assert sums == list(range(1, 21))


@pytest.mark.processes
def test_a_run_whose_outcome_could_not_be_recorded_is_not_renewed_and_the_sweeper_settles_it(
    postgres, children, refuse
):
    """The database refuses the run's outcome, and the failure recorded instead: its
    scheduler holds the run no more, so its heartbeat (every second, for another run still
    running) stops renewing that lease, which expires, and the sweeper fails the run."""
    refuse(
        "OLD.job_name = 'tests.jobs.noop'"
        " AND NEW.status <> 'running' AND NEW.error_code <> 'lease_expired'"
    )
    lost = one_shot("tests.jobs.noop", lease_timeout=timedelta(seconds=3))
    busy = one_shot("tests.jobs.linger", kwargs={"seconds": 60})
    scheduler = children.start("--workers", "2", settings=FAST)
    running = Run.objects.filter(schedule=busy, status="running")
    wait_for(running.exists, 30, "the lingering run to start")

    swept = Run.objects.filter(schedule=lost, status="failed", error_code="lease_expired")
    wait_for(swept.exists, 30, "the sweeper to fail the run whose outcome was refused")
    lingering = Lease.objects.get(run__schedule=busy)
    assert lingering.released_at is None and lingering.heartbeat_at > lingering.acquired_at
    assert scheduler.terminate() == 0
    assert "the database refused its outcome" in scheduler.output()
