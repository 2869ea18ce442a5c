import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_periodic import taskbackends
from django_periodic.db import clock
from django_periodic.operations.celerybeat import applying, code, emitting, rows, tables

VERBS = {
    applying.CREATE: ("created", "would create"),
    applying.UPDATE: ("updated", "would update"),
    applying.EXISTS: ("skipped", "would skip"),
    applying.NOT_IMPORTED: ("not imported", "would not import"),
}


class Command(BaseCommand):
    help = (
        "Create schedules from a celery beat schedule: CELERY_BEAT_SCHEDULE (--from-settings), "
        "a Celery app's beat_schedule (--app), or django-celery-beat's periodic tasks, read "
        "from its tables in this database or from a `dumpdata django_celery_beat` JSON file. "
        "Prints the mapping, and every task or option that could not be carried over, with "
        "the reason; --emit-code prints @job(...) definitions instead of saving."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        source = parser.add_mutually_exclusive_group()
        source.add_argument(
            "--from-settings",
            action="store_true",
            help="Read CELERY_BEAT_SCHEDULE, in CELERY_TIMEZONE (or UTC with CELERY_ENABLE_UTC).",
        )
        source.add_argument(
            "--app",
            metavar="MODULE:ATTR",
            help="Read this Celery app's beat_schedule, in its timezone (e.g. proj.celery:app).",
        )
        source.add_argument(
            "--from-json",
            metavar="FILE",
            help="A `manage.py dumpdata django_celery_beat` file (default: this database).",
        )
        parser.add_argument(
            "--queue",
            action="append",
            default=[],
            metavar="QUEUE=ALIAS",
            help="Hand runs of entries routed to this celery queue to this TASKS backend "
            "(repeatable; --from-settings and --app). An unmapped queue is listed.",
        )
        parser.add_argument(
            "--emit-code",
            action="store_true",
            help="Print the @job(...) definitions of the schedules instead of saving them "
            "(disabled tasks are listed, not defined).",
        )
        parser.add_argument(
            "--job-map",
            action="append",
            default=[],
            metavar="CELERY_TASK=JOB",
            help="Run this registered job for this celery task name (repeatable); by "
            "default a task runs the job of the same name.",
        )
        parser.add_argument(
            "--update",
            action="store_true",
            help="Overwrite schedules that already have a task's name (default: skip them).",
        )
        parser.add_argument(
            "--paused",
            action="store_true",
            help="Create every schedule disabled, to enable when beat stops (the cut-over).",
        )
        parser.add_argument(
            "--dry-run", action="store_true", help="Print the mapping; save nothing."
        )
        parser.add_argument("--database", default="default", help="Database alias to use.")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._import(**options)
        except CommandError as exc:
            # Names and values from the data are in the message: escaped, like every line.
            raise CommandError(_printable(str(exc)), returncode=exc.returncode) from exc

    def _import(
        self,
        *,
        from_settings: bool,
        app: str | None,
        from_json: str | None,
        job_map: list[str],
        queue: list[str],
        emit_code: bool,
        update: bool,
        paused: bool,
        dry_run: bool,
        database: str,
        **options: Any,
    ) -> None:
        jobs = _parse_job_map(job_map)
        in_code = from_settings or app is not None
        _check_code_options(in_code, queue, emit_code, update or paused)
        try:
            if in_code:
                beat = self._read_code(app)
                mappings = code.map_entries(beat, jobs, _parse_queues(queue))
                origin = beat.origin
                heading = f"Beat entries of {origin} (celery time zone {beat.timezone})"
            else:
                read = self._read(from_json, database)
                mappings = tables.map_tasks(read, jobs, clock.now(database))
                origin, heading = "django-celery-beat", "Periodic tasks"
            if emit_code:
                self._emit(mappings, origin)
                return
            if paused:
                applying.pause(mappings)
            outcomes = applying.apply(mappings, update=update, dry_run=dry_run, using=database)
        except rows.Malformed as exc:
            raise CommandError(f"{exc} Nothing was imported.") from exc
        self._report(heading, outcomes, dry_run)

    def _read_code(self, app: str | None) -> code.BeatSchedule:
        try:
            return code.from_app(app) if app is not None else code.from_settings()
        except LookupError as exc:
            raise CommandError(str(exc)) from exc

    def _emit(self, mappings: list[applying.TaskMapping], origin: str) -> None:
        """Print the module defining the schedules in code; nothing is saved."""
        checked = []
        for mapping in mappings:
            with rows.entry(mapping.label):
                problem = applying.validate(mapping)
            checked.append((mapping, problem))
        for line in emitting.module_text(checked, origin).splitlines():
            self._write(line)

    def _read(self, from_json: str | None, database: str) -> rows.Rows:
        if from_json is None:
            try:
                return rows.rows_from_database(database)
            except LookupError as exc:
                raise CommandError(str(exc)) from exc
            except DatabaseError as exc:
                raise CommandError(
                    f"Cannot read django-celery-beat's tables ({exc}): are its migrations "
                    "applied? A dumpdata file of them can be read instead (--from-json)."
                ) from exc
        try:
            records = json.loads(Path(from_json).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:  # ValueError: not UTF-8, or not JSON
            raise CommandError(f"Cannot read {from_json}: {exc}") from exc
        except RecursionError:
            raise CommandError(
                f"Cannot read {from_json}: it is nested deeper than any dumpdata file."
            ) from None
        return rows.rows_from_fixture(records)

    def _report(self, title: str, outcomes: list[applying.ImportedTask], dry_run: bool) -> None:
        heading = self.style.MIGRATE_HEADING
        write = self._write
        write(f"{title}: {len(outcomes)}", heading)
        for outcome in outcomes:
            mapping = outcome.mapping
            verb = VERBS[outcome.action][dry_run]
            target = "-"
            if mapping.values is not None:
                trigger = applying.trigger_text(mapping.values)
                target = f"{trigger}, job {mapping.values['job']}"
                if mapping.values.get("tasks_backend"):
                    target += f", tasks backend {mapping.values['tasks_backend']}"
                if not mapping.values["enabled"]:
                    target += ", disabled"
            write(f"  {verb:<16} {mapping.name!r} ({mapping.celery_task}) -> {target}")
            if outcome.detail:
                write(f"  {'':<16}   {outcome.detail}")
        notes = [(o.mapping.name, note) for o in outcomes for note in o.mapping.notes]
        if notes:
            write("Not carried over:", heading)
            for name, note in notes:
                write(f"  {name!r}: {note}")
        counts = Counter(outcome.action for outcome in outcomes)
        summary = ", ".join(
            f"{counts[action]} {VERBS[action][dry_run]}" for action in applying.ACTIONS
        )
        write(f"{'Dry run, nothing saved: ' if dry_run else ''}{summary}.")

    def _write(self, line: str, style: Callable[[str], str] | None = None) -> None:
        """Write a line of the report, whose names and values come from the data: escaped."""
        line = _printable(line)
        self.stdout.write(style(line) if style else line)


def _printable(text: str) -> str:
    """``text`` with control and other unprintable characters escaped as ``repr()`` does
    (``\\x1b``, ``\\n``, ``\\u202e``): a name from the data can neither drive the terminal
    (colours, cursor moves, a cleared screen) nor hide text, and is still recognisable."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def _check_code_options(in_code: bool, queues: list[str], emit_code: bool, saving: bool) -> None:
    if not in_code and queues:
        raise CommandError("--queue reads a beat schedule in code: add --from-settings or --app.")
    if emit_code and saving:
        raise CommandError("--emit-code saves nothing: --update and --paused do not apply.")


def _parse_queues(items: list[str]) -> dict[str, str]:
    """--queue QUEUE=ALIAS items, each alias a backend of the TASKS setting."""
    queues = {}
    for item in items:
        queue, sep, alias = (part.strip() for part in item.partition("="))
        if not (sep and queue and alias):
            raise CommandError(f"--queue takes QUEUE=ALIAS, got {item!r}.")
        problem = taskbackends.alias_error(alias)
        if problem:
            raise CommandError(f"--queue {item}: {problem}")
        queues[queue] = alias
    return queues


def _parse_job_map(items: list[str]) -> dict[str, str]:
    jobs = {}
    for item in items:
        celery_task, sep, job = item.partition("=")
        if not (sep and celery_task.strip() and job.strip()):
            raise CommandError(f"--job-map takes CELERY_TASK=JOB, got {item!r}.")
        jobs[celery_task.strip()] = job.strip()
    return jobs
