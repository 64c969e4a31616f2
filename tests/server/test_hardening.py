"""What a hostile or careless client sends, over HTTP on the bundled model: schemas that once took the engine
thread for hours, roots that are not objects, tools that do not fit, bodies that are not JSON. Each answer is a
valid one or a 4xx naming the field, before any token is decoded, and the server keeps serving the others."""

from __future__ import annotations

import json
import threading
import time

import httpx
import jsonschema
import pytest

from hypic_rag.eval.data import make

from .conftest import MODEL

QUESTION = [{"role": "user", "content": "Where does Fastos Taisbre live?"}]


def _post(server: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(server + "/v1/chat/completions", json={"model": MODEL, **body}, timeout=120, **kwargs)


def _nested(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


def _canary(server: str) -> float:
    started = time.perf_counter()
    response = _post(server, {"messages": QUESTION, "max_tokens": 24})
    assert response.status_code == 200
    return time.perf_counter() - started


@pytest.mark.parametrize("where", ["response_format", "tools"])
def test_a_29_level_schema_answers_and_the_others_are_served(server, where):
    """2^29 steps of normalisation once ran on the engine thread for this 1.7 KB schema; now a 400 or a valid
    answer comes back, and a request beside it is served in its own time (the bounds are loose, for a machine
    loaded by other work: the stall they guard against was an hour)."""
    schema = _nested(29)
    assert len(json.dumps(schema, separators=(",", ":"))) < 1800
    if where == "response_format":
        ask = {"response_format": {"type": "json_schema", "json_schema": {"name": "deep", "schema": schema}}}
    else:
        tool = {"type": "function", "function": {"name": "deep", "parameters": schema}}
        ask = {"tools": [tool], "tool_choice": "required"}
    alone = min(_canary(server) for _ in range(2))
    result: dict = {}

    def deep() -> None:
        started = time.perf_counter()
        result["response"] = _post(server, {"messages": QUESTION, "max_tokens": 64, **ask})
        result["took"] = time.perf_counter() - started

    thread = threading.Thread(target=deep)
    thread.start()
    beside = _canary(server)
    thread.join(120)
    response = result["response"]
    assert response.status_code in (200, 400), response.text
    if response.status_code == 200 and response.json()["choices"][0]["finish_reason"] != "length":
        message = response.json()["choices"][0]["message"]
        value = json.loads(message["content"]) if where == "response_format" else None
        if value is None:
            value = json.loads(message["tool_calls"][0]["function"]["arguments"])
        jsonschema.validate(value, schema)
    assert result["took"] < 100 and beside < 20 * alone + 30, (result["took"], beside, alone)


def test_a_200k_value_enum_is_refused_and_health_keeps_answering(server):
    enum = {"enum": [f"v{i}" for i in range(200_000)]}
    body = {"messages": QUESTION, "response_format": {"type": "json_schema", "json_schema": {"schema": enum}}}
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(response=_post(server, body)))
    thread.start()
    while thread.is_alive():
        assert httpx.get(server + "/health", timeout=30).status_code == 200
    thread.join()
    error = result["response"].json()["error"]
    assert result["response"].status_code == 400 and "more than 10000 values" in error["message"], error
    assert error["param"] == "response_format"


SELF_REFERENCE = {
    "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
    "$ref": "#/$defs/n",
}


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": SELF_REFERENCE}}}, "response_format"),
        ({"guided_choice": [f"c{i}" for i in range(10_000)]}, "response_format"),
        ({"response_format": {"type": "regex", "regex": "a{1000}{1000}"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"schema": False}}}, "response_format"),
        (
            {
                "tools": [{"type": "function", "function": {"name": "f", "parameters": SELF_REFERENCE}}],
                "tool_choice": "required",
            },
            "tools.0.function.parameters",
        ),
    ],
)
def test_what_the_grammar_cannot_hold_is_a_400_before_decoding(server, extra, param):
    """Refused while the request is prepared (no token decoded, so a streamed one is a 400 too), in words a
    client can read: no grammar listing, parser state or token ids."""
    for stream in (False, True):
        response = _post(server, {"messages": QUESTION, "max_tokens": 8, "stream": stream, **extra})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] == param, error
        assert not any(w in error["message"] for w in ("<state>", "%llguidance", "broke the output", "\n")), error


