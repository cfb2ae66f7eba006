"""The HTTP(S) endpoint that serves one registry to Prometheus, with optional basic auth."""

from __future__ import annotations

import base64
import errno
import hmac
import socket
import ssl
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]

REQUEST_TIMEOUT_SECONDS = 10.0
"""How long one scrape connection may stall before its server thread gives up on it."""
LINGER_CAP_SECONDS = 30.0
"""The longest `close` waits for a last scrape (it waits twice the scrape interval it saw)."""


class MetricsPortInUseError(OSError):
    """The metrics port is taken by another process; the message names the address and port."""


def require_basic_auth(app: WsgiApp, username: str, password: str) -> WsgiApp:
    """Wrap a WSGI app so that it answers only requests carrying these basic-auth credentials.

    prometheus-client 0.26 serves TLS but has no basic auth of its own, hence this wrapper.
    """
    if not username or ":" in username:
        raise ValueError(f"basic-auth username {username!r} must be non-empty and contain no ':'")
    if not password:
        raise ValueError("basic-auth password must not be empty")
    token = base64.b64encode(f"{username}:{password}".encode()).decode("ascii")
    expected = f"Basic {token}".encode()

    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        supplied = environ.get("HTTP_AUTHORIZATION", "").encode("latin-1", "replace")
        if hmac.compare_digest(supplied, expected):
            return app(environ, start_response)
        start_response(
            "401 Unauthorized",
            [
                ("WWW-Authenticate", 'Basic realm="globaldl metrics"'),
                ("Content-Type", "text/plain"),
            ],
        )
        return [b"401 Unauthorized: this metrics endpoint needs basic auth\n"]

    return guarded


def tls_context(certfile: str, keyfile: str) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 or newer) for `certfile` and `keyfile`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=certfile, keyfile=keyfile)
    except (OSError, ssl.SSLError) as error:
        raise ValueError(
            f"cannot load TLS certificate {certfile!r} with key {keyfile!r}: {error}"
        ) from error
    return context


class _ScrapeLog:
    """When answered scrapes started, so that `close` can wait for one last scrape."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._answered_starts: deque[float] = deque(maxlen=2)
        self._request = threading.local()  # one thread per request (ThreadingMixIn)

    def wrap(self, app: WsgiApp) -> WsgiApp:
        """Mark requests that reach `app` (inside any auth check) as scrapes."""

        def marked(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
            self._request.started = time.monotonic()
            return app(environ, start_response)

        return marked

    def request_finished(self) -> None:
        """Called once a response has been flushed to the client."""
        started = getattr(self._request, "started", None)
        if started is None:
            return
        self._request.started = None
        with self._condition:
            self._answered_starts.append(started)
            self._condition.notify_all()

    def wait_for_next_scrape(self, cap_seconds: float) -> None:
        """If something scrapes regularly, wait (up to twice its interval) for its next scrape.

        A run's last steps happen after its last regular scrape; without this wait their
        counts would never reach Prometheus.
        """
        with self._condition:
            if len(self._answered_starts) < 2:
                return
            interval = self._answered_starts[-1] - self._answered_starts[-2]
            now = time.monotonic()
            deadline = now + min(max(2 * interval, 0.25), cap_seconds)
            while self._answered_starts[-1] < now:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return
                self._condition.wait(remaining)


class _QuietHandler(WSGIRequestHandler):
    """Serves one scrape without logging it, and gives up on a stalled client."""

    timeout = REQUEST_TIMEOUT_SECONDS

    def setup(self) -> None:
        super().setup()
        if isinstance(self.connection, ssl.SSLSocket):
            # The handshake runs here, in this request's thread, so a slow client can never
            # hold up the accept loop or other scrapes.
            self.connection.do_handshake()

    def finish(self) -> None:
        super().finish()
        self.server.scrape_log.request_finished()  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (base-class name)
        """Log nothing: a scrape every few seconds is not news."""


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    """One thread per scrape; threads never keep the process alive."""

    daemon_threads = True
    scrape_log: _ScrapeLog

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that drops, times out or fails the TLS handshake is its own problem."""
        error = sys.exc_info()[1]
        if isinstance(error, ssl.SSLError | ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class MetricsServer:
    """Serves a registry at http(s)://ADDR:PORT/metrics from a daemon thread until `close`."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        port: int,
        addr: str = "127.0.0.1",
        certfile: str | None = None,
        keyfile: str | None = None,
        basic_auth: tuple[str, str] | None = None,
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(
                f"metrics port {port!r} is out of range; expected 0-65535 (0 = any free port)"
            )
        if (certfile is None) != (keyfile is None):
            raise ValueError(
                "TLS needs both certfile and keyfile; "
                f"got certfile={certfile!r}, keyfile={keyfile!r}"
            )
        context = tls_context(certfile, keyfile) if certfile and keyfile else None
        scrape_log = _ScrapeLog()
        app: WsgiApp = scrape_log.wrap(make_wsgi_app(registry))
        if basic_auth is not None:
            app = require_basic_auth(app, *basic_auth)
        try:
            family, *_, sockaddr = socket.getaddrinfo(
                addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )[0]
        except socket.gaierror as error:
            raise ValueError(f"metrics address {addr!r} cannot be resolved: {error}") from error

        class _Server(_ThreadingServer):
            address_family = family

        try:
            self._httpd = make_server(sockaddr[0], port, app, _Server, handler_class=_QuietHandler)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise MetricsPortInUseError(
                    errno.EADDRINUSE,
                    f"metrics port {port} on address {addr} is already in use; stop the process "
                    "holding it or choose another --metrics-port (each rank uses base + its "
                    "local rank)",
                ) from error
            raise
        self._httpd.scrape_log = scrape_log
        if context is not None:
            self._httpd.socket = context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self.addr = addr
        self.port: int = self._httpd.server_address[1]
        self.scheme = "https" if context is not None else "http"
        host = f"[{addr}]" if ":" in addr else addr
        self.url = f"{self.scheme}://{host}:{self.port}/metrics"
        self._closed = False
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.5},
            name=f"globaldl-metrics-{self.port}",
            daemon=True,
        )
        self._thread.start()

    def close(self, linger_cap_seconds: float = LINGER_CAP_SECONDS) -> None:
        """Serve one last scrape if Prometheus scrapes regularly, then stop and free the port.

        The wait is at most twice the interval seen between scrapes, and `linger_cap_seconds`.
        Safe to call twice.
        """
        if self._closed:
            return
        self._closed = True
        self._httpd.scrape_log.wait_for_next_scrape(linger_cap_seconds)
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)
