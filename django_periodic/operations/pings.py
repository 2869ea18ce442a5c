"""Ping monitors: each schedule's ``ping_url`` told when its runs start and end (``PINGS``);
docs/pings.md.

healthchecks.io's pinging API: ``<url>/start`` when an attempt starts, ``<url>`` when its
run succeeds, ``<url>/fail`` when an attempt fails (its run failed, was cancelled, will be
retried, lost its lease, or was given back unfinished at shutdown), each with ``?rid=`` a
UUID of the attempt, so that a start and its end pair up, and the outcome as a JSON body.
Skipped runs ping nothing: they did not run.

Off (the default), nothing listens. On, the receivers only note the event (no query, no
I/O: they run on the scheduler's loop and workers) and hand the batch to a ``Sender``,
whose thread reads the ping URLs of all the events waiting in one query per database,
checks each URL again by the rule it was validated by (``ping_url_refusal``: a row may be
written past ``clean()``, ``PING_HOSTS`` may have changed), then hands each ping to its
host's own sender, which pings it with ``PING_TIMEOUT``, once, following no redirect
(ping_transport.py): a monitor that hangs holds up its own pings, never another host's,
and a bad URL fails its own ping only. A failure is logged by schedule name, id and cause,
never with the URL nor a traceback (whose frames hold it): it is a secret (it embeds the
check's key).
"""

import atexit
import json
import logging
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from django.core.signals import setting_changed
from django.db import close_old_connections, connections

from django_periodic import signals
from django_periodic.choices import ErrorCode, RunStatus
from django_periodic.conf import SETTING_NAME, get_settings
from django_periodic.models import Schedule
from django_periodic.models.validation import ping_url_refusal
from django_periodic.operations import outbound, ping_transport

logger = logging.getLogger("django_periodic")

# What each kind of ping adds to the URL's path.
START, SUCCESS, FAIL = "/start", "", "/fail"
USER_AGENT = "django-periodic"
# Hosts with a sender thread of their own, at most; any more share one.
MAX_HOSTS = 8


@dataclass(frozen=True)
class Ping:
    """One ping to send, as a receiver noted it: no URL yet (the sender's thread reads it)."""

    using: str
    schedule_id: int
    schedule: str
    kind: str  # START, SUCCESS or FAIL
    # The body (run_id and attempt make the rid): its JSON, and the rid, are made on the
    # sender's thread, not on the loop's.
    outcome: dict[str, Any]

    @property
    def rid(self) -> str:
        return rid(self.outcome["run_id"], self.outcome["attempt"])


def rid(run_id: int | None, attempt: int) -> str:
    """The UUID that pairs an attempt's start and end: derived from the run and attempt."""
    return str(outbound.attempt_id(run_id, attempt))


def ping_address(url: str, kind: str, run_rid: str) -> str:
    """``url`` with ``kind`` appended to its path and ``rid`` to its query."""
    parts = urllib.parse.urlsplit(url)
    query = [*urllib.parse.parse_qsl(parts.query, keep_blank_values=True), ("rid", run_rid)]
    path = parts.path.rstrip("/") + kind if kind else parts.path
    return urllib.parse.urlunsplit(parts._replace(path=path, query=urllib.parse.urlencode(query)))


def _noted(kind: str, arguments: dict[str, Any], duration: timedelta | None = None) -> Ping:
    outcome = {
        "schedule": arguments["schedule"],
        "run_id": arguments["run_id"],
        "scope": arguments["scope"],
        "plan_time": arguments["plan_time"],
        "attempt": arguments["attempt"],
        "status": arguments["status"],
        "error_code": arguments["reason"],
        "duration": None if duration is None else duration.total_seconds(),
    }
    return Ping(
        using=arguments["using"],
        schedule_id=arguments["schedule_id"],
        schedule=arguments["schedule"],
        kind=kind,
        outcome=outcome,
    )


