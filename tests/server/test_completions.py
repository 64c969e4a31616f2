"""``POST /v1/completions`` with the openai client: a prompt string or a list, token ids, streaming, usage with
cached tokens on a reordered repeat, legacy log-probabilities; and ``GET /v1/models/{id}``."""

from __future__ import annotations

import httpx
import openai
import pytest

from hypic_rag.server.completions import prompt_segments

from .conftest import MODEL

DOCS = [
    "Stithgo Dithgaith lives in Kothvenville and works as a pilot.",
    "Ana Lee lives in Oslo and works as a baker.",
    "Bo Ek lives in Rome and works as a nurse.",
]


def _prompt(docs: list[str]) -> str:
    return "Context:\n" + "\n\n".join(docs) + "\n\nQuestion: where does Bo Ek live?\nAnswer:"


def test_a_flat_prompt_is_cut_at_its_paragraphs():
    segments, query = prompt_segments(_prompt(DOCS))
    assert [s.text for s in segments if s.cache] == DOCS
    assert "".join(s.text for s in segments) + query.text == _prompt(DOCS)
    assert query.text == "Question: where does Bo Ek live?\nAnswer:"


@pytest.mark.fleet
def test_completions_answer_as_generate_does(client, reference):
    prompt = _prompt(DOCS)
    out = client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    segments, query = prompt_segments(prompt)
    expected = reference.generate(segments, query, max_new_tokens=8)
    assert out.choices[0].text == expected.text and out.object == "text_completion"
    assert out.usage.completion_tokens == len(expected.token_ids)
    streamed = list(client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, stream=True))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == out.choices[0].text
    assert streamed[-1].choices[0].finish_reason == out.choices[0].finish_reason


@pytest.mark.fleet
def test_a_reordered_repeat_is_cached_tokens(client):
    docs = [d.replace("lives", "has lived") for d in DOCS]  # fresh documents
    first = client.completions.create(model=MODEL, prompt=_prompt(docs), max_tokens=2)
    second = client.completions.create(model=MODEL, prompt=_prompt(docs[::-1]), max_tokens=2)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens


@pytest.mark.fleet
def test_a_list_of_prompts_and_token_ids(client, engine):
    prompts = [_prompt(DOCS), _prompt(DOCS[:2])]
    out = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4)
    assert [c.index for c in out.choices] == [0, 1]
    singles = [client.completions.create(model=MODEL, prompt=p, max_tokens=4).choices[0].text for p in prompts]
    assert [c.text for c in out.choices] == singles
    ids = engine.encode("Question: where does Bo Ek live?")
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=4)
    assert by_ids.usage.prompt_tokens == len(ids)
    streamed = list(client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, stream=True))
    texts = ["".join(c.choices[0].text for c in streamed if c.choices and c.choices[0].index == i) for i in (0, 1)]
    assert texts == singles


@pytest.mark.fleet
def test_legacy_logprobs_usage_chunk_and_errors(client, server):
    out = client.completions.create(model=MODEL, prompt=_prompt(DOCS), max_tokens=4, logprobs=2)
    lp = out.choices[0].logprobs
    assert "".join(lp.tokens) == out.choices[0].text and len(lp.token_logprobs) == len(lp.tokens)
    assert all(len(top) <= 2 for top in lp.top_logprobs) and lp.text_offset[0] == 0
    stream = client.completions.create(
        model=MODEL, prompt=_prompt(DOCS), max_tokens=2, stream=True, stream_options={"include_usage": True}
    )
    assert list(stream)[-1].usage.completion_tokens >= 1
    for bad in ({"prompt": ""}, {"prompt": []}, {"prompt": "hi", "echo": True}, {"prompt": "hi", "suffix": "x"}):
        response = httpx.post(server + "/v1/completions", json={"model": MODEL, "max_tokens": 2, **bad})
        assert response.status_code == 400, bad
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-3.5-turbo-instruct", prompt="hi", max_tokens=2)


@pytest.mark.fleet
def test_a_model_by_its_id(client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")
