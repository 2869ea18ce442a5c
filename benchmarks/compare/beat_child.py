"""The django-celery-beat peer: beat with its DatabaseScheduler, publishing to Celery's
in-memory broker (nothing consumes; we count the tasks sent).

    python beat_child.py template   # one disabled PeriodicTask for the harness to clone
    python beat_child.py run        # beat until killed (events: $BENCH_EVENTS)

The scheduler is subclassed only to log events: ``ready`` once the schedule is loaded and
the heap built, and per task sent, when beat considered it due (its last run plus the
interval: beat re-anchors an interval at each send) and when the send returned.
"""

import os
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "beat_settings")

import django

django.setup()

from celery import Celery  # noqa: E402
from celery.beat import Service  # noqa: E402
from django_celery_beat.models import IntervalSchedule, PeriodicTask  # noqa: E402
from django_celery_beat.schedulers import DatabaseScheduler  # noqa: E402
from peer_events import EVENTS  # noqa: E402


class InstrumentedScheduler(DatabaseScheduler):
    """DatabaseScheduler, logging ``ready`` after its first heap and ``sent`` per task."""

    _ready = False

    def populate_heap(self, *args, **kwargs):
        super().populate_heap(*args, **kwargs)
        if not self._ready:
            self._ready = True
            EVENTS.now("ready")

    def apply_entry(self, entry, producer=None):
        every = getattr(entry.schedule, "run_every", None)
        nominal = entry.last_run_at.timestamp() + every.total_seconds() if every else time.time()
        super().apply_entry(entry, producer=producer)
        EVENTS.now("sent", nominal)


def make_template() -> None:
    hourly, _ = IntervalSchedule.objects.get_or_create(every=3600, period=IntervalSchedule.SECONDS)
    PeriodicTask.objects.create(
        name="bench-template", task="bench.noop", interval=hourly, enabled=False
    )


def run_beat() -> None:
    app = Celery("bench", broker="memory://", set_as_current=True)
    app.conf.update(timezone="UTC", enable_utc=True, beat_enable_remote_control=False)
    Service(app, scheduler_cls=InstrumentedScheduler).start()


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else "run"
    make_template() if command == "template" else run_beat()


if __name__ == "__main__":
    main()