class Pinger:
    """The receivers, the pings waiting (at most ``outbound.SIZE``) and their senders: one
    that reads a batch's URLs, and one a host."""

    def __init__(self, timeout: timedelta) -> None:
        self.timeout = timeout.total_seconds()
        self.sender = outbound.Sender("pings", close_at_exit=False)
        self._lock = threading.Lock()
        self._waiting: list[Ping] = []
        self._dropped = 0
        self._hosts: dict[str, outbound.Sender] = {}
        # One PATIENCE at exit for all its senders, whatever number of hosts hang.
        atexit.register(self.close)

    def connect(self) -> None:
        signals.run_started.connect(self.on_started, weak=False)
        signals.run_finished.connect(self.on_finished, weak=False)
        signals.run_retried.connect(self.on_retried, weak=False)
        signals.lease_lost.connect(self.on_lease_lost, weak=False)
        signals.run_released.connect(self.on_released, weak=False)

    def disconnect(self) -> None:
        signals.run_started.disconnect(self.on_started)
        signals.run_finished.disconnect(self.on_finished)
        signals.run_retried.disconnect(self.on_retried)
        signals.lease_lost.disconnect(self.on_lease_lost)
        signals.run_released.disconnect(self.on_released)

    def on_started(self, **arguments: Any) -> None:
        self.note(_noted(START, arguments))

    def on_finished(self, duration: timedelta | None = None, **arguments: Any) -> None:
        kind = SUCCESS if arguments["status"] == RunStatus.SUCCEEDED else FAIL
        self.note(_noted(kind, arguments, duration))

    def on_retried(self, **arguments: Any) -> None:
        self.note(_noted(FAIL, arguments))

    def on_lease_lost(self, reentered: bool, **arguments: Any) -> None:
        # A lease lost for good ends the run failed: run_finished pings that one.
        if reentered:
            self.note(_noted(FAIL, {**arguments, "reason": ErrorCode.LEASE_EXPIRED.value}))

    def on_released(self, **arguments: Any) -> None:
        # Given back unfinished at shutdown, to run again: this attempt did not succeed.
        self.note(_noted(FAIL, {**arguments, "reason": ErrorCode.INTERRUPTED.value}))

    def note(self, ping: Ping) -> None:
        """Queue ``ping``; the first of a batch asks the sender to send them all."""
        with self._lock:
            if len(self._waiting) >= outbound.SIZE:
                self._dropped += 1
                return
            first = not self._waiting
            self._waiting.append(ping)
        if first:
            self.sender.post(self.send_waiting)

    def send_waiting(self) -> None:
        """On the sender's thread: every ping waiting, their URLs read in one query per
        database, handed to their hosts' senders."""
        with self._lock:
            batch, self._waiting = self._waiting, []
            dropped, self._dropped = self._dropped, 0
        if dropped:
            logger.warning("pings: %d were dropped for want of room.", dropped)
        for using in sorted({ping.using for ping in batch}):
            pings = [ping for ping in batch if ping.using == using]
            urls = _ping_urls(using, {ping.schedule_id for ping in pings})
            for ping in pings:
                if url := urls.get(ping.schedule_id):
                    self._dispatch(ping, url)

    def _dispatch(self, ping: Ping, url: str) -> None:
        """``ping`` handed to its host's sender, if the URL is one a ping may go to now
        (``PING_HOSTS`` may have changed since it was saved; ``update()`` bypasses
        ``clean()``). One bad URL fails its own ping only, logged without the URL."""
        refused = ping_url_refusal(url)
        if refused is None:
            try:
                self._host_sender(url).post(partial(self.send, ping, url))
                return
            except Exception as exc:  # not logged with exc_info: its frames hold the URL
                refused = type(exc).__name__
        _log_failure(ping, "refused (not sent)", refused)

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every ping noted to be sent (or to fail and be
        logged); True if they were."""
        deadline = time.monotonic() + timeout
        if not self.sender.flush(timeout):
            return False
        with self._lock:
            hosts = list(self._hosts.values())
        return all(host.flush(max(deadline - time.monotonic(), 0)) for host in hosts)

    def close(self) -> None:
        """At exit: ``outbound.PATIENCE`` to send every ping noted, then they are abandoned."""
        if not self.flush(outbound.PATIENCE):
            logger.warning("pings: not all were sent in %s s before exit.", outbound.PATIENCE)

    def _host_sender(self, url: str) -> outbound.Sender:
        """The sender of ``url``'s host; past ``MAX_HOSTS`` hosts, one shared by the rest.
        Senders are named by number: logs never show any part of a ping URL."""
        parts = urllib.parse.urlsplit(url)
        host = f"{parts.hostname}:{parts.port or parts.scheme}"
        with self._lock:
            if host not in self._hosts and len(self._hosts) >= MAX_HOSTS:
                host = ""  # the rest
            if host not in self._hosts:
                name = f"pings (host {len(self._hosts) + 1})"
                self._hosts[host] = outbound.Sender(name, close_at_exit=False)
            return self._hosts[host]

    def send(self, ping: Ping, url: str) -> None:
        """One ping, once, redirects not followed; a failure logged with its cause, never the
        URL (nor with exc_info: the traceback's frames hold it)."""
        try:
            request = urllib.request.Request(
                ping_address(url, ping.kind, ping.rid),
                data=_body(ping.outcome),
                method="POST",
                headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
            )
            with ping_transport.opener.open(request, timeout=self.timeout) as response:
                response.read()
        except Exception as exc:  # any failure: logged, never retried
            if isinstance(exc, urllib.error.HTTPError):
                exc.close()  # its response, and so its connection
            _log_failure(ping, "failed (not retried)", _cause(exc, self.timeout))


def _log_failure(ping: Ping, what: str, cause: str) -> None:
    logger.warning(
        "Ping %s of schedule %r (id %s) %s: %s.",
        ping.kind.lstrip("/") or "success",
        ping.schedule,
        ping.schedule_id,
        what,
        cause,
    )


def _body(outcome: dict[str, Any]) -> bytes:
    """The outcome as JSON: the plan time in ISO 8601, UTC as the run has it."""
    return json.dumps({**outcome, "plan_time": outcome["plan_time"].isoformat()}).encode()


def _ping_urls(using: str, schedule_ids: set[int]) -> dict[int, str]:
    """{schedule id: ping URL} of those with one. This thread's connection is closed after
    each batch, as a request's would be: the thread may wait for hours between runs."""
    try:
        close_old_connections()
        rows = Schedule.objects.using(using).filter(pk__in=schedule_ids).exclude(ping_url="")
        return dict(rows.values_list("pk", "ping_url"))
    finally:
        connections[using].close()


def _cause(exc: Exception, timeout: float) -> str:
    """Why a ping failed, in words that cannot hold its URL (an exception's own text may)."""
    if isinstance(exc, urllib.error.HTTPError):
        if 300 <= exc.code < 400:
            return f"HTTP {exc.code}, a redirect (never followed)"
        return f"HTTP {exc.code}"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ping_transport.RefusedAddress):
        return str(reason)  # its own words, which hold no URL
    if isinstance(reason, TimeoutError | socket.timeout):
        return f"no answer in {timeout:g} s"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return type(reason if isinstance(reason, BaseException) else exc).__name__


_pinger: Pinger | None = None


def follow() -> None:
    """Ping while ``PINGS`` is on, from now on and whenever a setting changes: the
    receivers connected while on, and nothing listening or built while off."""
    setting_changed.connect(_setting_changed, dispatch_uid="django_periodic.pings")
    _follow_settings()


def _setting_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        _follow_settings()


def _follow_settings() -> None:
    global _pinger
    settings = get_settings()
    wanted = settings.PING_TIMEOUT.total_seconds() if settings.PINGS else None
    if _pinger is not None and _pinger.timeout != wanted:
        _pinger.disconnect()  # what it queued is still sent, by its own sender
        _pinger = None
    if wanted is not None and _pinger is None:
        _pinger = Pinger(settings.PING_TIMEOUT)
        _pinger.connect()


def pinger() -> Pinger | None:
    """This process's pinger (None while ``PINGS`` is off): tests and exit flush its sender."""
    return _pinger
