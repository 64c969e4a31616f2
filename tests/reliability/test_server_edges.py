"""The HTTP edge under arbitrary bodies (Hypothesis): every answer is a 200 or a 4xx with OpenAI's error body,
never a 5xx or a dropped connection, and every body it sends is JSON (no NaN or Infinity), each event of a
stream included. Bodies hold non-finite numbers, nesting of any depth and values of every type in any field."""

from __future__ import annotations

import json
import re

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypic_rag.server import create_app
from hypic_rag.testing.server import serve_in_thread

from .conftest import engine

MODEL = "hypic-default"
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 10**6),
    st.floats(allow_subnormal=False),  # NaN and +-Infinity too, which json.dumps writes as bare words
    st.text(max_size=8),
)


NEST = re.compile(r'"\\ue000(\d+)\\ue000"')  # a placeholder for arrays nested that deep, put in after encoding


def _encode(body: dict) -> bytes:
    """The body as Python's json writes it (NaN and Infinity as bare words), each placeholder replaced by its
    nesting, too deep for json.dumps itself to write."""
    text = json.dumps(body)
    return NEST.sub(lambda m: "[" * int(m.group(1)) + "]" * int(m.group(1)), text).encode()


# Any JSON value: small trees, or arrays nested up to 100,000 deep.
ANY = st.one_of(
    st.recursive(
        SCALARS, lambda inner: st.lists(inner, max_size=2) | st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    st.sampled_from([1, 63, 64, 65, 1_000, 5_000, 100_000]).map(lambda depth: f"\ue000{depth}\ue000"),
)
# A request that would run, so that a bad value in another field is what is under test.
ASK = st.lists(
    st.fixed_dictionaries({"role": st.just("user"), "content": st.text(min_size=1, max_size=30)}),
    min_size=1,
    max_size=2,
)
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", 3]), "text": st.one_of(st.text(max_size=20), SCALARS)},
    optional={"hypic": st.one_of(SCALARS, st.fixed_dictionaries({"kind": st.one_of(SCALARS, st.just("document"))}))},
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), SCALARS),
        "content": st.one_of(st.text(max_size=30), st.lists(PART, max_size=3), ANY),
    },
    optional={
        "tool_calls": st.lists(st.dictionaries(st.text(max_size=5), ANY, max_size=2), max_size=2),
        "name": SCALARS,
        "tool_call_id": SCALARS,
    },
)
BODY = st.fixed_dictionaries(
    {"model": st.one_of(st.just(MODEL), SCALARS), "messages": st.one_of(ASK, st.lists(MESSAGE, max_size=3), ANY)},
    optional={
        "max_tokens": SCALARS,
        "temperature": SCALARS,
        "top_p": SCALARS,
        "seed": SCALARS,
        "stop": st.one_of(SCALARS, st.lists(st.text(max_size=3), max_size=5)),
        "n": SCALARS,
        "stream": st.booleans(),
        "stream_options": st.one_of(ANY, st.fixed_dictionaries({"include_usage": st.booleans()})),
        "tools": st.one_of(ANY, st.lists(st.dictionaries(st.text(max_size=5), ANY, max_size=2), max_size=2)),
        "chat_template_kwargs": st.one_of(SCALARS, st.dictionaries(st.text(max_size=5), ANY, max_size=2)),
        "metadata": ANY,
        "tool_choice": st.one_of(SCALARS, st.sampled_from(["auto", "none", "required"])),
        "hypic": st.one_of(
            SCALARS, st.dictionaries(st.sampled_from(["mode", "seam", "segmentation", "x"]), SCALARS, max_size=2)
        ),
    },
)


