"""``--api-key`` (Bearer tokens on every /v1 route, /health and /metrics open) and ``--allowed-origins`` (CORS)."""

from __future__ import annotations

import httpx
import openai
import pytest

from hypic_rag.server import create_app
from hypic_rag.testing.server import serve_in_thread

from .conftest import MODEL, fleet

KEY = "sk-test-0123456789"
ORIGIN = "http://localhost:5173"


@pytest.fixture(scope="module", params=["process", pytest.param("fleet", marks=pytest.mark.ray)])
def guarded(request) -> str:
    """The bundled model behind ``--api-key`` and ``--allowed-origins``: one process, or a fleet."""
    if request.param == "fleet":
        yield from fleet(request.getfixturevalue("proxy"), "guarded", api_key=KEY, allowed_origins=[ORIGIN])
        return
    app = create_app(request.getfixturevalue("engine"), model_names=[MODEL], api_key=KEY, allowed_origins=[ORIGIN])
    with serve_in_thread(app) as url:
        yield url


def test_the_key_guards_every_v1_route(guarded):
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "Where does Bo Ek live?"}], "max_tokens": 2}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY}, {"Authorization": "Basic " + KEY}):
        for method, path, body in (("post", "/v1/chat/completions", ask), ("get", "/v1/models", None)):
            response = httpx.request(method, guarded + path, json=body, headers=headers)
            assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(guarded + "/health").status_code == 200
    assert httpx.get(guarded + "/metrics").status_code == 200
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
