"""What ``Schedule.clean()`` checks: each function returns (field, message) pairs.

The same rules hold wherever a row comes from: the ranges are ``bounds.SCHEDULE``'s (the
CHECK constraints' own), the trigger's are those a trigger is built with
(``trigger_rows``), the job's are the registry's; a trigger and its calendars are checked
together (``calendars.next_fire_error``).
"""

import ipaddress
import urllib.parse
from datetime import timedelta

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Length
from django.db.models.lookups import LessThanOrEqual
from django.http.request import validate_host

from django_periodic import registry, taskbackends
from django_periodic import scopes as scope_providers
from django_periodic.choices import ScheduleKind
from django_periodic.conf import get_settings
from django_periodic.db import clock
from django_periodic.models.calendars import checked_closures, next_fire_error
from django_periodic.models.schedule_fields import TRIGGER_FIELDS, ScheduleFields
from django_periodic.models.trigger_rows import (
    CHECKED_WITH_TRIGGER,
    DOWNSTREAM,
    KIND_FIELDS,
    cycle_error,
    cycle_through,
    missing_error,
    shape_error,
    trigger_field_errors,
    trigger_of,
)
from django_periodic.timing import bounds, recurrences, triggers


def schedule_errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    """Every (field, message) that makes ``schedule`` invalid; empty if it is valid."""
    found = _trigger_errors(schedule) + _job_errors(schedule) + _route_errors(schedule)
    found += _range_errors(schedule) + _lifecycle_errors(schedule) + _ping_errors(schedule)
    if not any(field in TRIGGER_FIELDS for field, _ in found):
        found += _after_errors(schedule)
    return found + _calendar_errors(schedule, found)


