"""The HTTP edge under arbitrary bodies (Hypothesis): every answer is a 200 or a 4xx with OpenAI's error body,
never a 5xx or a dropped connection."""

from __future__ import annotations

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
    st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False),
    st.text(max_size=8),
)
PART = st.fixed_dictionaries(
    {"type": st.sampled_from(["text", "image_url", 3]), "text": st.one_of(st.text(max_size=20), SCALARS)},
    optional={"hypic": st.one_of(SCALARS, st.fixed_dictionaries({"kind": st.one_of(SCALARS, st.just("document"))}))},
)
MESSAGE = st.fixed_dictionaries(
    {
        "role": st.one_of(st.sampled_from(["system", "user", "assistant", "tool", "developer"]), SCALARS),
        "content": st.one_of(st.text(max_size=30), st.lists(PART, max_size=3), SCALARS),
    },
    optional={"tool_calls": st.lists(st.dictionaries(st.text(max_size=5), SCALARS, max_size=2), max_size=2)},
)
BODY = st.fixed_dictionaries(
    {"model": st.one_of(st.just(MODEL), SCALARS), "messages": st.one_of(st.lists(MESSAGE, max_size=3), SCALARS)},
    optional={
        "max_tokens": SCALARS,
        "temperature": SCALARS,
        "top_p": SCALARS,
        "seed": SCALARS,
        "stop": st.one_of(SCALARS, st.lists(st.text(max_size=3), max_size=5)),
        "n": SCALARS,
        "stream": st.booleans(),
        "tools": st.one_of(SCALARS, st.lists(st.dictionaries(st.text(max_size=5), SCALARS, max_size=2), max_size=2)),
        "tool_choice": st.one_of(SCALARS, st.sampled_from(["auto", "none", "required"])),
        "hypic": st.one_of(SCALARS, st.dictionaries(st.sampled_from(["mode", "seam", "x"]), SCALARS, max_size=2)),
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
    response = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    assert response.status_code < 500, response.text
    if response.status_code != 200:
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
