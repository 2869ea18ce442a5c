"""How a ping reaches its host (operations/pings.py sends them): urllib's opener without
redirects, for http(s) only, and connecting to no link-local or unspecified address
(``forbidden_address``, of the rule a ping URL is validated by: models/validation.py).
docs/pings.md, "Threat model".
"""

import http.client
import socket
import urllib.request
from typing import Any

from django_periodic.models.validation import forbidden_address


class RefusedAddress(OSError):
    """A ping's host resolved to link-local or unspecified addresses only: not connected."""


def connect(
    address: tuple[str, int],
    timeout: float | None = None,
    source_address: tuple[str, int] | None = None,
) -> socket.socket:
    """``socket.create_connection``, never to a link-local or unspecified address
    (``forbidden_address``): a host name may resolve to one (a cloud's metadata
    service) where the URL's rule sees only the name. The address checked is the one
    connected to, so a name that resolves again differently gains nothing."""
    host, port = address
    error: OSError = RefusedAddress("its host resolves to a link-local or unspecified address")
    for family, kind, protocol, _, peer in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
        if forbidden_address(str(peer[0])):
            continue
        sock = socket.socket(family, kind, protocol)
        try:
            sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(peer)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = connect


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = connect


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req)  # urlopen's default TLS context


def _build_opener() -> urllib.request.OpenerDirector:
    """urlopen's opener without redirects (a 3xx is the ping's answer, so its failure: a
    redirect could lead past the rule its URL was checked by, to another host or ftp://),
    nor schemes other than http(s), connecting through ``connect``. Proxies are the
    environment's, as urlopen's."""
    opener = urllib.request.OpenerDirector()
    handlers = (
        urllib.request.ProxyHandler(),
        urllib.request.UnknownHandler(),
        _HTTPHandler(),
        _HTTPSHandler(),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
    )
    for handler in handlers:
        opener.add_handler(handler)
    return opener


opener = _build_opener()
