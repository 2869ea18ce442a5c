"""The django-periodic-tasks peer, run with its own venv (it needs Python >= 3.13).

python dpt_child.py template   # one disabled ScheduledTask for the harness to clone
python dpt_child.py run        # its run_scheduler command until SIGTERM (events: $BENCH_EVENTS)
"""

import os
import sys

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dpt_settings")

import django

django.setup()

from django.core.management import call_command  # noqa: E402
from django_periodic_tasks.models import ScheduledTask  # noqa: E402


def make_template() -> None:
    ScheduledTask.objects.create(
        name="bench-template",
        task_path="dpt_tasks.noop",
        cron_expression="0 0 1 1 *",
        enabled=False,
    )


def main() -> None:
    command = sys.argv[1] if len(sys.argv) > 1 else "run"
    if command == "template":
        make_template()
    else:
        import dpt_tasks  # noqa: F401  (registers the task before the scheduler resolves it)

        call_command("run_scheduler", verbosity=0)


if __name__ == "__main__":
    main()