@pytest.fixture(scope="module")
def url():
    with serve_in_thread(create_app(engine(), model_names=[MODEL])) as base:
        yield base


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(BODY)
def test_any_body_gets_a_200_or_a_4xx_with_the_error_body(url, body):
    body = {**body, "max_tokens": body.get("max_tokens", 2)}
    if isinstance(body["max_tokens"], int) and body["max_tokens"] > 8:
        body["max_tokens"] = 8  # bounded answers keep the run short; the value's type is what is under test
    response = httpx.post(
        url + "/v1/chat/completions",
        content=_encode(body),
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        error = strict_json(response.content)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    elif response.headers["content-type"].startswith("text/event-stream"):
        events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
        assert events[-1] == "[DONE]"
        for event in events[:-1]:
            strict_json(event)
    else:
        strict_json(response.content)


def strict_json(text: str | bytes):
    """``json.loads`` refusing NaN and Infinity, which are not JSON."""

    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


# JSON schemas as a careless or hostile client writes them: any keyword at any depth, recursive references,
# patterns the lexer cannot build, unsatisfiable ones, nesting 29 deep (58 levels of JSON), enums of 50,000.
LEAF = st.one_of(
    st.sampled_from(["string", "integer", "number", "boolean", "null", "array", "object", "thing"]).map(
        lambda t: {"type": t}
    ),
    st.lists(st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=4)), max_size=4).map(
        lambda values: {"enum": values}
    ),
    st.sampled_from(["a{1000}{1000}", "(", "^[a-z]{1,8}$", "x*", "[", "\\d{3}"]).map(
        lambda p: {"type": "string", "pattern": p}
    ),
    st.sampled_from([True, False, {}, {"$ref": "#/$defs/x"}, {"$ref": "#"}, {"format": "zip-code"}]),
)
SCHEMA = st.one_of(
    st.recursive(
        LEAF,
        lambda inner: st.one_of(
            st.fixed_dictionaries(
                {"type": st.just("object"), "properties": st.dictionaries(st.text(max_size=4), inner, max_size=3)},
                optional={
                    "required": st.lists(st.text(max_size=4), max_size=3),
                    "additionalProperties": st.one_of(st.booleans(), inner),
                },
            ),
            st.fixed_dictionaries({"type": st.just("array"), "items": inner}, optional={"minItems": st.integers(0, 3)}),
            st.tuples(st.sampled_from(["anyOf", "oneOf", "allOf"]), st.lists(inner, max_size=3)).map(
                lambda pair: {pair[0]: pair[1]}
            ),
            st.fixed_dictionaries({"$defs": st.fixed_dictionaries({"x": inner}), "$ref": st.just("#/$defs/x")}),
        ),
        max_leaves=12,
    ),
    st.integers(1, 29).map(lambda depth: _nested(depth)),
    st.integers(5_000, 50_000).map(lambda n: {"enum": list(range(n))}),
)
ASKED = st.one_of(
    SCHEMA.map(lambda s: {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": s}}}),
    st.tuples(SCHEMA, st.sampled_from(["auto", "required", "named"])).map(
        lambda pair: {
            "tools": [{"type": "function", "function": {"name": "f", "parameters": pair[0]}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}} if pair[1] == "named" else pair[1],
        }
    ),
)


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


class _Canary:
    """A small request sent again and again beside the fuzz, its latencies kept."""

    def __init__(self, url: str) -> None:
        import threading

        self.url, self.latencies, self.failures = url, [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def once(self) -> float:
        import time

        started = time.perf_counter()
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Where does Bo Ek live?"}], "max_tokens": 8}
        response = httpx.post(self.url + "/v1/chat/completions", json=body, timeout=120)
        if response.status_code != 200:
            self.failures.append(response.text)
        return time.perf_counter() - started

    def _run(self) -> None:
        while not self.stop.is_set():
            self.latencies.append(self.once())
            self.stop.wait(0.2)  # a steady request, not a flood: the fuzz is what loads the server


@pytest.fixture(scope="module")
def canary(url):
    alone = min(_Canary(url).once() for _ in range(3))
    running = _Canary(url)
    running.thread.start()
    yield running
    running.stop.set()
    running.thread.join(120)
    assert not running.failures, running.failures[:3]
    assert running.latencies and max(running.latencies) < 20 * alone + 30, (max(running.latencies), alone)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ASKED, st.booleans())
def test_any_schema_is_answered_or_refused_while_a_canary_is_served(url, canary, asked, stream):
    """No 5xx, a refusal names a field before any token is decoded (a streamed one is a 400 too), and the canary
    beside it keeps being served (the fixture checks its latencies at the end)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Where?"}], "max_tokens": 8, "stream": stream}
    response = httpx.post(url + "/v1/chat/completions", json={**body, **asked}, timeout=60)
    assert response.status_code in (200, 400), response.text
    if response.status_code == 400:
        error = strict_json(response.content)["error"]
        assert error["param"] and "<state>" not in error["message"] and "%llguidance" not in error["message"], error
