"""The OpenAI-compatible server, driven over real HTTP on loopback by the official ``openai`` client."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from hypic_rag import Engine
from hypic_rag.eval.data import TOOLS
from hypic_rag.server import create_app
from hypic_rag.testing.server import serve_in_thread

from .conftest import MODEL

DOCS = [
    "Stithgo Dithgaith lives in Kothvenville and works as a pilot.",
    "Ana Lee lives in Oslo and works as a baker.",
    "Bo Ek lives in Rome and works as a nurse.",
]


def _parts(docs, question):
    return [
        *({"type": "text", "text": d, "hypic": {"kind": "document"}} for d in docs),
        {"type": "text", "text": question},
    ]


def _ask(docs=DOCS, question="Where does Ana Lee live?"):
    return [{"role": "user", "content": _parts(docs, question)}]


@pytest.mark.fleet
def test_models_health_and_metrics(server, client):
    assert [m.id for m in client.models.list().data][0] == MODEL
    health = httpx.get(server + "/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL
    client.chat.completions.create(model=MODEL, messages=_ask(), max_tokens=2)
    deadline = time.monotonic() + 60  # a fleet's replicas report their metrics every second; a loaded machine is slow
    while 'route="/v1/chat/completions",status="200"' not in (text := httpx.get(server + "/metrics").text):
        assert time.monotonic() < deadline, text
        time.sleep(0.2)
    for name in (
        'hypic_requests_total{route="/v1/chat/completions",status="200"}',
        'hypic_ttft_seconds_bucket{le="0.25",mode="hypic"}',
        'hypic_request_seconds_count{mode="hypic"}',
        'hypic_segment_hits_total{mode="hypic"}',
        'hypic_segment_misses_total{mode="hypic"}',
        'hypic_recomputed_tokens_total{mode="hypic"}',
        'hypic_cached_tokens_total{mode="hypic"}',
        'hypic_cache_bytes{tier="memory"}',
        'hypic_cache_entries{tier="prefix"}',
        'hypic_cache_admissions_refused_total{reason="frequency"}',
        "hypic_cache_disk_admissions_refused_total 0.0",
        'hypic_cache_evictions_total{reason="capacity"}',
        "hypic_cache_hit_ratio{kind=",
        "hypic_segment_lookups_total{kind=",
        "hypic_queue_depth ",
        "hypic_active_requests ",
    ):
        assert name in text, name


@pytest.mark.fleet
def test_plain_completion_is_the_engines_answer(client, reference):
    out = client.chat.completions.create(model=MODEL, messages=_ask(), max_tokens=16, temperature=0)
    expected = reference.chat(_ask(), max_new_tokens=16, temperature=0.0)
    choice = out.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.finish_reason == ("stop" if expected.finish_reason == "stop" else "length")
    assert out.usage.prompt_tokens == expected.stats["prompt_tokens"]
    assert out.usage.completion_tokens == len(expected.token_ids)
    assert out.model_extra["hypic"]["mode"] == "hypic"


@pytest.mark.fleet
def test_streaming_gives_the_same_text_in_openai_chunks(client):
    messages = _ask(question="What does Bo Ek do?")
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16)
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=16, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.fleet
def test_tool_calls_come_back_parsed_plain_and_streamed(client):
    messages = [{"role": "user", "content": "Look up Stithgo Dithgaith in the employee records."}]
    out = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=48)
    call = out.choices[0].message.tool_calls[0]
    assert out.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "lookup_employee"
    assert json.loads(call.function.arguments) == {"name": "Stithgo Dithgaith"}
    streamed = list(
        client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=48, stream=True)
    )
    deltas = [tc for c in streamed if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    # among several tools, the bundled model's call is named once a key only one tool may hold is written
    assert deltas[0].function.name == call.function.name and all(d.function.name is None for d in deltas[1:])
    assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
    assert deltas[0].id.startswith("call_") and deltas[0].id != call.id  # every request's calls get fresh ids
    # The call goes back as the assistant's turn, its arguments a JSON string as OpenAI clients send them.
    follow = messages + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": json.dumps({"name": "Stithgo Dithgaith", "city": "Kothvenville"}),
        },
    ]
    nxt = client.chat.completions.create(model=MODEL, messages=follow, tools=TOOLS, max_tokens=48)
    assert nxt.choices[0].message.content or nxt.choices[0].message.tool_calls


@pytest.mark.fleet
def test_a_streamed_calls_arguments_arrive_in_fragments_that_join_to_the_call(client):
    messages = [{"role": "user", "content": "Look up Stithgo Dithgaith in the employee records."}]
    tool = next(t for t in TOOLS if t["function"]["name"] == "lookup_employee")
    ask = {"model": MODEL, "messages": messages, "tools": [tool], "max_tokens": 48}
    whole = client.chat.completions.create(**ask).choices[0].message.tool_calls[0]
    chunks = list(client.chat.completions.create(**ask, stream=True))
    deltas = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or ()]
    assert deltas[0].id and deltas[0].function.name == "lookup_employee"
    assert all(d.index == 0 and d.id is None and d.function.name is None for d in deltas[1:])
    fragments = [d.function.arguments for d in deltas if d.function.arguments]
    assert len(fragments) > 3 and "".join(fragments) == whole.function.arguments, fragments
    assert json.loads(whole.function.arguments) == {"name": "Stithgo Dithgaith"}
    with client.chat.completions.stream(**ask) as stream:  # the openai client's own accumulation
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls"
    assert final.message.tool_calls[0].function.arguments == whole.function.arguments


@pytest.mark.fleet
def test_a_required_tool_choice_makes_the_answer_a_call(client):
    messages = [{"role": "user", "content": "Look up Ana Lee in the employee records."}]
    out = client.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, tool_choice="required", max_tokens=48
    )
    assert out.choices[0].message.tool_calls and out.choices[0].finish_reason == "tool_calls"
    none = client.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert not none.choices[0].message.tool_calls


@pytest.mark.fleet
def test_reordered_documents_are_cached_tokens_on_the_second_request(client):
    docs = [d.replace("works", "has worked") for d in DOCS]  # fresh documents: nothing cached yet
    first = client.chat.completions.create(model=MODEL, messages=_ask(docs), max_tokens=4)
    second = client.chat.completions.create(model=MODEL, messages=_ask(docs[::-1]), max_tokens=4)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    stats = second.model_extra["hypic"]
    assert stats["hit_segments"] == 3 and stats["miss_segments"] == 0
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == stats["cached_tokens"] and 0 < cached < second.usage.prompt_tokens
    prefix = client.chat.completions.create(
        model=MODEL, messages=_ask(docs[::-1]), max_tokens=4, extra_body={"hypic": {"mode": "full"}}
    )
    assert prefix.usage.prompt_tokens_details.cached_tokens == 0 and prefix.model_extra["hypic"]["mode"] == "full"


@pytest.mark.fleet
def test_a_flat_context_string_is_cut_at_its_paragraphs_and_found_again_reordered(client):
    """No parts, no kinds: one user string with a "Context:" header, as a client writes it. The bundled model's
    format cuts it as ``/v1/completions`` cuts a flat prompt, so a reordered repeat is cached tokens."""
    docs = [d.replace("works", "is employed") for d in DOCS]  # fresh documents: nothing cached yet

    def flat(order):
        text = "Context:\n" + "\n\n".join(order) + "\n\nQuestion: where does Bo Ek live?"
        return [{"role": "user", "content": text}]

    first = client.chat.completions.create(model=MODEL, messages=flat(docs), max_tokens=4)
    second = client.chat.completions.create(model=MODEL, messages=flat(docs[::-1]), max_tokens=4)
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert second.model_extra["hypic"]["hit_segments"] == len(docs)
    assert 0 < second.usage.prompt_tokens_details.cached_tokens < second.usage.prompt_tokens
    whole = client.chat.completions.create(
        model=MODEL, messages=flat(docs[::-1]), max_tokens=4, extra_body={"hypic": {"segmentation": "none"}}
    )
    assert whole.usage.prompt_tokens_details.cached_tokens == 0


def test_sixteen_concurrent_requests_answer_as_one_at_a_time(server, client, engine, monkeypatch):
    people = ["Ana Lee", "Bo Ek", "Stithgo Dithgaith", "Cy Ru"]
    requests = [
        (_ask(DOCS[i % 3 :] + DOCS[: i % 3], f"Where does {people[i % 4]} live? ({i})"), {"seed": i}) for i in range(16)
    ]

    def ask(req):
        messages, extra = req
        out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=12, **extra)
        return out.choices[0].message.content, out.usage.completion_tokens

    alone = [ask(r) for r in requests]
    # Hold the engine until all sixteen are in, so that they are admitted together and decoded in turn.
    gate = _Gate(engine)
    monkeypatch.setattr(engine, "begin", gate)
    with ThreadPoolExecutor(16) as pool:
        futures = [pool.submit(ask, r) for r in requests]
        assert gate.entered.wait(30)
        deadline = time.monotonic() + 30
        while httpx.get(server + "/health").json()["queue_depth"] < 15:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        gate.release.set()
        together = [f.result() for f in futures]
    assert together == alone


BAD = [
    ({"model": MODEL, "messages": []}, 400, "messages"),
    ({"model": MODEL, "messages": [{"role": "narrator", "content": "hi"}]}, 400, "role"),
    ({"model": MODEL, "messages": [{"role": "user", "content": ""}]}, 400, "needs content"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "temperature": 7}, 400, "temperature"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_p": 0}, 400, "top_p"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}, 400, "max_tokens"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "n": 2}, 400, "n > 1"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "tool_choice": "required"}, 400, "needs tools"),
    ({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "hypic": {"mode": "fast"}}, 400, "hypic.mode"),
    ({"model": MODEL, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "only text parts"),
    ({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404, "not served here"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
    ([1, 2], 400, "JSON object"),
]


@pytest.mark.fleet
@pytest.mark.parametrize(("body", "status", "message"), BAD)
def test_bad_requests_get_a_4xx_with_the_openai_error_body(server, body, status, message):
    response = httpx.post(server + "/v1/chat/completions", json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"] and set(error) == {"message", "type", "param", "code"}


@pytest.mark.fleet
def test_malformed_oversized_and_too_long_requests(server, client, engine):
    response = httpx.post(
        server + "/v1/chat/completions", content=b'{"model": ', headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
    huge = b'{"model": "x", "pad": "' + b"a" * (9 << 20) + b'"}'
    response = httpx.post(server + "/v1/chat/completions", content=huge, headers={"content-type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    long = "Ana Lee lives in Oslo. " * (engine.config.max_position_embeddings // 4)
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long}], max_tokens=2)
    assert caught.value.code == "context_length_exceeded"
    with pytest.raises(openai.BadRequestError):  # the streamed request's status is decided before the stream
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": long}], stream=True)
    assert httpx.get(server + "/v2/nothing").json()["error"]["type"] == "not_found_error"


class _Gate:
    """Holds the engine's next prompt until released, so a test can fill the queue behind it."""

    def __init__(self, engine):
        self.engine, self.entered, self.release = engine, threading.Event(), threading.Event()
        self.begin = engine.begin

    def __call__(self, *args, **kwargs):
        self.entered.set()
        assert self.release.wait(60)
        return self.begin(*args, **kwargs)