ROOTS = {
    "string": {"type": "string"},
    "integer": {"type": "integer"},
    "boolean": {"type": "boolean"},
    "enum": {"enum": ["red", "green", "blue"]},
    "oneOf of constants": {"oneOf": [{"const": "yes"}, {"const": "no"}, {"const": 3}]},
    "true": True,
}


def _streamed_content(response: httpx.Response) -> tuple[str, str | None, list]:
    content, finish, calls = "", None, []
    for line in response.iter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        choice = json.loads(line.removeprefix("data: "))["choices"][0]
        content += choice["delta"].get("content") or ""
        calls += choice["delta"].get("tool_calls") or []
        finish = choice["finish_reason"] or finish
    return content, finish, calls


@pytest.mark.parametrize("root", list(ROOTS))
def test_a_root_that_is_not_an_object_answers_exactly_one_valid_value(server, root):
    """The bundled model writes JSON as a call's arguments; a root that is not an object is held as one argument
    and given back alone: ten answers of ten parse and validate, streamed and not, and the wrapper never leaks."""
    schema = ROOTS[root]
    check = {} if schema is True else schema
    for n, example in enumerate(make("single_doc", 10, 11)):
        spec = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        body = {"messages": example.messages, "max_tokens": 64, "response_format": spec}
        if n % 2:
            with httpx.stream(
                "POST", server + "/v1/chat/completions", json={"model": MODEL, **body, "stream": True}, timeout=120
            ) as response:
                assert response.status_code == 200
                content, finish, calls = _streamed_content(response)
        else:
            choice = _post(server, body).json()["choices"][0]
            content, finish, calls = (
                choice["message"]["content"],
                choice["finish_reason"],
                choice["message"].get("tool_calls"),
            )
        assert finish == "stop" and not calls, (content, finish)
        jsonschema.validate(json.loads(content), check)


def test_the_openai_client_gets_the_bare_value_of_a_root_that_is_not_an_object(client):
    """As a user reaches it: the OpenAI SDK's ``response_format``, its content parsed as the integer asked for."""
    schema = {"type": "integer"}
    out = client.chat.completions.create(
        model=MODEL,
        messages=make("single_doc", 1, 11)[0].messages,
        max_tokens=32,
        response_format={"type": "json_schema", "json_schema": {"name": "age", "schema": schema}},
    )
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    jsonschema.validate(json.loads(choice.message.content), schema)


