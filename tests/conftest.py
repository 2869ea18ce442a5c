import logging
import os

import pytest
from asgiref.sync import SyncToAsync
from django.conf import settings
from django.db import connection, connections

from django_periodic import registry
from django_periodic.db import clock, pooling
from django_periodic.operations import runlog
from tests import processes
from tests.factories import SchedulerProcessFactory

# Fixtures that start real processes (run_scheduler children, the crash suite's fleet, the
# example site's server and scheduler). A test using one, however indirectly, is marked
# ``processes`` at collection, so ``-m "not processes"`` cannot run it by accident even when
# its module forgets the explicit mark (which is still written, for the reader).
PROCESS_FIXTURES = frozenset({"children", "fleet", "example_site"})

# Fixtures through which a test reaches the database (pytest-django's, which the others build on).
DATABASE_FIXTURES = frozenset(
    {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"}
)


def uses_database(item: pytest.Item) -> bool:
    """Whether a test can reach the database: pytest-django refuses queries to the others."""
    if not isinstance(item, pytest.Function):
        return True  # the docs' examples: each block gets the database
    return bool(
        item.get_closest_marker("django_db") or DATABASE_FIXTURES.intersection(item.fixturenames)
    )


@pytest.hookimpl(tryfirst=True)  # before ``-m`` deselects by mark
def pytest_collection_modifyitems(config, items):
    for item in items:
        if PROCESS_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.processes)
    # scripts/test.sh runs each environment on SQLite, then on PostgreSQL: a test that never
    # reaches the database (a trigger's properties, a form's parsing) gains nothing from the
    # second run, so that run leaves it out.
    if os.environ.get("PERIODIC_ONLY_DATABASE_TESTS") == "1":
        kept, left = [], []
        for item in items:
            (kept if uses_database(item) else left).append(item)
        config.hook.pytest_deselected(items=left)
        items[:] = kept


@pytest.fixture(scope="session", autouse=True)
def close_asgiref_connections(django_db_setup, django_db_blocker):
    """Async jobs query on asgiref's one thread, which keeps its connection (CONN_MAX_AGE):
    close it before the test database is dropped, or PostgreSQL refuses the drop."""
    yield
    SyncToAsync.single_thread_executor.submit(connections.close_all).result(timeout=10)


# pytest-django already provides ``client``, ``admin_client`` (logged in as the superuser
# "admin") and ``admin_user``: use them rather than defining look-alikes per module.


@pytest.fixture
def clean_registry():
    """Jobs a test registers are forgotten after it."""
    saved = registry.registered_jobs()
    yield
    registry._registry.clear()
    registry._registry.update(saved)


@pytest.fixture
def now(db):
    return clock.now()


@pytest.fixture
def process(db, now):
    return SchedulerProcessFactory(host="test", pid=1, started_at=now)


@pytest.fixture
def postgres(db):
    """Skip unless the test database is PostgreSQL (concurrency and SQL tests)."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (PERIODIC_TEST_DB=postgres)")


@pytest.fixture
def pgbouncer(postgres):
    """Skip unless "default" goes through PgBouncer in transaction mode (scripts/test.sh runs
    the tests marked pgbouncer so, with "direct" its direct connection)."""
    if not pooling.transaction_pooled("default"):
        pytest.skip("needs PgBouncer (PERIODIC_TEST_PGBOUNCER_URL)")


@pytest.fixture
def celery(postgres):
    """Skip unless the "celery" tasks backend is configured (Redis from scripts/test.sh and
    django-tasks-fennel); its Redis database starts empty."""
    if "celery" not in settings.TASKS:
        pytest.skip("needs Redis and django-tasks-fennel (PERIODIC_TEST_REDIS_URL)")
    import redis

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


@pytest.fixture(params=list(processes.TASK_WORKERS))
def worker_backend(request, postgres) -> str:
    """Each tasks backend with workers of its own (processes.TASK_WORKERS), in turn."""
    if request.param == "celery":
        request.getfixturevalue("celery")  # skips without Redis
    return request.param


@pytest.fixture
def sqlite(db):
    """Skip unless the test database is SQLite (what other databases do instead)."""
    if connection.vendor != "sqlite":
        pytest.skip("only on SQLite (PERIODIC_TEST_DB=sqlite)")


@pytest.fixture
def children(transactional_db):
    """Start real run_scheduler processes with ``children.start(...)``; all are reaped after."""
    started: list[processes.SchedulerProcess] = []

    class Children:
        def start(self, *args, **kwargs) -> processes.SchedulerProcess:
            child = processes.SchedulerProcess(*args, **kwargs)
            started.append(child)
            return child

        def start_worker(self, *args, kind=processes.TaskWorkerProcess, **kwargs):
            """A db_worker process executing the "database" tasks backend's tasks (or
            ``kind``'s, such as processes.CeleryWorkerProcess)."""
            child = kind(*args, **kwargs)
            started.append(child)
            return child

    yield Children()
    for child in started:
        child.kill()
    processes.wait_for_children_to_disconnect()


@pytest.fixture
def run_log():
    """The run log enabled for INFO (as LOGGING would), restored afterwards."""
    level = runlog.logger.level
    runlog.logger.setLevel(logging.INFO)
    assert runlog.follow()
    yield
    runlog.logger.setLevel(level)
    runlog.follow()
