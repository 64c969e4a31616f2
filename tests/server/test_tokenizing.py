"""``/tokenize``, ``/detokenize``, ``/version`` and the model list, as clients call them: plain HTTP and the
official ``openai`` client, on one process and through a fleet's ingress."""

from __future__ import annotations

from importlib.metadata import version

import httpx
import pytest

from hypic_rag.eval.data import TOOLS

from .conftest import MODEL

ASK = {
    "model": MODEL,
    "messages": [
        {"role": "system", "content": "Answer from the documents."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Ana Lee lives in Oslo.", "hypic": {"kind": "document"}},
                {"type": "text", "text": "Where does Ana Lee live?"},
            ],
        },
    ],
}


@pytest.mark.fleet
def test_one_model_is_listed_with_its_context_and_its_aliases(server, client, engine):
    listed = client.models.list().data
    assert [m.id for m in listed] == [MODEL]
    entry = listed[0].model_dump()
    assert entry["max_model_len"] == engine.preparer.context and entry["aliases"] == [engine.name]
    assert client.models.retrieve(engine.name).id == MODEL  # an alias names the same model
    assert httpx.get(server + "/version").json() == {"version": version("hypic-rag")}


@pytest.mark.fleet
def test_a_chat_body_counts_the_tokens_its_chat_request_runs(server, client, engine):
    counted = httpx.post(server + "/tokenize", json=ASK).json()
    prepared = engine.prepare_chat(ASK["messages"])
    assert counted["tokens"] == prepared.prompt.ids and counted["count"] == len(prepared.prompt.ids)
    assert counted["max_model_len"] == engine.preparer.context
    answered = client.chat.completions.create(**ASK, max_tokens=2, extra_body={"hypic": {"mode": "full"}})
    assert answered.usage.prompt_tokens == counted["count"]


def test_tools_and_a_forced_call_count_as_the_request_renders_them(server, engine):
    tools = TOOLS[:2]
    plain = httpx.post(server + "/tokenize", json=ASK).json()["tokens"]
    offered = httpx.post(server + "/tokenize", json={**ASK, "tools": tools}).json()["tokens"]
    forced = httpx.post(server + "/tokenize", json={**ASK, "tools": tools, "tool_choice": "required"}).json()
    assert len(offered) > len(plain)
    expected = engine.prepare_chat(ASK["messages"], tools=tools, tool_choice="required").prompt.ids
    assert forced["tokens"] == expected and forced["tokens"][: len(offered)] == offered  # the opening after it


def test_a_prompt_counts_as_a_completion_runs_it_and_detokenizes_back(server, client):
    prompt = "Ana Lee lives in Oslo.\n\nBo Ek lives in Rome.\n\nWhere does Bo Ek live?"
    counted = httpx.post(server + "/tokenize", json={"model": MODEL, "prompt": prompt}).json()
    answered = client.completions.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert answered.usage.prompt_tokens == counted["count"] == len(counted["tokens"])
    back = httpx.post(server + "/detokenize", json={"model": MODEL, "tokens": counted["tokens"]}).json()
    assert back == {"prompt": prompt}


@pytest.mark.parametrize(
    ("path", "body", "status", "message"),
    [
        ("/tokenize", {"model": MODEL}, 400, "give messages"),
        ("/tokenize", {"prompt": "a", "messages": ASK["messages"]}, 400, "one of them"),
        ("/tokenize", {"prompt": ""}, 400, "non-empty string"),
        ("/tokenize", {"prompt": "a", "tools": TOOLS[:1]}, 400, "tools apply to messages only"),
        ("/tokenize", {"model": "gpt-9", "prompt": "a"}, 404, "'gpt-9' is not served here"),
        ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
        ("/tokenize", [1, 2], 400, "must be a JSON object"),
        ("/detokenize", {"tokens": [1, -1]}, 400, "token -1 is outside the vocabulary"),
        ("/detokenize", {"tokens": [1, True]}, 400, "tokens.1"),
        ("/detokenize", {"tokens": [1] * 100_000}, 400, "over the context"),
    ],
)
def test_bad_token_requests_get_a_4xx_naming_the_problem(server, path, body, status, message):
    response = httpx.post(server + path, json=body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]["message"]


def test_a_prompt_past_the_context_is_a_400_that_counts_it(server, engine):
    long = " ".join(["word"] * (engine.preparer.context + 10))
    response = httpx.post(server + "/tokenize", json={"prompt": long})
    assert response.status_code == 400 and "past the model's context" in response.json()["error"]["message"]
