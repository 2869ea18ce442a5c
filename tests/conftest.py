import pytest
from django.db import connection

from django_periodic import clock
from django_periodic.models import SchedulerProcess
from tests import processes


@pytest.fixture
def now(db):
    return clock.now()


@pytest.fixture
def process(db, now):
    return SchedulerProcess.objects.create(host="test", pid=1, started_at=now, heartbeat_at=now)


@pytest.fixture
def postgres(db):
    """Skip unless the test database is PostgreSQL (concurrency and SQL tests)."""
    if connection.vendor != "postgresql":
        pytest.skip("needs PostgreSQL (PERIODIC_TEST_DB=postgres)")


@pytest.fixture
def children(transactional_db):
    """Start real run_scheduler processes with ``children.start(...)``; all are reaped after."""
    started: list[processes.SchedulerProcess] = []

    class Children:
        def start(self, *args, **kwargs) -> processes.SchedulerProcess:
            child = processes.SchedulerProcess(*args, **kwargs)
            started.append(child)
            return child

    yield Children()
    for child in started:
        child.kill()
    processes.wait_for_children_to_disconnect()