def _calendar_errors(
    schedule: ScheduleFields, found: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """Its calendars usable, and under them a next fire within reach; judged only for a
    trigger that is valid in itself."""
    if any(field in (*TRIGGER_FIELDS, "on_closed_day") for field, _ in found):
        return []
    try:
        closures = checked_closures(schedule)
    except triggers.InvalidTrigger as exc:
        return [("calendars", str(exc))]
    message = next_fire_error(schedule, closures, clock.wall_now())
    return [("calendars", message)] if message else []


def _trigger_errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    kinds = [name for name in KIND_FIELDS.values() if getattr(schedule, name) not in ("", None, [])]
    if len(kinds) != 1:
        which = " and ".join(kinds) if kinds else "none"
        message = f"Set exactly one trigger: cron, interval, run_at, rrule or after (got {which})."
        return [(kinds[0] if kinds else "cron", message)]
    errors = []
    try:
        triggers.parse_timezone(schedule.timezone)
    except triggers.InvalidTrigger as exc:
        errors.append(("timezone", str(exc)))
    if schedule.cron:
        try:
            triggers.validate_cron(schedule.cron)
        except triggers.InvalidTrigger as exc:
            errors.append(("cron", str(exc)))
    for name in ("dst_gap", "dst_repeat"):
        if getattr(schedule, name) and not (schedule.cron or schedule.rrule):
            errors.append((name, f"{name} applies to cron and RRULE triggers only."))
    out_of_range = trigger_field_errors(schedule)
    errors += out_of_range
    compared = not {"start_at", "end_at"} & {field for field, _ in out_of_range}
    start, end = schedule.start_at, schedule.end_at
    if compared and start and end and end <= start:
        errors.append(("end_at", "end_at must be after start_at."))
    if schedule.rrule and not errors:
        errors += _rrule_reach_errors(schedule)
    return errors


def _rrule_reach_errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    """An RRULE's next fire after now found within one search, as the planner will ask:
    its first fires may be near its start and the rest too rare to search."""
    try:
        trigger_of(schedule).next_after(clock.wall_now())
    except triggers.InvalidTrigger as exc:
        return [("rrule", str(exc))]
    return []


def _range_errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    """Fields out of their range (bounds.SCHEDULE); the trigger's are checked with it."""
    errors = []
    for name, valid in bounds.SCHEDULE.items():
        if name in CHECKED_WITH_TRIGGER:
            continue  # checked with the trigger, as when one is built (trigger_field_errors)
        message = valid.error(name, getattr(schedule, name))
        if message:
            errors.append((name, message))
    heartbeat = get_settings().HEARTBEAT_INTERVAL
    lease_timeout = schedule.lease_timeout
    if lease_timeout is not None and timedelta(0) < lease_timeout < 2 * heartbeat:
        message = (
            f"lease_timeout must be at least twice the heartbeat interval ({heartbeat}), "
            "or a live process could lose its lease."
        )
        errors.append(("lease_timeout", message))
    return errors + _jitter_errors(schedule, errors)


def _jitter_errors(
    schedule: ScheduleFields, range_errors: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    interval, jitter = schedule.interval, schedule.jitter
    if any(field == "jitter" for field, _ in range_errors) or not (interval and jitter):
        return []
    if jitter < interval:
        return []
    return [
        ("jitter", "jitter must be shorter than the interval, or a run could start after the next.")
    ]


def _lifecycle_errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    """The lifecycle fields that make no sense for this schedule (``Schedule.clean()``)."""
    if schedule.max_runs is not None and schedule.trigger_kind == ScheduleKind.ONCE:
        return [("max_runs", "A one-shot (run_at) fires once: max_runs does not apply.")]
    return []


def _ping_errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    refused = schedule.ping_url and ping_url_refusal(schedule.ping_url)
    return [("ping_url", refused)] if refused else []


# Where a ping may go: one rule, applied here and again by the sender before each ping
# (operations/pings.py), since a row may be written past clean() (update(), bulk_create(),
# SQL) and PING_HOSTS may change after it was saved (docs/pings.md, "Threat model"). The
# schemes: the pinger sends with urllib, and a file:// or ftp:// "URL" is no monitor.
PING_SCHEMES = ("http", "https")
_ping_url_shape = URLValidator(schemes=list(PING_SCHEMES))


def ping_url_refusal(url: str) -> str | None:
    """Why no ping may go to ``url``, in words that never repeat it (a ping URL embeds its
    check's key); None if one may."""
    try:
        _ping_url_shape(url)
    except ValidationError:
        return "ping_url must be an http:// or https:// URL, e.g. https://hc-ping.com/<uuid>."
    parts = urllib.parse.urlsplit(url)
    if "@" in parts.netloc:
        # A password in the URL is a second secret, sent wherever the URL leads.
        return "ping_url must not hold a user name or password (user:password@)."
    if not _valid_port(parts):
        return "ping_url's port must be from 1 to 65535."
    host = (parts.hostname or "").removesuffix(".")
    if forbidden_address(host):
        return (
            "ping_url must not name a link-local or unspecified address (169.254.0.0/16, "
            "fe80::/10, 0.0.0.0, ::): they reach the scheduler's own host or network, such "
            "as a cloud's metadata service, never a monitor."
        )
    return _ping_host_refusal(host)


def forbidden_address(host: str) -> bool:
    """Whether ``host`` is a link-local or unspecified IP address (a name is not: the sender
    checks each address it connects to as well)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped  # ::ffff:169.254.169.254 is 169.254.169.254
    return address.is_link_local or address.is_unspecified


def _valid_port(parts: urllib.parse.SplitResult) -> bool:
    try:
        port = parts.port
    except ValueError:  # past 65535
        return False
    return port != 0  # None: the scheme's own


def _ping_host_refusal(host: str) -> str | None:
    """Refused unless ``PING_HOSTS`` is empty or matches ``host`` as ALLOWED_HOSTS would."""
    allowed = get_settings().PING_HOSTS
    if not allowed:
        return None
    # ALLOWED_HOSTS names an IPv6 address in brackets.
    if validate_host(f"[{host}]" if ":" in host else host, allowed):
        return None
    return f"ping_url's host is not one the PING_HOSTS setting allows ({', '.join(allowed)})."


def _route_errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    error = schedule.tasks_backend and taskbackends.alias_error(schedule.tasks_backend)
    return [("tasks_backend", error)] if error else []


def _job_errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    errors = []
    if schedule.scopes:
        try:
            scope_providers.get_provider(schedule.scopes)
        except scope_providers.UnknownProvider as exc:
            errors.append(("scopes", str(exc)))
    if not isinstance(schedule.args, list):
        errors.append(("args", 'args must be a JSON list, e.g. [1, "two"].'))
    if not isinstance(schedule.kwargs, dict):
        errors.append(("kwargs", 'kwargs must be a JSON object, e.g. {"key": "value"}.'))
    for name in ("args", "kwargs"):
        if message := registry.argument_error(name, getattr(schedule, name)):
            errors.append((name, message))
    try:
        registered = registry.get_job(schedule.job)
    except registry.UnknownJob as exc:
        return [*errors, ("job", str(exc))]
    if schedule.scopes and not registered.takes_context:
        message = (
            f"{schedule.job}() must take its context (@job(takes_context=True)) to be fanned "
            "out per scope: a run reads its scope key as context.scope."
        )
        errors.append(("scopes", message))
    if not any(field in ("args", "kwargs") for field, _ in errors):
        try:
            registered.check_arguments(schedule.args, schedule.kwargs)
        except TypeError as exc:
            errors.append(("args", f"The arguments do not fit {schedule.job}(): {exc}."))
    return errors


def range_constraints() -> list[models.CheckConstraint]:
    """One CHECK per field of bounds.SCHEDULE: no path (``update()``, ``bulk_create()``, raw
    SQL) stores a value out of its range. NULL passes a CHECK: an empty field is allowed
    where the field is nullable."""
    constraints = []
    for name, valid in bounds.SCHEDULE.items():
        low = f"{name}__gt" if valid.low_open else f"{name}__gte"
        high = f"{name}__lt" if valid.high_open else f"{name}__lte"
        constraints.append(
            models.CheckConstraint(
                condition=Q(**{low: valid.low, high: valid.high}),
                name=f"periodic_schedule_{name}_range",
            )
        )
    # An RRULE's text, as long as trigger_of reads one (recurrences.MAX_LENGTH).
    rrule_length = LessThanOrEqual(Length("rrule"), recurrences.MAX_LENGTH)
    constraints.append(
        models.CheckConstraint(condition=rrule_length, name="periodic_schedule_rrule_length")
    )
    # A ping URL: empty, or http(s); clean() and the sender check the rest of its rule.
    schemes = Q(ping_url="")
    for scheme in PING_SCHEMES:
        schemes |= Q(ping_url__istartswith=f"{scheme}://")
    constraints.append(
        models.CheckConstraint(condition=schemes, name="periodic_schedule_ping_url_scheme")
    )
    return constraints


def _after_errors(schedule: ScheduleFields) -> list[tuple[str, str]]:
    """(field, message) for each rule the ``after`` of ``schedule`` breaks (``clean()``):
    two queries, the names it runs after and every other downstream's."""
    after = schedule.after
    shape = shape_error(after, schedule.name)
    if shape:
        return [("after", shape)]
    if not after:
        return []
    found: list[tuple[str, str]] = []
    if schedule.scopes:
        message = "A schedule that runs after others takes their scope keys: leave scopes empty."
        found.append(("scopes", message))
    others = type(schedule)._default_manager.using(schedule._state.db or "default")
    others = others.exclude(pk=schedule.pk) if schedule.pk else others
    existing = set(others.filter(name__in=after).values_list("name", flat=True))
    if missing := set(after) - existing:
        return [*found, ("after", missing_error(missing))]
    edges = {n: a for n, a in others.filter(DOWNSTREAM).values_list("name", "after")}
    edges[schedule.name] = after
    edges = {n: a for n, a in edges.items() if isinstance(a, list)}
    cycle = cycle_through(schedule.name, edges)
    return [*found, ("after", cycle_error(cycle))] if cycle else found
