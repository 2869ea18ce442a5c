"""A sentry-sdk transport that keeps what Sentry would receive: each envelope's check-in
items, as their bytes decode, in memory and, for child processes (tests.settings), appended
to a file as JSON lines. No network: the DSN's host is ``sentry.invalid``."""

import json
import threading
from pathlib import Path
from typing import Any

import sentry_sdk
from sentry_sdk.envelope import Envelope
from sentry_sdk.transport import Transport

DSN = "https://key@sentry.invalid/1"


class CapturingTransport(Transport):
    """Keeps the check-ins (``check_ins``); while ``open`` is cleared, every envelope waits
    for it, as a Sentry that does not answer would hold up its caller."""

    def __init__(self, path: str | None = None) -> None:
        super().__init__({"dsn": DSN})
        self.path = Path(path) if path else None
        self.check_ins: list[dict[str, Any]] = []
        self.open = threading.Event()
        self.open.set()
        self._lock = threading.Lock()

    def capture_envelope(self, envelope: Envelope) -> None:
        self.open.wait()
        items = [json.loads(item.get_bytes()) for item in envelope.items if item.type == "check_in"]
        with self._lock:
            self.check_ins += items
            if self.path is not None and items:
                with self.path.open("a") as file:
                    file.writelines(json.dumps(item) + "\n" for item in items)


def start(transport: CapturingTransport) -> None:
    """``sentry_sdk.init()`` with the transport, without the integrations that would patch
    Django or capture logs (only check-ins are under test)."""
    sentry_sdk.init(
        dsn=DSN, transport=transport, default_integrations=False, auto_enabling_integrations=False
    )


def stop() -> None:
    """Sentry off again: the scope gets sentry-sdk's client that records nothing."""
    sentry_sdk.get_client().close()
    sentry_sdk.get_global_scope().set_client(None)


def read(path: Path) -> list[dict[str, Any]]:
    """The check-ins a child process wrote to ``path`` so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]
