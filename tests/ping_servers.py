"""Servers on loopback for the ping tests: one that records each request and answers with a
status (and a redirect's location) of its choosing, one that accepts connections and never
answers, and a port where nothing listens."""

import contextlib
import json
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from tests.processes import wait_for


@dataclass(frozen=True)
class Received:
    """One request as the server read it."""

    method: str
    path: str
    query: dict[str, str]
    body: bytes

    @property
    def outcome(self) -> dict:
        return json.loads(self.body)


class RecordingServer:
    """An HTTP server on 127.0.0.1 that records every request and answers ``status``, with
    ``location`` (a path: on this server) as its Location header if given."""

    def __init__(self, status: int = 200, location: str | None = None) -> None:
        self.status = status
        self.location = location
        self.received: list[Received] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                parts = urllib.parse.urlsplit(self.path)
                query = dict(urllib.parse.parse_qsl(parts.query))
                server.received.append(Received("POST", parts.path, query, body))
                self.send_response(server.status)
                if server.location is not None:
                    self.send_header("Location", server.location)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            do_GET = do_POST

            def log_message(self, *args: object) -> None:
                pass  # the test reads what was received, not the server's log

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def wait_for(self, count: int, timeout: float = 10) -> list[Received]:
        """The first ``count`` requests, once that many have come."""
        return wait_for(
            lambda: list(self.received) if len(self.received) >= count else None,
            timeout,
            f"{count} requests",
        )

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class HangingServer:
    """Accepts connections on 127.0.0.1 and never answers: holds each until closed."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self.peers: list[tuple[str, int]] = []  # of each connection accepted, in order
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while True:
            try:
                connection, peer = self.listener.accept()
            except OSError:
                return  # closed
            self.accepted.append(connection)
            self.peers.append(peer)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def connected_before_now(self) -> int:
        """How many connections were made to it before now: a probe connects last, and the
        listener accepts in order, so once the probe is accepted every earlier one is."""
        with socket.create_connection(("127.0.0.1", self.port)) as probe:
            probe_address = probe.getsockname()
            wait_for(lambda: probe_address in self.peers, 10, "the probe to be accepted")
        return self.peers.index(probe_address)

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accept(); close() alone does not
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join()
        for connection in self.accepted:
            connection.close()


def refused_url(path: str) -> str:
    """A URL on a loopback port where nothing listens (bound, then freed)."""
    with socket.create_server(("127.0.0.1", 0)) as probe:
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}{path}"
