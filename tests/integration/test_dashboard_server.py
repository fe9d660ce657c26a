"""The dashboard's HTTP server, in process on 127.0.0.1, on trio and asyncio: access rules and the stream."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any
from urllib.parse import urlparse

import anyio
import anyio.abc
import numpy as np
import pytest

from chaosp2p import PeerConfig, SnapshotStore, open_peer
from chaosp2p.protocols.transfer import TransferProgress
from chaosp2p.runtime.node import Node, open_node
from tests.conditions import eventually

pytest.importorskip("starlette")
pytest.importorskip("hypercorn")

from chaosp2p.dashboard import DashboardConfig, open_dashboard
from chaosp2p.dashboard.server import Dashboard

pytestmark = pytest.mark.anyio
TOKEN = "s3cret-token-0123456789"


@asynccontextmanager
async def served(config: DashboardConfig) -> AsyncIterator[tuple[Node, Dashboard]]:
    config_node = PeerConfig.local(listen=["/ip4/127.0.0.1/tcp/0"])
    async with open_node(config_node, node_class=Node) as node, open_dashboard(node, config) as dashboard:
        yield node, dashboard


async def request(
    dashboard: Dashboard, path: str, *, method: str = "GET", headers: dict[str, str] | None = None, body: bytes = b""
) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request with ``Connection: close``; (status, headers, body as sent, chunked or not)."""
    url = urlparse(dashboard.url)
    assert url.hostname is not None and url.port is not None
    headers = {"Host": f"127.0.0.1:{url.port}", **(headers or {})}
    lines = [f"{method} {path} HTTP/1.1", "Connection: close", *(f"{k}: {v}" for k, v in headers.items())]
    if body:
        lines.append(f"Content-Length: {len(body)}")
    with anyio.fail_after(10):
        async with await anyio.connect_tcp(url.hostname, url.port) as stream:
            await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
            data = b""
            try:
                while True:
                    data += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                pass
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {}
    for line in header_lines:
        key, _, value = line.partition(":")
        parsed[key.strip().lower()] = value.strip()
    return int(status_line.split()[1]), parsed, rest


async def test_page_assets_and_snapshot_on_loopback_and_nothing_but_get() -> None:
    async with served(DashboardConfig(port=0)) as (node, dashboard):
        status, headers, body = await request(dashboard, "/")
        assert status == 200 and headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in headers["content-security-policy"]
        assert headers["x-content-type-options"] == "nosniff"
        assert b'src="static/app.js"' in body and b"http" not in body.replace(b"http-equiv", b"")  # no CDN
        status, headers, body = await request(dashboard, "/static/app.js")
        assert status == 200 and headers["content-type"].startswith("text/javascript")
        for sink in (b"innerHTML", b"outerHTML", b"insertAdjacentHTML", b"document.write", b"eval("):
            assert sink not in body  # peer strings only ever reach the DOM as text
        assert (await request(dashboard, "/static/../server.py"))[0] == 404
        assert (await request(dashboard, "/static/nothing.js"))[0] == 404
        status, _, body = await request(dashboard, "/api/snapshot")
        snapshot = json.loads(body)
        assert status == 200 and snapshot["self"]["peer_id"] == str(node.peer_id)
        assert [m["peer_id"] for m in snapshot["members"]] == [str(node.peer_id)]
        for method in ("POST", "PUT", "DELETE", "PATCH"):
            status, headers, _ = await request(dashboard, "/api/snapshot", method=method, body=b"x")
            assert status == 405 and headers["allow"] == "GET, HEAD"
        # DNS rebinding: a page elsewhere whose name resolves to 127.0.0.1 is refused.
        assert (await request(dashboard, "/", headers={"Host": "attacker.example:80"}))[0] == 403


async def test_a_token_is_required_on_every_request_when_set() -> None:
    async with served(DashboardConfig(port=0, token=TOKEN)) as (_, dashboard):
        assert (await request(dashboard, "/"))[0] == 401
        assert (await request(dashboard, "/static/app.js"))[0] == 401
        assert (await request(dashboard, "/api/events"))[0] == 401
        assert (await request(dashboard, "/", headers={"Authorization": "Bearer wrong-token-0123456789"}))[0] == 401
        assert (await request(dashboard, "/api/snapshot", headers={"Authorization": f"Bearer {TOKEN}"}))[0] == 200
        status, headers, _ = await request(dashboard, f"/?token={TOKEN}")
        assert status == 200 and "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
        cookie = headers["set-cookie"].split(";", 1)[0]
        assert (await request(dashboard, "/static/app.js", headers={"Cookie": cookie}))[0] == 200
        # With a token the Host check is not what protects the page: any Host name is fine.
        assert (await request(dashboard, "/", headers={"Host": "dashboard.lan", "Authorization": f"Bearer {TOKEN}"}))[
            0
        ] == 200


async def test_event_stream_opens_with_history_and_snapshot_and_forgets_closed_browsers() -> None:
    async with served(DashboardConfig(port=0, max_clients=1)) as (node, dashboard):
        url = urlparse(dashboard.url)
        assert url.hostname is not None and url.port is not None
        stream = await anyio.connect_tcp(url.hostname, url.port)
        await stream.send(f"GET /api/events HTTP/1.1\r\nHost: localhost:{url.port}\r\n\r\n".encode())
        data = b""
        with anyio.fail_after(10):
            while b"event: snapshot" not in data or not data.rstrip().endswith(b"}"):
                data += await stream.receive()
        assert b"text/event-stream" in data and b"retry: 3000" in data
        assert data.index(b"event: history") < data.index(b"event: snapshot")
        assert dashboard.feed.client_count == 1
        # The cap: a second browser is told to come back later, without hurting the first.
        status, headers, _ = await request(dashboard, "/api/events")
        assert status == 503 and headers["retry-after"] == "10"
        # A live event reaches the open stream.
        node.publish(_Marker(note="hello from the test", at=node.clock.now()))
        with anyio.fail_after(10):
            while b"hello from the test" not in data:
                data += await stream.receive()
        await stream.aclose()
        await eventually(lambda: dashboard.feed.client_count == 0, timeout_s=10)
        assert (await request(dashboard, "/api/snapshot"))[0] == 200


