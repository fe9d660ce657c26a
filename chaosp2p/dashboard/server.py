"""The dashboard's HTTP server: a read-only Starlette app served by Hypercorn inside the peer.

Theory of operation
-------------------
:func:`open_dashboard` binds the listening socket itself (so port 0 works and the URL is known
before anything is served), then runs two tasks in a task group nested in the peer's lifetime: the
:class:`~chaosp2p.dashboard.feed.DashboardFeed` and Hypercorn, on whichever backend anyio runs
(Hypercorn has a trio and an asyncio server). Leaving the block ends every event stream, asks
Hypercorn to shut down gracefully, and cancels whatever is left after ``shutdown_grace_s``.

Routes, all GET/HEAD (anything else is 405 before routing):

* ``/`` and ``/static/*`` -- the page, shipped in the package (no CDN);
* ``/api/snapshot`` -- the current view as JSON (for scripts);
* ``/api/events`` -- Server-Sent Events: ``history``, then ``snapshot``/``event``/``lag`` frames.

Access: on loopback without a token, requests whose ``Host`` is not a loopback name are refused
(a web page elsewhere cannot read the dashboard through DNS rebinding). With a token -- mandatory
off loopback -- every request must present it: ``Authorization: Bearer TOKEN``, or ``?token=TOKEN``
(which also sets an HttpOnly, SameSite=Strict cookie so the page's own requests carry it).

Cross-site requests are refused before either check (403): a browser says where a request comes
from in ``Sec-Fetch-Site`` (only ``same-origin`` and ``none`` -- the user typed the address -- pass;
``same-site`` is another port of the same host, another page) and, for scripts' requests, in
``Origin`` (it must be this dashboard's own ``http(s)://Host``). Tools that send neither (curl,
scripts) are not browsers running someone else's page and pass. So a page on another site cannot
read the dashboard nor open its event streams (which would take the slots of the user's own page).

Streams are also capped per client (``max_streams_per_client``): a client is a browser, known by a
random HttpOnly, SameSite=Strict cookie the page sets (a foreign page can neither set nor send it),
or else the address it connects from.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from http.cookies import SimpleCookie
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

import anyio
import trio
from hypercorn.config import Config as HypercornConfig
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from chaosp2p.dashboard.config import DashboardConfig, is_loopback
from chaosp2p.dashboard.feed import DashboardFeed, FeedSource, TooManyClients, frames_bytes, gather_view
from chaosp2p.dashboard.remote import RemoteRuns

log = logging.getLogger("chaosp2p.dashboard")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COOKIE = "chaosp2p_dashboard"
CLIENT_COOKIE = "chaosp2p_client"
"""Names one browser, for the per-client stream cap (random, set by the page's response)."""
SAME_ORIGIN_FETCH_SITES = ("same-origin", "none")
"""``Sec-Fetch-Site`` values of requests made by the dashboard's own page, or typed by the user."""
CLIENT_SCOPE_KEY = "chaosp2p.client"
"""Where the guard leaves the client's key in the ASGI scope for the event stream."""
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
}
SECURITY_HEADERS = [
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        b"base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]


def load_assets() -> dict[str, bytes]:
    """The page's files, read once from the installed package."""
    folder = resources.files("chaosp2p.dashboard").joinpath("static")
    return {name: folder.joinpath(name).read_bytes() for name in ASSETS}


# ------------------------------------------------------------------------------------- access guard
class Guard:
    """ASGI middleware: GET/HEAD only, no cross-site request, the Host check or the token, the
    client key of the per-client stream cap, and the security headers."""

    def __init__(self, app: ASGIApp, config: DashboardConfig) -> None:
        self.app = app
        self.token = config.token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":  # websockets: this server has none
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _plain(send, 405, b"read-only: GET only\n", [(b"allow", b"GET, HEAD")])
            return
        headers = _headers(scope)
        refusal = _cross_site(headers)
        if refusal is not None:
            await _plain(send, 403, refusal.encode() + b"\n")
            return
        set_cookie = False
        if self.token is None:
            if not _loopback_host(headers.get("host", "")):
                await _plain(send, 403, b"this dashboard answers only to a loopback Host name\n")
                return
        else:
            presented, from_query = _presented_token(scope, headers)
            if presented is None or not hmac.compare_digest(presented.encode(), self.token.encode()):
                await _plain(send, 401, b"token required\n", [(b"www-authenticate", b"Bearer")])
                return
            set_cookie = from_query
        client_id = _client_id(headers)
        new_client_id = None
        if client_id is None and scope.get("path") == "/":  # the page: name this browser from now on
            client_id = new_client_id = secrets.token_hex(16)
        address = scope.get("client") or ("?", 0)
        scope[CLIENT_SCOPE_KEY] = f"browser:{client_id}" if client_id else f"address:{address[0]}"

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = list(SECURITY_HEADERS)
                if new_client_id is not None:
                    cookie = f"{CLIENT_COOKIE}={new_client_id}; Path=/; HttpOnly; SameSite=Strict"
                    extra.append((b"set-cookie", cookie.encode()))
                if set_cookie and self.token is not None:
                    cookie = f"{COOKIE}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                    extra.append((b"set-cookie", cookie.encode()))
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _loopback_host(host: str) -> bool:
    if host.startswith("["):  # [::1]:port
        name = host[1 : host.find("]")] if "]" in host else ""
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    return is_loopback(name)


def _cross_site(headers: dict[str, str]) -> str | None:
    """Why a request made by another site's page is refused; None for the dashboard's own page,
    a typed address, or a client that is no browser (it sends neither header)."""
    site = headers.get("sec-fetch-site")
    if site is not None and site not in SAME_ORIGIN_FETCH_SITES:
        return f"cross-site request refused (Sec-Fetch-Site: {site[:32]})"
    origin = headers.get("origin")
    if origin is not None:
        host = headers.get("host", "")
        if not host or origin not in (f"http://{host}", f"https://{host}"):
            return "cross-origin request refused (Origin is not this dashboard)"
    return None


def _cookie(headers: dict[str, str], name: str) -> str | None:
    cookie: SimpleCookie = SimpleCookie()
    try:
        cookie.load(headers.get("cookie", ""))
    except Exception:  # a malformed Cookie header is just no cookie
        return None
    morsel = cookie.get(name)
    return None if morsel is None else morsel.value


def _client_id(headers: dict[str, str]) -> str | None:
    """The browser's client cookie, if it is one this server could have set (32 hex digits)."""
    value = _cookie(headers, CLIENT_COOKIE)
    if value is None or len(value) != 32 or any(c not in "0123456789abcdef" for c in value):
        return None
    return value


def _presented_token(scope: Scope, headers: dict[str, str]) -> tuple[str | None, bool]:
    """(token, whether it came in the query string) from header, query or cookie."""
    authorization = headers.get("authorization", "")
    if authorization.lower().startswith("bearer "):
        return authorization[7:].strip(), False
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if query.get("token"):
        return query["token"][0], True
    return _cookie(headers, COOKIE), False


async def _plain(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), *(headers or []), *SECURITY_HEADERS],
        }
    )
    await send({"type": "http.response.body", "body": body})