def test_a_full_queue_answers_429_with_retry_after(engine, monkeypatch):
    gate = _Gate(engine)
    monkeypatch.setattr(engine, "begin", gate)
    app = create_app(engine, model_names=[MODEL], max_queue=1, max_active=1)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Where does Ana Lee live?"}], "max_tokens": 4}
    with serve_in_thread(app) as url, ThreadPoolExecutor(2) as pool:
        first = pool.submit(httpx.post, url + "/v1/chat/completions", json=body, timeout=60)
        assert gate.entered.wait(30)  # the first request holds the engine
        second = pool.submit(httpx.post, url + "/v1/chat/completions", json=body, timeout=60)
        deadline = time.monotonic() + 30
        while httpx.get(url + "/health").json()["queue_depth"] < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        third = httpx.post(url + "/v1/chat/completions", json=body)
        assert third.status_code == 429 and int(third.headers["retry-after"]) >= 1
        assert third.json()["error"]["type"] == "rate_limit_error"
        gate.release.set()
        assert first.result().status_code == 200 and second.result().status_code == 200
        assert 'route="/v1/chat/completions",status="429"' in httpx.get(url + "/metrics").text


def test_a_client_that_leaves_cancels_its_generation(engine, monkeypatch):
    steps = threading.Semaphore(0)
    decode_batch = engine.model.decode_batch

    def slow(tokens, states):  # each decode step waits for the test, so the request is mid-answer when left
        steps.acquire(timeout=30)
        return decode_batch(tokens, states)

    monkeypatch.setattr(engine.model, "decode_batch", slow)
    app = create_app(engine, model_names=[MODEL])
    body = {"model": MODEL, "messages": _ask(), "max_tokens": 200, "stream": True}
    with serve_in_thread(app) as url:
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=30) as response:
            steps.release(2)
            assert next(response.iter_lines()).startswith("data: ")
        # The connection is closed; once the server has seen it go, the next step finds the request cancelled.
        deadline = time.monotonic() + 30
        while not all(job.request.cancel_event.is_set() for job in app.state.worker.active):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        for _ in range(20):
            steps.release()
        while 'hypic_request_seconds_count{mode="hypic"} 1.0' not in (text := httpx.get(url + "/metrics").text):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert 'hypic_finished_requests_total{reason="cancelled"} 1.0' in text
        generated = float(text.split('hypic_generated_tokens_total{mode="hypic"} ')[1].split()[0])
        assert generated < 20 and app.state.worker.active == []


