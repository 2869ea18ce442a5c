"""django-periodic-tasks' own scheduler, with events logged around its steps.

Nothing is changed in what it does: each tick and each enqueued task is recorded, with the
``next_run_at`` the task was due at (its nominal time).
"""

import time

from django_periodic_tasks.models import ScheduledTask
from django_periodic_tasks.scheduler import PeriodicTaskScheduler
from peer_events import EVENTS


class InstrumentedScheduler(PeriodicTaskScheduler):
    """Logs ``tick`` at the start of every poll, ``ready`` after the first, ``sent`` per task."""

    _ticks = 0

    def tick(self) -> None:
        EVENTS.now("tick")
        super().tick()
        self._ticks += 1
        if self._ticks == 1:
            EVENTS.now("ready")

    def _process_task(self, st: ScheduledTask) -> None:
        nominal = st.next_run_at.timestamp() if st.next_run_at else time.time()
        super()._process_task(st)
        EVENTS.now("sent", nominal)
