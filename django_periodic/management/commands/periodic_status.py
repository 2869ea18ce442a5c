from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError

from django_periodic.db import clock
from django_periodic.error_texts import shown
from django_periodic.escaping import escaped
from django_periodic.models import Schedule
from django_periodic.operations import explain as explain_output
from django_periodic.operations import health, status_output

# Exit statuses, documented in docs/deployment.md (Monitoring) for probes. 2 is argparse's
# for bad arguments.
NEEDS_ATTENTION = 1
DATABASE_UNREACHABLE = 3


class Command(BaseCommand):
    help = (
        "Show which schedulers are alive, what is due, running, stale and failing, and the "
        "fire lag. Exit status 0 when all is well, 1 when something needs attention, "
        "3 when the database cannot be queried."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--database", default="default")
        parser.add_argument(
            "--json", action="store_true", help="Print the report as JSON, for machines."
        )
        explaining = parser.add_argument_group("explaining a schedule's fires (docs/explain.md)")
        explaining.add_argument(
            "--explain",
            metavar="NAME",
            default="",
            help="Instead of the report: what became of each fire of this schedule.",
        )
        explaining.add_argument(
            "--since", default="", help="ISO 8601 (UTC unless it says), or back: 36h, 7d."
        )
        explaining.add_argument("--until", default="", help="As --since; default: now.")
        explaining.add_argument(
            "--scope", default=None, help="One scope key of a fanned-out schedule."
        )

    def handle(self, *args: Any, database: str, json: bool, **options: Any) -> None:
        if options["explain"]:
            self._explain(database, json, options)
            return
        try:
            report = health.gather(clock.now(database), database)
        except DatabaseError as exc:
            raise CommandError(
                f"Cannot query the database: {shown(exc)}", returncode=DATABASE_UNREACHABLE
            ) from exc
        self.stdout.write(self._render(report, json, options), ending="")
        if report.problems:
            # The messages name schedules: stored text, escaped like the report.
            found = "; ".join(escaped(problem.message) for problem in report.problems)
            raise CommandError(f"Needs attention: {found}.", returncode=NEEDS_ATTENTION)
        if not json:
            self.stdout.write(self.style.SUCCESS("OK"))

    def _explain(self, database: str, json: bool, options: dict[str, Any]) -> None:
        """``--explain NAME``: each fire of the window, what became of it."""
        name = options["explain"]
        try:
            schedule = Schedule.objects.using(database).get(name=name)
        except Schedule.DoesNotExist:
            raise CommandError(f"No schedule named {escaped(name)!r}.") from None
        try:
            asked = explain_output.window(clock.now(database), options["since"], options["until"])
            accounts = schedule.explain(asked.since, asked.until, scope=options["scope"])
        except ValueError as exc:  # a bad window, or a trigger that cannot be built
            raise CommandError(escaped(str(exc))) from exc
        render = explain_output.as_json if json else explain_output.as_plain
        self.stdout.write(render(schedule, asked, accounts), ending="\n" if json else "")

    def _render(self, report: health.Report, json: bool, options: dict[str, Any]) -> str:
        """JSON if asked; rich tables on a terminal (or with --force-color) when rich is
        installed, unless --no-color; plain text otherwise."""
        if json:
            return status_output.as_json(report) + "\n"
        on_terminal = self.stdout.isatty() or options["force_color"]
        if status_output.RICH_INSTALLED and on_terminal and not options["no_color"]:
            return status_output.as_rich(report)
        return status_output.as_plain(report, self.style.MIGRATE_HEADING)