@pytest.mark.fleet
def test_stop_strings_cut_plain_and_streamed_answers(client):
    messages = _ask(question="What does Bo Ek do?")
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16).choices[0].message.content
    assert len(whole) > 3, whole
    stop = whole[2:4]
    cut = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, stop=stop)
    assert cut.choices[0].message.content == whole[: whole.find(stop)].strip()
    assert cut.choices[0].finish_reason == "stop"
    chunks = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, stop=[stop], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == cut.choices[0].message.content


@pytest.mark.fleet
def test_cache_control_marks_a_part_as_a_document_and_the_seam_is_the_bodys(client):
    docs = [d.replace("lives", "has lived") for d in DOCS]

    def marked(order):
        parts = [{"type": "text", "text": docs[i], "cache_control": {"type": "ephemeral"}} for i in order]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": "Where does Bo Ek live?"}]}]

    seam = {"hypic": {"seam": 4}}  # a remainder is recorded per seam width: both requests use this one
    client.chat.completions.create(model=MODEL, messages=marked([0, 1, 2]), max_tokens=2, extra_body=seam)
    again = client.chat.completions.create(model=MODEL, messages=marked([2, 0, 1]), max_tokens=2, extra_body=seam)
    stats = again.model_extra["hypic"]
    assert stats["hit_segments"] == 3 and stats["seam"] == 4


