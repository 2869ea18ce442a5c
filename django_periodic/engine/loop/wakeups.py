"""Wake-ups heard: LISTEN to end a sleeping scheduler's wait when there is new work
(``db/announcements.py`` sends them; only PostgreSQL has them, elsewhere schedulers poll
at ``POLL_INTERVAL``)."""

import contextlib
import logging
import os
import select
import threading
import time
from collections.abc import Callable
from typing import Any

from django.db import connections
from django.db.backends.base.base import BaseDatabaseWrapper

from django_periodic.db import features, pooling, postgresql
from django_periodic.error_texts import shown

logger = logging.getLogger("django_periodic")

# Why an Alarm rang: anything that calls for a whole tick, or only capacity freed.
WAKE = b"!"
CAPACITY = b"c"
MAX_RECONNECT_DELAY = 30.0
# How long a new listener waits for the notification it sent itself (see Listener._probe).
PROBE_TIMEOUT = 5.0


class NotificationsLost(Exception):
    """Notifications sent on the schedulers' database do not reach the listener."""


class Alarm:
    """Ends a scheduler's sleep: an Event that a signal handler may set too.

    ``set()`` is one non-blocking write to a pipe and takes no lock, so it cannot deadlock
    against the thread it interrupts; ``wait()`` is a ``select()`` on the pipe's other end.
    The write end also serves ``signal.set_wakeup_fd``.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        os.set_inheritable(self._write, False)

    @property
    def write_fd(self) -> int:
        return self._write

    @property
    def fileno(self) -> int:
        """The end to ``select()`` on: readable once set."""
        return self._read

    def set(self, reason: bytes = WAKE) -> None:
        """Wake the sleeper, saying why in one byte (``WAKE`` unless told)."""
        with contextlib.suppress(BlockingIOError):  # full: the sleeper wakes anyway
            os.write(self._write, reason)

    def wait(self, timeout: float | None) -> bytes:
        """Sleep until set or ``timeout`` seconds pass; return the reasons set (b"" if none).
        Clears them."""
        select.select([self._read], [], [], timeout)
        return self.clear()

    def clear(self) -> bytes:
        reasons = b""
        with contextlib.suppress(BlockingIOError):  # empty
            while chunk := os.read(self._read, 4096):
                reasons += chunk
        return reasons

    def close(self) -> None:
        for fd in (self._read, self._write):
            os.close(fd)


class Listener:
    """A daemon thread on its own connection that sets ``wake`` on every notification.

    It listens on the connection of ``pooling.listener_alias(using)``, and before it trusts
    it, it sends one notification through ``using``, as every NOTIFY goes, and waits for it:
    a pooler in transaction mode, or an alias of another database, would let the LISTEN
    succeed and deliver nothing. It reconnects with backoff when the connection drops or
    that test fails, and sets ``wake`` after each reconnect, since notifications sent
    meanwhile were lost.
    """

    def __init__(self, using: str, wake: "threading.Event | Alarm") -> None:
        self.using = using
        self.alias: str | None = None  # where it listens, known at start()
        self.wake = wake
        # Takes the process's session lock on the listener's connection (presence.py).
        self._take_lock: Callable[[Any], bool] | None = None
        self._ever_locked = False
        self._judge_from: float | None = None  # time.monotonic() from which it may judge
        self._stop = threading.Event()
        self._interrupt = Alarm()  # ends the listener's wait on its socket, to stop
        self._listening = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0

    @staticmethod
    def supported(alias: str | None) -> bool:
        return alias is not None and features(alias).can_listen()

    @property
    def listening(self) -> bool:
        """Whether notifications reach this process now (so the loop may sleep long)."""
        return self._listening.is_set()

    def may_judge(self) -> bool:
        """Whether this process may judge others dead by their session locks: it holds its
        own, and has since long enough after a reconnect (presence.py)."""
        judge_from = self._judge_from
        return judge_from is not None and time.monotonic() >= judge_from

    def start(self, take_lock: Callable[[Any], bool] | None = None) -> bool:
        """Start listening, and with ``take_lock`` (given the driver's connection) holding a
        session lock on that connection (presence.py); False where the database cannot
        notify (the loop then polls)."""
        self.alias = pooling.listener_alias(self.using)
        if not self.supported(self.alias):
            return False
        self._take_lock = take_lock
        self._thread = threading.Thread(target=self._run, name="periodic-listener", daemon=True)
        self._thread.start()
        return True

    def stop(self) -> None:
        self._stop.set()
        self._interrupt.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            assert self.alias is not None
            wrapper = connections.create_connection(self.alias)
            try:
                self._listen(wrapper)
            except Exception as exc:
                self._failures += 1
                delay = min(2.0 ** (self._failures - 1), MAX_RECONNECT_DELAY)
                logger.warning("Wake-up listener stopped (%s); retry in %.0f s.", shown(exc), delay)
                self.wake.set()  # meanwhile the loop polls; let it look now
                self._stop.wait(delay)
            finally:
                self._listening.clear()
                self._judge_from = None
                wrapper.close()

    def _probe(self, raw: Any) -> None:
        """Send a notification through ``using`` and wait for it on ``raw``; raise
        ``NotificationsLost`` if it does not come within ``PROBE_TIMEOUT``."""
        sender = connections.create_connection(self.using)
        try:
            with sender.cursor() as cursor:
                postgresql.notify(cursor)
        finally:
            sender.close()
        deadline = time.monotonic() + PROBE_TIMEOUT
        while (left := deadline - time.monotonic()) > 0:
            readable, _, _ = select.select([raw.fileno(), self._interrupt.fileno], [], [], left)
            if raw.fileno() in readable and list(raw.notifies(timeout=0)):
                return
            if self._stop.is_set():
                return
        raise NotificationsLost(
            f"a notification sent on database {self.using!r} did not reach the listener on "
            f"{self.alias!r} within {PROBE_TIMEOUT:.0f} s: if {self.alias!r} goes through a "
            "pooler in transaction mode, set DISABLE_SERVER_SIDE_CURSORS on it and "
            "WAKEUP_DATABASE to a direct connection; meanwhile the scheduler polls"
        )

    def _hold_lock(self, raw: Any, take_lock: Callable[[Any], bool]) -> None:
        """Take the lock; judge others at once the first time, but after a reconnect only
        once every other process had the time to reconnect too (a database restart)."""
        if not take_lock(raw):
            logger.warning("This scheduler's session lock is held by another session.")
            return
        wait = 2 * MAX_RECONNECT_DELAY if self._ever_locked else 0.0
        self._ever_locked = True
        self._judge_from = time.monotonic() + wait

    def _listen(self, wrapper: BaseDatabaseWrapper) -> None:
        wrapper.ensure_connection()
        raw = wrapper.connection
        raw.autocommit = True
        raw.execute(postgresql.LISTEN_SQL)
        self._probe(raw)
        # Only a connection that is a session of its own, on our database, may hold the lock.
        if self._take_lock is not None:
            self._hold_lock(raw, self._take_lock)
            raw.execute(postgresql.LISTEN_SQL)  # again, a no-op, so pg_stat_activity shows it
        self._listening.set()
        self._failures = 0
        self.wake.set()  # whatever was notified while we were not listening
        # Asleep until the server sends something (or stop() interrupts): no timer, so an
        # idle process does no work here at all. A dropped connection reads as an error.
        while not self._stop.is_set():
            readable, _, _ = select.select([raw.fileno(), self._interrupt.fileno], [], [])
            if raw.fileno() in readable and list(raw.notifies(timeout=0)):
                self.wake.set()