class _Marker:
    """Any object a driver publishes reaches the page (this one is not even a dataclass)."""

    def __init__(self, *, note: str, at: float) -> None:
        self.note = note
        self.at = at

    def __str__(self) -> str:
        return self.note


async def test_a_load_in_flight_is_shown_as_a_transfer_with_its_sources() -> None:
    async with (
        open_peer(PeerConfig.local()) as source,
        open_peer(PeerConfig.local()) as newcomer,
        open_dashboard(newcomer, DashboardConfig(port=0)) as dashboard,
    ):
        store = SnapshotStore(source.config.transfer)
        store.publish("run-a", 3, {"w": np.arange(1 << 20, dtype=np.float32)})
        await source.serve_state(store)
        seen: list[dict[str, Any]] = []

        def progress(update: TransferProgress) -> None:
            assert update in newcomer.state.transfers_in_progress()
            seen.extend(dashboard.feed.snapshot_now()["transfers"])

        await newcomer.load_state("run-a", sources=[str(source.addrs[0])], progress=progress)
        assert seen, "no progress was reported"
        assert all(t["run"] == "run-a" and t["step"] == 3 and 0.0 <= t["fraction"] <= 1.0 for t in seen)
        assert seen[-1]["fraction"] == 1.0
        assert {s["peer"] for t in seen for s in t["sources"]} == {str(source.peer_id)}
        assert newcomer.state.transfers_in_progress() == ()
        assert dashboard.feed.snapshot_now()["transfers"] == []


async def test_requests_from_another_sites_page_are_refused() -> None:
    """Issue 20, finding 12: a page elsewhere could read the dashboard and open its streams."""
    for config in (DashboardConfig(port=0), DashboardConfig(port=0, token=TOKEN)):
        async with served(config) as (_, dashboard):
            port = urlparse(dashboard.url).port
            auth = {} if config.token is None else {"Authorization": f"Bearer {TOKEN}"}
            for foreign in (
                {"Sec-Fetch-Site": "cross-site"},
                {"Sec-Fetch-Site": "same-site"},  # another port of this host is another page
                {"Origin": "http://attacker.example"},
                {"Origin": f"http://127.0.0.1:{port + 1 if port != 65535 else 1}"},
                {"Origin": "null"},
                {"Sec-Fetch-Site": "same-origin", "Origin": "http://attacker.example"},
            ):
                for path in ("/", "/api/snapshot", "/api/events", "/static/app.js"):
                    status, _, body = await request(dashboard, path, headers={**auth, **foreign})
                    assert status == 403 and b"refused" in body, (foreign, path, status)
            # The dashboard's own page, an address the user typed, and tools that are no browser.
            for own in (
                {"Sec-Fetch-Site": "same-origin", "Origin": f"http://127.0.0.1:{port}"},
                {"Sec-Fetch-Site": "none"},
                {},
            ):
                assert (await request(dashboard, "/api/snapshot", headers={**auth, **own}))[0] == 200, own


async def _open_event_stream(dashboard: Dashboard, headers: dict[str, str]) -> tuple[int, anyio.abc.ByteStream]:
    """Open ``/api/events`` and read the response head; (status, the connection, left open)."""
    url = urlparse(dashboard.url)
    assert url.hostname is not None and url.port is not None
    lines = ["GET /api/events HTTP/1.1", f"Host: 127.0.0.1:{url.port}", *(f"{k}: {v}" for k, v in headers.items())]
    stream = await anyio.connect_tcp(url.hostname, url.port)
    await stream.send(("\r\n".join(lines) + "\r\n\r\n").encode())
    data = b""
    with anyio.fail_after(10):
        while b"\r\n\r\n" not in data:
            data += await stream.receive()
    return int(data.split(b" ", 2)[1]), stream


async def test_one_client_cannot_take_every_stream_slot_from_the_users_page() -> None:
    """Issue 20, finding 12: 16 streams from one client took every slot; the user's page got 503."""
    async with served(DashboardConfig(port=0)) as (_, dashboard), AsyncExitStack() as held:
        config = dashboard.config
        accepted = 0
        for _ in range(config.max_clients):  # a script (or an old browser's foreign page) without the cookie
            status, stream = await _open_event_stream(dashboard, {})
            held.push_async_callback(stream.aclose)
            accepted += status == 200
        assert accepted < config.max_clients
        # The user's page: loaded with a typed address, it names the browser with a cookie ...
        status, headers, _ = await request(dashboard, "/", headers={"Sec-Fetch-Site": "none"})
        set_cookie = headers["set-cookie"]
        assert status == 200 and "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
        cookie = set_cookie.split(";", 1)[0]
        # ... and its stream still gets a slot.
        status, stream = await _open_event_stream(dashboard, {"Cookie": cookie, "Sec-Fetch-Site": "same-origin"})
        held.push_async_callback(stream.aclose)
        assert status == 200
        assert accepted == config.max_streams_per_client and dashboard.feed.client_count == accepted + 1