# ------------------------------------------------------------------------------------- routes
class EventStream:
    """``/api/events``: one browser's Server-Sent-Events stream (an ASGI app of its own)."""

    def __init__(self, feed: DashboardFeed) -> None:
        self.feed = feed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            client, opening = self.feed.connect(scope.get(CLIENT_SCOPE_KEY))
        except TooManyClients as exc:
            await _plain(send, 503, f"{exc}\n".encode(), [(b"retry-after", b"10")])
            return
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [
                        (b"content-type", b"text/event-stream; charset=utf-8"),
                        (b"cache-control", b"no-store"),
                        (b"x-accel-buffering", b"no"),
                    ],
                }
            )
            if scope["method"] == "HEAD":
                await send({"type": "http.response.body", "body": b""})
                return
            async with anyio.create_task_group() as tg:
                tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
                await send(
                    {
                        "type": "http.response.body",
                        "body": frames_bytes(["retry: 3000\n\n", *opening]),
                        "more_body": True,
                    }
                )
                keepalive = self.feed.config.keepalive_interval_s
                while (frames := await client.next_frames(timeout_s=keepalive)) is not None:
                    # An idle stream gets a comment: proxies keep it open, and a vanished browser
                    # is noticed when the write fails.
                    body = frames_bytes(frames) if frames else b": keepalive\n\n"
                    await send({"type": "http.response.body", "body": body, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
                tg.cancel_scope.cancel()
        except OSError:  # the browser went away mid-write
            pass
        finally:
            self.feed.disconnect(client)


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


def build_app(feed: DashboardFeed, config: DashboardConfig) -> ASGIApp:
    """The dashboard's ASGI application (guarded, read-only)."""
    assets = load_assets()

    def asset(name: str) -> Response:
        return Response(assets[name], media_type=ASSETS[name], headers={"cache-control": "no-cache"})

    async def index(request: Request) -> Response:
        return asset("index.html")

    async def static(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ASSETS or name == "index.html":
            return Response("not found\n", status_code=404, media_type="text/plain")
        return asset(name)

    async def snapshot(request: Request) -> Response:
        return JSONResponse(feed.snapshot_now(), headers={"cache-control": "no-store"})

    app = Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/static/{name}", static, methods=["GET"]),
            Route("/api/snapshot", snapshot, methods=["GET"]),
            Route("/api/events", EventStream(feed), methods=["GET"]),
        ]
    )
    return Guard(app, config)


# ------------------------------------------------------------------------------------- serving
@dataclass(frozen=True, slots=True)
class Dashboard:
    """A running dashboard."""

    url: str
    """Where to point a browser (add ``?token=...`` when a token is set)."""
    config: DashboardConfig
    feed: DashboardFeed


def _bind(config: DashboardConfig) -> socket.socket:
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((config.host, config.port))
        sock.listen(64)  # connections made before the server loop starts wait in the backlog
    except OSError:
        sock.close()
        raise
    return sock


def _running_trio() -> bool:
    """Whether the caller runs on trio (Hypercorn has one server per event loop)."""
    try:
        trio.lowlevel.current_trio_token()
    except RuntimeError:
        return False
    return True


async def _serve(app: ASGIApp, config: HypercornConfig, shutdown: anyio.Event, done: anyio.Event) -> None:
    try:
        if _running_trio():
            from hypercorn.trio import serve as serve_trio

            await serve_trio(app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]
        else:
            from hypercorn.asyncio import serve as serve_asyncio

            await serve_asyncio(app, config, shutdown_trigger=shutdown.wait)  # type: ignore[arg-type]
    finally:
        done.set()


@asynccontextmanager
async def open_dashboard(node: FeedSource, config: DashboardConfig | None = None) -> AsyncIterator[Dashboard]:
    """Serve the dashboard for ``node`` for the duration of the block.

    Raises :class:`~chaosp2p.errors.ConfigError` (through :class:`DashboardConfig`) for a
    non-loopback address without a token, and ``OSError`` if the address cannot be bound.
    """
    config = config or DashboardConfig()
    sock = _bind(config)
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    hypercorn_config = HypercornConfig()
    hypercorn_config.bind = [f"fd://{sock.detach()}"]  # Hypercorn owns (and closes) the socket now
    hypercorn_config.accesslog = None
    http_log = logging.getLogger("chaosp2p.dashboard.http")
    if http_log.level == logging.NOTSET:  # Hypercorn's "Running on ... (CTRL + C to quit)" would mislead
        http_log.setLevel(logging.WARNING)
    hypercorn_config.errorlog = http_log
    hypercorn_config.graceful_timeout = config.shutdown_grace_s
    hypercorn_config.include_server_header = False
    remote = RemoteRuns(node)
    feed = DashboardFeed(node, config, view=lambda: gather_view(node, role=config.role, remote_runs=remote.runs()))
    shutdown, done = anyio.Event(), anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(feed.run, name="dashboard feed")
        tg.start_soon(remote.run, lambda: feed.client_count > 0, name="dashboard remote runs")
        tg.start_soon(_serve, build_app(feed, config), hypercorn_config, shutdown, done, name="dashboard http")
        dashboard = Dashboard(url=f"http://{shown}:{port}/", config=config, feed=feed)
        log.info("dashboard on %s", dashboard.url)
        try:
            yield dashboard
        finally:
            feed.close()
            shutdown.set()
            with anyio.move_on_after(config.shutdown_grace_s + 1.0, shield=True):
                await done.wait()
            tg.cancel_scope.cancel()
