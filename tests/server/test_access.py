"""``--api-key`` (Bearer tokens on every /v1 route and the token routes; /health, /metrics and /version open) and
``--allowed-origins`` (CORS)."""

from __future__ import annotations

import httpx
import openai
import pytest

from hypic_rag.server import create_app
from hypic_rag.testing.server import serve_in_thread

from .conftest import MODEL, fleet

KEY = "sk-test-0123456789"
BODY_TIMEOUT_S = 3.0  # the body deadline of the servers here
ORIGIN = "http://localhost:5173"


@pytest.fixture(scope="module", params=["process", pytest.param("fleet", marks=pytest.mark.ray)])
def guarded(request) -> str:
    """The bundled model behind ``--api-key`` and ``--allowed-origins``: one process, or a fleet."""
    options = {"api_key": KEY, "allowed_origins": [ORIGIN], "body_timeout_s": BODY_TIMEOUT_S}
    if request.param == "fleet":
        yield from fleet(request.getfixturevalue("proxy"), "guarded", **options)
        return
    app = create_app(request.getfixturevalue("engine"), model_names=[MODEL], **options)
    with serve_in_thread(app) as url:
        yield url


def test_the_key_guards_every_v1_route(guarded):
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Where does Bo Ek live?"}], "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": "Basic " + KEY}):
        for method, path, body in (
            ("post", "/v1/chat/completions", ask),
            ("get", "/v1/models", None),
            ("post", "/tokenize", {"prompt": "Where does Bo Ek live?"}),
            ("post", "/detokenize", {"tokens": [5, 6]}),
        ):
            response = httpx.request(method, guarded + path, json=body, headers=headers)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    for path in ("/health", "/metrics", "/version"):
        assert httpx.get(guarded + path).status_code == 200, path
    counted = httpx.post(guarded + "/tokenize", json=ask, headers={"Authorization": "Bearer " + KEY})
    assert counted.status_code == 200 and counted.json()["count"] > 0
    with openai.OpenAI(base_url=guarded + "/v1", api_key=KEY, max_retries=0) as client:
        assert client.chat.completions.create(**ask).choices[0].message.content is not None
        assert client.completions.create(model=MODEL, prompt="Where does Bo Ek live?", max_tokens=2).choices
    with openai.OpenAI(base_url=guarded + "/v1", api_key="nope", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()


def test_allowed_origins_get_cors_headers(guarded):
    preflight = httpx.options(
        guarded + "/v1/chat/completions",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization",
        },
    )
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == ORIGIN
    other = httpx.options(
        guarded + "/v1/chat/completions",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in other.headers
    answer = httpx.get(guarded + "/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
    assert answer.headers["access-control-allow-origin"] == ORIGIN
    refused = httpx.get(guarded + "/v1/models", headers={"Origin": ORIGIN})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == ORIGIN


def test_an_empty_key_is_refused(engine):
    with pytest.raises(ValueError, match="api_key"):
        create_app(engine, api_key="")


STALLED = 2000  # connections that send their headers and 10 bytes of a 1,000-byte body, then nothing


async def _open_stalled(url: str, count: int, extra: bytes = b"") -> list:
    """``count`` connections to the chat route, each stalled 10 bytes into its body, opened 200 at a time."""
    import asyncio
    from urllib.parse import urlparse

    where = urlparse(url)
    request = (
        f"POST {where.path}/v1/chat/completions HTTP/1.1\r\nHost: {where.netloc}\r\n".encode()
        + b"Content-Type: application/json\r\nContent-Length: 1000\r\n"
        + extra
        + b'\r\n{"model": '
    )

    async def one():
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        writer.write(request)
        await writer.drain()
        return reader, writer

    opened: list = []
    for start in range(0, count, 200):
        opened += await asyncio.gather(*(one() for _ in range(min(200, count - start))))
    return opened


async def _statuses(connections: list, timeout_s: float) -> list[int | None]:
    import asyncio

    async def status(reader) -> int | None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout_s)
        except TimeoutError:
            return None
        return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else None

    return await asyncio.gather(*(status(reader) for reader, _ in connections))


def test_stalled_bodies_without_the_key_hold_nothing_and_the_keyed_canary_is_answered(guarded):
    """A flood of connections that send headers and a few bytes of body, then stall: without the key each is
    refused (401) before its body is read, so the connections hold nothing, and a request with the key is
    answered beside them."""
    import asyncio
    import time

    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Where does Bo Ek live?"}], "max_tokens": 2}

    async def canary(client: httpx.AsyncClient) -> tuple[int, float]:
        started = time.perf_counter()
        answer = await client.post(
            guarded + "/v1/chat/completions", json=ask, headers={"Authorization": f"Bearer {KEY}"}
        )
        return answer.status_code, time.perf_counter() - started

    async def attack() -> tuple[list, tuple[int, float], tuple[int, float]]:
        async with httpx.AsyncClient(timeout=60) as client:
            stalled = await _open_stalled(guarded, STALLED)
            try:
                during = await canary(client)  # sent while the flood's refusals are still going out
                statuses = await _statuses(stalled, 30)
                after = await canary(client)  # the stalled connections still open, each answered
                return statuses, during, after
            finally:
                for _, writer in stalled:
                    writer.close()

    statuses, during, after = asyncio.run(attack())
    assert during[0] == 200 and after[0] == 200
    assert statuses.count(401) == STALLED, {s: statuses.count(s) for s in set(statuses)}
    took = f"{during[1]:.2f} s while they were refused, {after[1]:.2f} s after"
    print(f"beside {STALLED} stalled bodies the canary took {took}")


def test_a_declared_length_past_the_limit_is_refused_at_once_and_a_stalled_body_in_its_deadline(guarded):
    """With the key: a body declared past the limit is a 413 before any of it is read; one that stalls is a 408
    once the body deadline passes (``BODY_TIMEOUT_S`` here)."""
    import asyncio
    from urllib.parse import urlparse

    keyed = f"Authorization: Bearer {KEY}\r\n".encode()

    async def oversized() -> int | None:
        where = urlparse(guarded)
        reader, writer = await asyncio.open_connection(where.hostname, where.port)
        writer.write(
            f"POST {where.path}/v1/chat/completions HTTP/1.1\r\nHost: {where.netloc}\r\n".encode()
            + keyed
            + b"Content-Type: application/json\r\nContent-Length: 9000000\r\n\r\n"
        )
        await writer.drain()
        try:
            return (await _statuses([(reader, writer)], 30))[0]
        finally:
            writer.close()

    async def stalled() -> list[int | None]:
        connections = await _open_stalled(guarded, 3, keyed)
        try:
            return await _statuses(connections, 60)
        finally:
            for _, writer in connections:
                writer.close()

    assert asyncio.run(oversized()) == 413
    assert asyncio.run(stalled()) == [408, 408, 408]
