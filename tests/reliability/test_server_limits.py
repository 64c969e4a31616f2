"""The server's limits on a body: JSON nested past a bound, non-finite numbers in any field, and a body that never
arrives are each a 4xx naming the problem, and nothing it sends is invalid JSON, streamed chunks included."""

from __future__ import annotations

import json
import math
import socket
import time

import httpx
import pytest

from hypic_rag.outputs import GenerationOutput
from hypic_rag.server import create_app
from hypic_rag.server.protocol import completion, sse, usage_chunk
from hypic_rag.testing.server import serve_in_thread

from .conftest import engine

MODEL = "hypic-default"


def strict_json(text: str | bytes):
    """``json.loads`` that refuses NaN and Infinity, which are not JSON."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def url():
    with serve_in_thread(create_app(engine(), model_names=[MODEL], body_timeout_s=1.0)) as base:
        yield base


def _post(url: str, raw: bytes) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}, timeout=60
    )


def _body() -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Where does Ana Lee live?"}], "max_tokens": 2}


@pytest.mark.parametrize("depth", [65, 5_000, 100_000])
def test_json_nested_past_the_bound_is_a_400(url, depth):
    whole = _post(url, b"[" * depth + b"]" * depth)
    content = _post(
        url,
        b'{"model": "%s", "messages": [{"role": "user", "content": %s}]}'
        % (MODEL.encode(), b"[" * depth + b"]" * depth),
    )
    for response in (whole, content):
        assert response.status_code == 400, response.text[:300]
        assert "nested" in strict_json(response.content)["error"]["message"]


def test_json_within_the_bound_is_served(url):
    nested: dict = {"type": "object"}
    for _ in range(20):  # a deep tool schema
        nested = {"type": "object", "properties": {"x": nested}}
    tool = {"type": "function", "function": {"name": "f", "parameters": nested}}
    body = {**_body(), "tools": [tool], "tool_choice": "none"}
    assert _post(url, json.dumps(body).encode()).status_code == 200


@pytest.mark.parametrize(
    ("field", "path"),
    [
        ('"hypic": {"seam": Infinity}', "hypic.seam"),
        ('"temperature": NaN', "temperature"),
        ('"top_p": -Infinity', "top_p"),
        ('"seed": 1e999', "seed"),
        ('"metadata": {"score": [1, NaN]}', "metadata.score.1"),
        (
            '"tools": [{"type": "function", "function": {"name": "f", "parameters": {"maximum": Infinity}}}]',
            "tools.0.function.parameters.maximum",
        ),
        ('"chat_template_kwargs": {"x": NaN}', "chat_template_kwargs.x"),
    ],
)
def test_a_non_finite_number_in_any_field_is_a_400_naming_it(url, field, path):
    for stream in ("false", "true"):
        head = f'"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}], "max_tokens": 2'
        raw = "{" + f'{head}, "stream": {stream}, {field}' + "}"
        response = _post(url, raw.encode())
        assert response.status_code == 400, response.text[:300]
        error = strict_json(response.content)["error"]
        assert error["param"] == path and path in error["message"]


def test_a_body_shorter_than_its_content_length_is_answered_not_waited_on(url):
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as conn:
        conn.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"model": '
        )
        begin = time.monotonic()
        reply = b""
        while b"\r\n\r\n" not in reply:
            piece = conn.recv(4096)
            if not piece:
                break
            reply += piece
    assert reply.split(b" ")[1] in (b"408", b"400"), reply[:200]
    # by the server's body_timeout_s of 1 s, not the default 30 s (the bound is loose, for a loaded machine)
    assert time.monotonic() - begin < 25


def test_what_the_server_sends_is_json_even_for_non_finite_stats():
    out = GenerationOutput("Oslo", [1, 2], 0.0, stats={"seam": math.inf, "prompt_tokens": 3, "x": math.nan})
    for event in (sse(usage_chunk("id", MODEL, 0, out)), sse(completion(out, MODEL, "id"))):
        data = strict_json(event.decode().removeprefix("data: "))
        assert data["hypic"]["seam"] is None and data["hypic"]["x"] is None and data["hypic"]["prompt_tokens"] == 3