def test_an_unreachable_cache_tier_is_health_degraded_and_a_metric(tmp_path):
    """The server keeps answering without the shared tier; /health says degraded and why, /metrics has it down."""
    from hypic_rag.testing.server import free_port

    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    engine = Engine.from_pretrained(cache_url=url)
    with serve_in_thread(create_app(engine, model_names=[MODEL])) as base:
        health = httpx.get(base + "/health", timeout=30).json()
        assert health["status"] == "degraded" and "Connection" in health["degraded"]["remote_tier"]
        assert 'hypic_cache_tier_up{tier="remote"} 0.0' in httpx.get(base + "/metrics", timeout=30).text
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Where does Ana live?"}], "max_tokens": 2}
        assert httpx.post(base + "/v1/chat/completions", json=body, timeout=120).status_code == 200


@pytest.mark.fleet
def test_a_conversations_next_turn_restores_the_state_its_last_turn_kept(client):
    """Through the official client, as a chat UI sends a conversation: each turn repeats the history, and the
    server restores the state the last turn kept instead of composing the history again."""
    docs = [d.replace("works", "is working") for d in DOCS]  # fresh documents: nothing cached or kept yet
    messages = [{"role": "system", "content": "\n\n".join(docs)}]
    turns = []
    for question in ("Where does Ana Lee live?", "Where does Bo Ek live?", "What does Ana Lee do?"):
        messages.append({"role": "user", "content": question})
        out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0)
        messages.append({"role": "assistant", "content": out.choices[0].message.content or ""})
        turns.append(out)
    first, second, third = (t.usage for t in turns)
    assert first.prompt_tokens_details.model_extra["prefix_tokens"] == 0
    for before, now, out in ((first, second, turns[1]), (second, third, turns[2])):
        restored = now.prompt_tokens_details.model_extra["prefix_tokens"]
        assert (
            restored == out.model_extra["hypic"]["prefix_tokens"]
            and 0 < restored <= now.prompt_tokens_details.cached_tokens
        )
        # it reaches past all the last turn had cached, up to where its question began
        assert before.prompt_tokens_details.cached_tokens < restored < before.prompt_tokens