@pytest.mark.fleet
def test_an_array_root_never_leaks_the_wrapper(server):
    """Arrays too are held as one argument; the bundled model may repeat items until ``max_tokens`` (no grammar
    ends that), and what it finishes is exactly one valid array."""
    schema = {"type": "array", "items": {"type": "integer"}}
    finished = 0
    for example in make("single_doc", 10, 11):
        spec = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
        choice = _post(server, {"messages": example.messages, "max_tokens": 64, "response_format": spec}).json()
        choice = choice["choices"][0]
        content = choice["message"]["content"]
        assert content.startswith("[") and '"name"' not in content and "arguments" not in content, content
        if choice["finish_reason"] == "stop":
            jsonschema.validate(json.loads(content), schema)
            finished += 1
    assert finished >= 5


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },  # no additionalProperties: open, as JSON Schema reads it
    },
}
EMPLOYEE = {
    "type": "function",
    "function": {
        "name": "lookup_employee",
        "description": "An employee's record",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
}


def test_a_named_choice_that_does_not_fit_still_gives_a_valid_call(server):
    questions = [
        "Where does Dispen Lomsuth live?",
        "How old is Bo Ek?",
        "Which company does Fastos Taisbre work for?",
        "What is the job of Dirda Fountith?",
        "Who builds boats?",
    ]
    for question in questions:
        choice = _post(
            server,
            {
                "messages": [{"role": "user", "content": question}],
                "tools": [WEATHER, EMPLOYEE],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "max_tokens": 200,
            },
        ).json()["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        [call] = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER["function"]["parameters"])


@pytest.mark.fleet
def test_no_tool_offered_no_call_streamed_or_not(server):
    """After a turn that called a tool, the bundled model begins another call even with none offered now; the
    first token may not open one, so neither the answer nor its stream holds call syntax."""
    examples = make("tool_call", 30, 9)
    for i in (10, 18):
        answer = json.loads(examples[i].answers[0])
        call = {"id": "c1", "type": "function", "function": {"name": answer["name"], "arguments": "{}"}}
        messages = [
            *examples[i].messages,
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "done"},
            examples[i + 1].messages[-1],
        ]
        choice = _post(server, {"messages": messages, "max_tokens": 40}).json()["choices"][0]
        assert choice["finish_reason"] != "tool_calls" and not choice["message"].get("tool_calls")
        assert not choice["message"]["content"].lstrip().startswith("{"), choice
        body = {"model": MODEL, "messages": messages, "max_tokens": 40, "stream": True}
        with httpx.stream("POST", server + "/v1/chat/completions", json=body, timeout=120) as response:
            content, finish, calls = _streamed_content(response)
        assert finish != "tool_calls" and not calls and not content.lstrip().startswith("{"), content


@pytest.mark.fleet
def test_small_misuses_are_each_a_clear_4xx(server):
    def error_of(response: httpx.Response, status: int) -> dict:
        assert response.status_code == status, response.text
        return response.json()["error"]

    tool = {"type": "function", "function": {"name": "f", "parameters": "notadict"}}
    error = error_of(_post(server, {"messages": QUESTION, "tools": [tool]}), 400)
    assert error["param"] == "tools.0.function.parameters"
    error = error_of(httpx.post(server + "/v1/completions", json={"model": MODEL, "prompt": [True, False]}), 400)
    assert error["param"].startswith("prompt")  # true is not token 1
    error = error_of(httpx.post(server + "/v1/completions", json={"model": MODEL, "prompt": ["a"] * 1000}), 400)
    assert error["param"] == "prompt" and "up to" in error["message"]
    regex = {"type": "regex", "regex": "a{1000}{1000}"}
    completion = {"model": MODEL, "prompt": "Where?", "response_format": regex, "stream": True}
    error = error_of(httpx.post(server + "/v1/completions", json=completion, timeout=60), 400)
    assert error["param"] == "response_format" and "too large or too complex" in error["message"]
    raw = json.dumps({"model": MODEL, "messages": QUESTION})
    for headers in ({"content-type": "text/plain"}, {"content-type": "application/x-www-form-urlencoded"}, {}):
        response = httpx.post(server + "/v1/chat/completions", content=raw, headers=headers)
        assert error_of(response, 415)["code"] == "unsupported_media_type"
    error = error_of(_post(server, {"messages": QUESTION, "n": 0}), 400)
    assert error["param"] == "n" and "n must be 1" in error["message"]
    assert _post(server, {"messages": QUESTION, "n": 1, "max_tokens": 4}).status_code == 200


@pytest.mark.fleet
def test_ignored_field_names_of_any_characters_reach_the_header_encoded(server):
    """An ignored field named with CR/LF, non-latin-1 characters or a comma is named in the header percent-encoded
    (and as sent in the body); a thousand of them are cut to a bounded header."""
    odd = ["evil\r\nX-Injected: 1", "naïve", "名前", "a,b"]
    response = _post(server, {"messages": QUESTION, "max_tokens": 2, **{name: 1 for name in odd}})
    assert response.status_code == 200 and "x-injected" not in response.headers
    assert response.json()["hypic"]["ignored_fields"] == sorted(odd)
    assert (
        response.headers["x-hypic-ignored-fields"] == "a%2Cb, evil%0D%0AX-Injected: 1, na%C3%AFve, %E5%90%8D%E5%89%8D"
    )
    many = {f"field_{i:04d}": 1 for i in range(1000)}
    response = _post(server, {"messages": QUESTION, "max_tokens": 2, **many})
    header = response.headers["x-hypic-ignored-fields"]
    assert response.status_code == 200 and len(header) <= 1024 and header.endswith(" more)")
    assert len(response.json()["hypic"]["ignored_fields"]) == 1000


@pytest.mark.fleet
def test_a_body_nested_5000_deep_is_the_same_400_from_either_front_door(server):
    """The fleet's ingress parses a body for its keys with the server's own limits (off its event loop), so a
    deep body is the replica's 400, never an ingress's 500."""
    deep = b'{"model": "%s", "messages": [{"role": "user", "content": %s}]}' % (
        MODEL.encode(),
        b"[" * 5000 + b"]" * 5000,
    )
    response = httpx.post(
        server + "/v1/chat/completions", content=deep, headers={"content-type": "application/json"}, timeout=60
    )
    assert response.status_code == 400 and "nested more than 64 levels" in response.json()["error"]["message"]


def _streamed(server: str, body: dict) -> tuple[str, list[dict], str | None]:
    """The content, tool-call deltas and finish reason of a streamed answer."""
    content, calls, finish = "", [], None
    with httpx.stream("POST", server + "/v1/chat/completions", json={"model": MODEL, **body, "stream": True}) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            content += choice["delta"].get("content") or ""
            calls += choice["delta"].get("tool_calls") or []
            finish = choice.get("finish_reason") or finish
    return content, calls, finish


@pytest.mark.fleet
@pytest.mark.parametrize("pattern", [" [a-z]+", r"\s+", "[a-z]+ "])
def test_a_regex_answer_is_returned_and_streamed_exactly_as_it_matched(server, pattern):
    import re

    body = {"messages": QUESTION, "max_tokens": 8, "guided_regex": pattern}
    answer = _post(server, body).json()["choices"][0]["message"]["content"]
    assert re.fullmatch(pattern, answer), repr(answer)
    assert _streamed(server, body)[0] == answer


@pytest.mark.fleet
def test_the_text_before_a_stop_string_keeps_its_space(server):
    whole = _post(server, {"messages": QUESTION, "max_tokens": 16}).json()["choices"][0]["message"]["content"]
    word = next(w for w in whole.split()[1:] if f" {w}" in whole)
    body = {"messages": QUESTION, "max_tokens": 16, "stop": [word]}
    cut = _post(server, body).json()["choices"][0]["message"]["content"]
    assert cut == whole[: whole.index(f" {word}") + 1] and cut.endswith(" ")
    assert _streamed(server, body)[0] == cut


@pytest.mark.fleet
def test_a_call_cut_by_max_tokens_comes_back_as_the_partial_call_never_as_content(server):
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
        {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
    ]
    named = {"type": "function", "function": {"name": "get_time"}}
    body = {"messages": QUESTION, "max_tokens": 3, "tools": tools, "tool_choice": named}
    choice = _post(server, body).json()["choices"][0]
    assert choice["finish_reason"] == "length" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "get_time" and isinstance(call["function"]["arguments"], str)
    content, calls, finish = _streamed(server, body)
    assert content == "" and finish == "length" and calls[0]["function"]["name"] == "get_time"
    auto = _post(server, {**body, "tool_choice": "auto"}).json()["choices"][0]
    assert not (auto["message"]["content"] or "").startswith('{"arguments')  # the wrapper is never content
