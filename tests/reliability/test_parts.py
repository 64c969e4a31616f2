"""Content parts: a prompt has one question, so a second ``query`` part is a ValueError (a 400 over HTTP) rather
than a question silently dropped; a message of empty text parts is refused as the same empty string given as
plain content is."""

from __future__ import annotations

import httpx
import pytest

from hypic_rag.server import create_app
from hypic_rag.testing.server import serve_in_thread

from .conftest import engine

MODEL = "hypic-default"


def _query(text: str) -> dict:
    return {"type": "text", "text": text, "hypic": {"kind": "query"}}


def _document(text: str) -> dict:
    return {"type": "text", "text": text, "hypic": {"kind": "document"}}


TWO_QUESTIONS = [
    [{"role": "user", "content": [_query("Where does Ana live?"), _query("Where does Bo live?")]}],
    [
        {"role": "user", "content": [_document("Ana lives in Oslo."), _query("Where does Ana live?")]},
        {"role": "assistant", "content": "Oslo."},
        {"role": "user", "content": [_query("Where does Bo live?")]},
    ],
]


@pytest.fixture(scope="module")
def bundled():
    return engine()


@pytest.mark.parametrize("messages", TWO_QUESTIONS)
def test_two_query_parts_are_a_value_error_naming_the_second(bundled, messages):
    with pytest.raises(ValueError, match="query part") as exc:
        bundled.render(messages)
    last = len(messages) - 1
    assert f"message {last} part {len(messages[-1]['content']) - 1}" in str(exc.value)
    with pytest.raises(ValueError, match="query part"):
        bundled.chat(messages, max_new_tokens=1)


def test_one_query_part_beside_documents_is_served(bundled):
    messages = [{"role": "user", "content": [_document("Ana lives in Oslo."), _query("Where does Ana live?")]}]
    assert "<q>Where does Ana live?</q>" in bundled.render(messages).text


def test_an_empty_text_part_renders_as_empty_content_does(bundled):
    for parts in ([{"type": "text", "text": ""}], [{"type": "text", "text": ""}, {"type": "text", "text": ""}]):
        assert (
            bundled.render([{"role": "user", "content": parts}]).text
            == bundled.render([{"role": "user", "content": ""}]).text
        )


@pytest.fixture(scope="module")
def url(bundled):
    with serve_in_thread(create_app(bundled, model_names=[MODEL])) as base:
        yield base


def _post(url, messages):
    return httpx.post(url + "/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 1})


def test_over_http_two_query_parts_are_a_400(url):
    for messages in TWO_QUESTIONS:
        response = _post(url, messages)
        assert response.status_code == 400 and "query part" in response.json()["error"]["message"]


@pytest.mark.parametrize(
    "content",
    [[{"type": "text", "text": ""}], [{"type": "text", "text": " "}, {"type": "text", "text": "\n"}], [_query("")]],
)
def test_over_http_empty_text_parts_get_the_empty_content_400(url, content):
    plain = _post(url, [{"role": "user", "content": ""}])
    parts = _post(url, [{"role": "user", "content": content}])
    assert plain.status_code == parts.status_code == 400
    assert parts.json()["error"]["message"] == plain.json()["error"]["message"]
