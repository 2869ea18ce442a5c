"""The alert mail's outbox: notices of changes gathered off the scheduler's loop, and mailed
by a thread of their own, one mail an ``ALERT_INTERVAL`` at most.

The loop announces a change (engine/planning/attention.py); the receiver (alert_mail.py)
only posts a notice here, which never blocks. One daemon thread, started with the first
notice, waits a moment for the rest of that evaluation's changes (``GATHER``), or until an
``ALERT_INTERVAL`` has passed since its last mail, and sends everything gathered as one
mail. A mail server that is slow, silent or gone holds up that thread only: notices keep
being gathered, up to ``SIZE`` for one mail. What is not mailed is counted, logged, and said
in the next mail. At exit the thread gets ``PATIENCE`` to send what it holds, then is
abandoned.
"""

import atexit
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

logger = logging.getLogger("django_periodic")

N = TypeVar("N")

# The most changes one mail lists: a storm of a thousand schedules failing at once is one
# mail naming a hundred and counting the rest (periodic_status names them all).
SIZE = 100
# How long the first change after a quiet spell waits for the others of its evaluation,
# which are announced together, within milliseconds.
GATHER = 1.0
# At exit, how long the thread may still take to send what it holds (seconds).
PATIENCE = 5.0


@dataclass(frozen=True)
class Untold:
    """Changes that no mail has told yet: ``dropped`` for want of room (``SIZE``), and
    ``unsent`` in mails the mail server did not take."""

    dropped: int = 0
    unsent: int = 0

    def __bool__(self) -> bool:
        return bool(self.dropped or self.unsent)

    def __add__(self, other: "Untold") -> "Untold":
        return Untold(self.dropped + other.dropped, self.unsent + other.unsent)


# Sends one mail: the notices gathered, and what earlier mails could not tell.
Send = Callable[[list[N], Untold], None]


class Outbox(Generic[N]):
    """Notices gathered for one mail at a time, sent by a daemon thread of its own."""

    def __init__(
        self,
        send: "Send[N]",
        interval: Callable[[], float],
        *,
        size: int = SIZE,
        gather: float = GATHER,
    ) -> None:
        self._send = send
        self._interval = interval
        self._size = size
        self._gather = gather
        self._changed = threading.Condition()
        self._notices: list[N] = []
        self._untold = Untold()
        self._hurried = False
        self._busy = False  # between taking a mail's notices and its end
        self._thread: threading.Thread | None = None
        self._last_mail = -float("inf")

    def post(self, notice: N) -> bool:
        """Gather ``notice`` for the next mail, without waiting; False if the mail already
        holds ``size`` notices (the notice is counted, and the next mail says so)."""
        with self._changed:
            if len(self._notices) >= self._size:
                if not self._untold.dropped:
                    logger.warning(
                        "The next alert mail already lists %d changes: more are counted, "
                        "not listed.",
                        self._size,
                    )
                self._untold += Untold(dropped=1)
                return False
            self._notices.append(notice)
            self._start()
            self._changed.notify_all()
        return True

    def flush(self, timeout: float) -> bool:
        """Send what is gathered now, not at its time; wait up to ``timeout`` seconds for
        the thread to be done with it. True if it is (sent, or failed and logged)."""
        with self._changed:
            self._hurried = True
            self._changed.notify_all()
            return self._changed.wait_for(self._idle, timeout)

    def close(self) -> None:
        """At exit: ``PATIENCE`` to send what is gathered, then the thread is abandoned."""
        if self._thread is not None and not self.flush(PATIENCE):
            logger.warning("The alert mail was not sent in %s s before exit.", PATIENCE)

    def _idle(self) -> bool:
        return not (self._notices or self._busy)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="django_periodic.alert_mail", daemon=True
            )
            self._thread.start()
            atexit.register(self.close)

    def _run(self) -> None:
        while True:
            notices, untold = self._next_mail()
            try:
                self._send(notices, untold)
                if untold:
                    logger.warning(
                        "Mailed %d change(s) of schedules' need for attention; %d more not "
                        "listed, and %d earlier not mailed, were counted in the mail.",
                        len(notices),
                        untold.dropped,
                        untold.unsent,
                    )
            except Exception:
                logger.exception(
                    "Could not mail %d change(s) of schedules' need for attention; the next "
                    "mail says so.",
                    len(notices),
                )
                # All this mail would have told, counted among the changes not mailed.
                missed = untold.dropped + untold.unsent + len(notices)
                with self._changed:
                    self._untold += Untold(unsent=missed)
            with self._changed:
                self._last_mail = time.monotonic()
                self._busy = False
                self._changed.notify_all()

    def _next_mail(self) -> tuple[list[N], Untold]:
        """Wait for notices and for their mail's time; take them, and what is untold."""
        with self._changed:
            while not self._notices:
                # A flush with nothing gathered has nothing to hurry.
                self._hurried = False
                self._changed.wait_for(lambda: self._notices or self._hurried)
            due = max(time.monotonic() + self._gather, self._last_mail + self._interval())
            self._changed.wait_for(lambda: self._hurried, due - time.monotonic())
            notices, self._notices = self._notices, []
            untold, self._untold = self._untold, Untold()
            self._hurried = False
            self._busy = True
            return notices, untold
