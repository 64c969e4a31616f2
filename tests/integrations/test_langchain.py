"""ChatHypic with the real langchain-core, through ``Engine.chat``: message mapping (on the bundled model the
segments are the ones its prompt format was trained on), an LCEL RAG chain on the bundled model (it answers
questions about the bundled world from the retrieved documents, its answers equal the engine's own, reordered
documents hit), the retriever wrapper for unchanged chains, a plain chain on a Qwen-style checkpoint whose
reordered documents hit through ``segmentation="auto"``, streaming, tool calls, structured output, options, and
langchain-tests' unit suite."""

from __future__ import annotations

import json
from typing import Annotated, Literal

import jsonschema
import pytest
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, ChatMessage, FunctionMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_tests.unit_tests import ChatModelUnitTests
from pydantic import BaseModel, Field
from typing_extensions import TypedDict

from hypic_rag import Engine
from hypic_rag.chat.formats import BUNDLED
from hypic_rag.eval.data import TOOLS, corpus
from hypic_rag.integrations import prompting
from hypic_rag.integrations.langchain import (
    ChatHypic,
    HypicRetriever,
    MiniLMEmbeddings,
    ToolArgumentsParser,
    _Visible,
    documents_to_messages,
    to_chat_messages,
)
from hypic_rag.integrations.prompting import REGISTRY

WEATHER = next(t for t in TOOLS if t["function"]["name"] == "get_weather")
WEATHER_QUESTION = "What is the weather in Kothvenville right now?"


def _doc_block(text):
    return {"type": "text", "text": text, "extras": {"hypic": {"kind": "document"}}}


def _texts(engine, messages, tools=None):
    """The segment texts (and the query's) ``engine.chat`` serves for LangChain ``messages``."""
    rendered = engine.render(to_chat_messages(messages, chat_format=BUNDLED), tools=tools)
    return [(s.kind, s.text) for s in rendered.segments], rendered.query.text


# -- messages ------------------------------------------------------------------------------------------------------


def test_messages_render_as_the_bundled_prompt_format(engine):
    messages = [
        SystemMessage("Answer the question using only the documents."),
        HumanMessage("Tell me about a book."),
        AIMessage("Here is a short note on a book."),
        HumanMessage(content=[_doc_block("Ana Lee lives in Oslo."), {"type": "text", "text": "Where does Ana live?"}]),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "c1"}]),
        ToolMessage('{"forecast":"snow"}', tool_call_id="c1"),
    ]
    segments, query = _texts(engine, messages, [WEATHER])
    assert [kind for kind, _ in segments] == ["tool", "system", "turn", "turn", "document", "turn"]
    texts = [text for _, text in segments]
    assert texts[1] == "<sys>Answer the question using only the documents.</sys>\n"
    assert texts[2] == "<turn>user: Tell me about a book.</turn>\n"
    assert texts[3] == "<turn>assistant: Here is a short note on a book.</turn>\n"
    assert texts[4] == "<doc>Ana Lee lives in Oslo.</doc>\n"
    call = '{"arguments":{"city":"Oslo"},"name":"get_weather"}'
    assert texts[5] == f'<turn>call: {call}\nresult: {{"forecast":"snow"}}</turn>\n'
    assert query == "<q>Where does Ana live?</q>\n<a>"


def test_bundled_normalisation_collapses_space_and_canonicalises_results(engine):
    # whitespace collapsed as the bundled format always did; a framework's spaced, non-ASCII JSON result
    # written as the model was trained (compact, sorted keys, ASCII-escaped)
    messages = [
        SystemMessage("  Be   brief.\n"),
        HumanMessage(content=[_doc_block("  Zoë Ann lives in Oslo. "), "Where does\n  Zoë live?"]),
        AIMessage("", tool_calls=[{"name": "lookup_employee", "args": {"name": "Zoë Ann"}, "id": "c1"}]),
        ToolMessage('{"name": "Zoë Ann", "city": "Oslo"}', tool_call_id="c1"),
    ]
    segments, query = _texts(engine, messages)
    assert [text for _, text in segments] == [
        "<sys>Be brief.</sys>\n",
        "<doc>Zoë Ann lives in Oslo.</doc>\n",
        '<turn>call: {"arguments":{"name":"Zo\\u00eb Ann"},"name":"lookup_employee"}\n'
        'result: {"city":"Oslo","name":"Zo\\u00eb Ann"}</turn>\n',
    ]
    assert query == "<q>Where does Zoë live?</q>\n<a>"


def test_registered_texts_in_flat_messages_become_documents(engine):
    REGISTRY.register(["Ana Lee lives in Oslo.", "Bob is 40 years old."])
    flat = "Answer from the documents.\n\nBob is 40 years old.\n\nAna Lee lives in Oslo."
    segments, query = _texts(engine, [SystemMessage(flat), HumanMessage("Context: Ana Lee lives in Oslo. Who?")])
    assert segments == [
        ("system", "<sys>Answer from the documents.</sys>\n"),
        ("document", "<doc>Bob is 40 years old.</doc>\n"),
        ("document", "<doc>Ana Lee lives in Oslo.</doc>\n"),
        ("document", "<doc>Ana Lee lives in Oslo.</doc>\n"),
    ]
    assert query == "<q>Context: Who?</q>\n<a>"
    # On any other checkpoint the text stays as written; the registered texts are document parts in place.
    chat = to_chat_messages([SystemMessage(flat), HumanMessage("Who?")])
    assert chat[0]["content"] == [
        {"type": "text", "text": "Answer from the documents.\n\n"},
        {"type": "text", "text": "Bob is 40 years old.", "hypic": {"kind": "document"}},
        {"type": "text", "text": "\n\n"},
        {"type": "text", "text": "Ana Lee lives in Oslo.", "hypic": {"kind": "document"}},
    ]
    assert chat[1] == {"role": "user", "content": "Who?"}


def test_messages_become_openai_dicts():
    messages = [
        SystemMessage("Be brief."),
        ChatMessage(role="user", content=[_doc_block("Ana Lee lives in Oslo."), "Where does Ana live?"]),
        AIMessage(
            "Let me check.",
            tool_calls=[{"name": "get_weather", "args": {"city": "Oslo"}, "id": "c1"}],
            additional_kwargs={"reasoning_content": "A weather question."},
        ),
        ToolMessage(content=[{"type": "text", "text": '{"forecast": "snow",  "city": "Oslo"}'}], tool_call_id="c1"),
    ]
    assert to_chat_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Ana Lee lives in Oslo.", "hypic": {"kind": "document"}},
                {"type": "text", "text": "Where does Ana live?"},
            ],
        },
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}
            ],
            "reasoning_content": "A weather question.",
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"city":"Oslo","forecast":"snow"}'},
    ]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([SystemMessage("hi")], "no question"),
        ([HumanMessage(content=[_doc_block("Ana Lee lives in Oslo.")])], "no question"),
        (
            [HumanMessage(content=[{"type": "text", "text": "x", "extras": {"hypic": {"kind": "note"}}}, "q?"])],
            "'note'",
        ),
        ([HumanMessage(content=[{"type": "image", "url": "https://x/y.png"}, "What is it?"])], "'image' block"),
        ([HumanMessage(content=[{"type": "text", "text": None}])], "needs a string 'text'"),
        ([HumanMessage("Hi"), ToolMessage("42", tool_call_id="c9")], "matches no earlier AIMessage tool call"),
        ([FunctionMessage(name="f", content="1"), HumanMessage("q?")], "not FunctionMessage"),
        ([ChatMessage(role="critic", content="meh"), HumanMessage("q?")], "role 'critic'"),
        ([], "no messages"),
    ],
)
def test_content_that_cannot_be_rendered_is_a_clear_error(messages, message):
    with pytest.raises(ValueError, match=message):
        to_chat_messages(messages, chat_format=BUNDLED)


def test_options_are_checked_and_honoured(chat_checkpoint, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="unknown mode"):
        ChatHypic(mode="fast")
    with pytest.raises(ValueError, match="segmentation"):
        ChatHypic(segmentation="words")
    with pytest.raises(ValueError, match="cache_url must be redis://"):
        ChatHypic(cache_url="/tmp/not-a-url")
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        ChatHypic(top_q=0.5)
    with pytest.raises(ValueError, match="cache_dir, cache_url and entry_dtype apply when ChatHypic loads the model"):
        ChatHypic(engine=object(), cache_dir=str(tmp_path))
    # model + cache_dir: loaded once per (model, cache_dir) per process, with the disk tier there
    llm = ChatHypic(model=str(chat_checkpoint), cache_dir=str(tmp_path), top_p=0.5, top_k=3, seed=7, max_tokens=2)
    engine = llm.get_engine()
    assert engine.cache_dir == tmp_path
    assert ChatHypic(model=str(chat_checkpoint), cache_dir=str(tmp_path)).get_engine() is engine
    seen = {}
    real = engine.prepare_chat

    def spy(messages, **kwargs):
        seen.update(kwargs)
        return real(messages, **kwargs)

    monkeypatch.setattr(engine, "prepare_chat", spy)
    reply = llm.invoke("Where does Ana live?", temperature=0.7)
    assert {k: getattr(seen["options"], k) for k in ("top_p", "top_k", "seed", "temperature", "max_new_tokens")} == {
        "top_p": 0.5,
        "top_k": 3,
        "seed": 7,
        "temperature": 0.7,
        "max_new_tokens": 2,
    }
    assert reply.usage_metadata["output_tokens"] == reply.response_metadata["hypic"]["generated_tokens"] <= 2
    with pytest.raises(ValueError, match="does not take 'top_q'"):
        llm.invoke("Hi", top_q=0.5)


# -- the bundled model -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def world():
    texts, qa = corpus(16, seed=11)
    store = InMemoryVectorStore(MiniLMEmbeddings())
    store.add_documents([Document(page_content=t, id=str(i)) for i, t in enumerate(texts)])
    return store, qa


def _direct(fmt, engine, docs, question, system=None):
    """What the engine itself answers for these documents, in the bundled model's prompt format."""
    segs = ([fmt.segment("system", system)] if system else []) + [fmt.segment("document", d) for d in docs]
    out = engine.generate(segs, fmt.query(question), max_new_tokens=24, stop_token_ids=fmt.stop_ids(engine))
    return fmt.answer(out.text)


# qa[4 * person + k] asks about attribute k (city, company, job, age) of a person in the corpus
EVERY_KIND = [4 * person + k for person in range(0, 16, 3) for k in range(4)]


def test_lcel_rag_chain_answers_from_retrieved_documents_and_reordered_ones_hit(engine, world, fmt):
    store, qa = world
    engine.clear_cache()
    llm = ChatHypic(engine=engine, max_tokens=24)
    retriever = store.as_retriever(search_kwargs={"k": 3})
    chain = {"context": retriever, "question": RunnablePassthrough()} | documents_to_messages() | llm
    for i in EVERY_KIND:
        question, answer = qa[i]
        assert chain.invoke(question).content == answer, question
    question = qa[0][0]
    docs = retriever.invoke(question)
    reply = chain.invoke(question)
    stats = reply.response_metadata["hypic"]
    assert stats["hit_segments"] + stats["miss_segments"] == 3
    assert reply.content == _direct(fmt, engine, [d.page_content for d in docs], question)
    assert reply.usage_metadata["input_tokens"] == stats["prompt_tokens"]
    # the same documents in another order, as another question would retrieve them: all three hit
    again = (documents_to_messages() | llm).invoke({"context": docs[::-1], "question": question})
    assert again.content == qa[0][1]
    assert again.response_metadata["hypic"]["hit_segments"] == 3
    assert again.response_metadata["hypic"]["recomputed_tokens"] < again.response_metadata["hypic"]["prompt_tokens"]
    assert (
        again.usage_metadata["input_token_details"]["cache_read"] == again.response_metadata["hypic"]["cached_tokens"]
    )
    assert again.usage_metadata["input_token_details"]["cache_read"] > 0  # as ChatOpenAI reads it from our server


def test_unchanged_chain_keeps_document_boundaries_through_the_retriever_wrapper(engine, world, fmt):
    store, qa = world
    retriever = HypicRetriever(retriever=store.as_retriever(search_kwargs={"k": 3}))
    system = "Answer the question using only the documents."
    prompt = ChatPromptTemplate.from_messages([("system", system + "\n\n{context}"), ("human", "{question}")])

    def format_docs(docs):
        return "\n\n".join(d.page_content for d in docs)

    llm = ChatHypic(engine=engine, max_tokens=24)
    chain = {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm
    question = qa[8][0]
    reply = chain.invoke(question)
    stats = reply.response_metadata["hypic"]
    assert stats["hit_segments"] + stats["miss_segments"] == 4  # the system text and three documents
    docs = [d.page_content for d in retriever.invoke(question)]
    assert reply.content == _direct(fmt, engine, docs, question, system)
    assert (chain | StrOutputParser()).invoke(question) == reply.content


def test_documents_cached_when_indexed_make_the_first_question_warm(engine, world, fmt):
    store, qa = world
    texts = corpus(16, seed=11)[0]
    engine.clear_cache()
    llm = ChatHypic(engine=engine, max_tokens=24)
    assert llm.cache_documents(texts[:20]) == 20 and llm.cache_documents(texts[:20][::-1]) == 0
    retriever = store.as_retriever(search_kwargs={"k": 3})
    question = qa[4][0]
    docs = retriever.invoke(question)
    assert all(d.page_content in texts[:20] for d in docs)
    reply = ({"context": retriever, "question": RunnablePassthrough()} | documents_to_messages() | llm).invoke(question)
    stats = reply.response_metadata["hypic"]
    assert stats["hit_segments"] == 3 and stats["miss_segments"] == 0  # the very first request
    assert stats["cached_tokens"] == stats["prompt_tokens"] - stats["recomputed_tokens"] > 0
    engine.clear_cache()
    assert reply.content == _direct(fmt, engine, [d.page_content for d in docs], question) == qa[4][1]
    system = "Answer from the documents."  # a system prompt is a segment of its own; cached with them
    assert llm.cache_documents(texts[:2], system=system) == 3


def test_documents_cached_when_indexed_are_hits_for_a_plain_chain_through_the_retriever_wrapper(engine, world):
    store, qa = world
    engine.clear_cache()
    llm = ChatHypic(engine=engine, max_tokens=24)
    assert llm.cache_documents(corpus(16, seed=11)[0]) == 64
    retriever = HypicRetriever(retriever=store.as_retriever(search_kwargs={"k": 3}))
    prompt = ChatPromptTemplate.from_messages([("human", "{context}\n\n{question}")])
    joined = retriever | (lambda docs: "\n\n".join(d.page_content for d in docs))
    reply = ({"context": joined, "question": RunnablePassthrough()} | prompt | llm).invoke(qa[8][0])
    stats = reply.response_metadata["hypic"]
    assert stats["hit_segments"] == stats["hit_segments"] + stats["miss_segments"] == 3  # the first question
    assert reply.content == qa[8][1]


FLAT_PROMPTS = {
    "human": [("human", "Answer the question based only on the following context:\n{context}\n\nQuestion: {question}")],
    "system": [("system", "Answer the question using only the documents.\n\n{context}"), ("human", "{question}")],
}


@pytest.mark.parametrize("layout", FLAT_PROMPTS)
def test_plain_chain_on_the_bundled_model_reuses_reordered_documents(engine, world, fmt, layout):
    """A plain LCEL chain, documents joined into one "Context:" string, no retriever wrapper: the bundled model's
    flat prompt is cut at its paragraphs, each document one ``<doc>`` segment, found again in another order."""
    engine.clear_cache()
    texts = corpus(16, seed=11)[0]
    _, qa = world
    docs = [Document(page_content=texts[i]) for i in (8, 0, 4)]  # qa[8] is about texts[8], qa[0] about texts[0]
    ranked = {qa[8][0]: docs, qa[0][0]: docs[::-1]}
    prompt = ChatPromptTemplate.from_messages(FLAT_PROMPTS[layout])

    def format_docs(found):
        return "\n\n".join(d.page_content for d in found)

    llm = ChatHypic(engine=engine, max_tokens=24)
    chain = {"context": RankedRetriever(ranked=ranked) | format_docs, "question": RunnablePassthrough()} | prompt | llm
    first, second = (chain.invoke(q) for q in ranked)
    messages = prompt.invoke({"context": format_docs(docs[::-1]), "question": qa[0][0]}).to_messages()
    rendered = engine.render(to_chat_messages(messages, chat_format=BUNDLED))
    assert [s.text for s in rendered.segments if s.kind == "document"] == [
        fmt.segment("document", d.page_content).text for d in docs[::-1]
    ]
    assert qa[0][0] in rendered.query.text
    assert first.response_metadata["hypic"]["hit_segments"] == 0 or layout == "system"  # a system prompt may recur
    stats = second.response_metadata["hypic"]
    assert stats["hit_segments"] >= len(docs)
    assert stats["recomputed_tokens"] < first.response_metadata["hypic"]["recomputed_tokens"]
    assert (first.content, second.content) == (qa[8][1], qa[0][1])
    # segmentation="none" leaves the flat text whole: nothing to find again
    whole = ChatHypic(engine=engine, max_tokens=4, segmentation="none").invoke(messages)
    assert whole.response_metadata["hypic"]["hit_segments"] == 0


def test_streaming_matches_invoke(engine, world):
    _, qa = world
    llm = ChatHypic(engine=engine, max_tokens=24)
    msgs = [HumanMessage(content=[_doc_block(corpus(16, seed=11)[0][8]), {"type": "text", "text": qa[8][0]}])]
    chunks = list(llm.stream(msgs))
    assert "".join(c.content for c in chunks) == llm.invoke(msgs).content == qa[8][1]
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.response_metadata["hypic"]["prompt_tokens"] > 0 and merged.usage_metadata["output_tokens"] > 0


def test_streaming_honours_stop_sequences(engine, world):
    _, qa = world
    llm = ChatHypic(engine=engine, max_tokens=24)
    msgs = [HumanMessage(content=[_doc_block(corpus(16, seed=11)[0][8]), {"type": "text", "text": qa[8][0]}])]
    whole = llm.invoke(msgs).content
    assert len(whole) >= 2
    stop = whole[1:3]
    streamed = "".join(c.content for c in llm.stream(msgs, stop=[stop]))
    assert streamed == llm.invoke(msgs, stop=[stop]).content == whole[: whole.index(stop)]


def test_bound_tools_become_segments_and_calls_become_tool_calls(engine):
    others = [t for t in TOOLS if t["function"]["name"] in ("set_timer", "translate", "find_product")]
    llm = ChatHypic(engine=engine, max_tokens=40)
    bound = llm.bind_tools([*others, WEATHER])
    reply = bound.invoke(WEATHER_QUESTION)
    stats = reply.response_metadata["hypic"]
    assert stats["hit_segments"] + stats["miss_segments"] == 4  # one segment per tool
    assert [(c["name"], c["args"]) for c in reply.tool_calls] == [("get_weather", {"city": "Kothvenville"})]
    assert reply.content == "" and reply.tool_calls[0]["id"].startswith("call_")
    # streamed: the call arrives whole in the last chunk, never as text
    chunks = list(bound.stream(WEATHER_QUESTION))
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    assert merged.content == "" and merged.tool_calls == reply.tool_calls
    with pytest.raises(ValueError, match="not one of the bound tools"):
        llm.bind_tools([WEATHER], tool_choice="send_email")
    assert llm.bind_tools([WEATHER], tool_choice={"type": "function", "function": {"name": "get_weather"}})


class get_weather(BaseModel):  # noqa: N801 -- the tool's name, as the bundled model knows it
    """Current weather in a city."""

    city: str = Field(description="city name")


class WeatherDict(TypedDict):
    city: str


class JokeDict(TypedDict):
    setup: Annotated[str, ..., "question to set up a joke"]
    punchline: Annotated[str | None, None, "answer to resolve the joke"]


def test_structured_output_parses_the_call_into_the_schema(engine):
    llm = ChatHypic(engine=engine, max_tokens=40)
    assert llm.with_structured_output(get_weather).invoke(WEATHER_QUESTION) == get_weather(city="Kothvenville")
    assert llm.with_structured_output(WEATHER).invoke(WEATHER_QUESTION) == {"city": "Kothvenville"}
    # no call (here one cut off by max_tokens, whatever the model): an error, or parsing_error with
    # include_raw -- never a silent None
    short = ChatHypic(engine=engine, max_tokens=4)
    with pytest.raises(OutputParserException, match="did not call 'get_weather'"):
        short.with_structured_output(get_weather).invoke(WEATHER_QUESTION)
    out = short.with_structured_output(get_weather, include_raw=True).invoke(WEATHER_QUESTION)
    assert out["parsed"] is None and isinstance(out["parsing_error"], OutputParserException)
    raw = out["raw"]  # the cut-off call: partial, never content
    assert isinstance(raw, AIMessage) and raw.content == "" and raw.invalid_tool_calls[0]["name"] == "get_weather"
    raw = llm.with_structured_output(get_weather, include_raw=True).invoke(WEATHER_QUESTION)
    assert raw["parsed"] == get_weather(city="Kothvenville") and raw["parsing_error"] is None


def test_a_typeddicts_optional_key_is_optional_as_the_model_was_shown():
    """LangChain makes an ``Annotated`` key with a default optional in the schema the model sees; pydantic would
    still require it. The arguments are held to the schema shown: the optional key may be left out, not a
    required one."""
    from langchain_core.outputs import ChatGeneration

    parser = ToolArgumentsParser(tool_schema=JokeDict, name="JokeDict")

    def called(args: dict) -> list[ChatGeneration]:
        return [ChatGeneration(message=AIMessage("", tool_calls=[{"name": "JokeDict", "args": args, "id": "c"}]))]

    assert parser.parse_result(called({"setup": "Why?"})) == {"setup": "Why?"}
    assert parser.parse_result(called({"setup": "Why?", "punchline": None})) == {"setup": "Why?", "punchline": None}
    for args in ({"punchline": "Because."}, {"setup": 3}):
        with pytest.raises(OutputParserException, match="do not fit 'JokeDict'"):
            parser.parse_result(called(args))


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
@pytest.mark.parametrize("schema", [get_weather, WeatherDict, WEATHER], ids=["pydantic", "typeddict", "openai"])
def test_structured_output_returns_the_object_with_every_method(engine, method, schema):
    llm = ChatHypic(engine=engine, max_tokens=40)
    out = llm.with_structured_output(schema, method=method, include_raw=True).invoke(WEATHER_QUESTION)
    assert out["parsing_error"] is None
    expected = get_weather(city="Kothvenville") if schema is get_weather else {"city": "Kothvenville"}
    assert out["parsed"] == expected
    raw = out["raw"]
    if method == "function_calling":  # the arguments of the forced call
        name = "WeatherDict" if schema is WeatherDict else "get_weather"
        assert raw.content == "" and [c["name"] for c in raw.tool_calls] == [name]
    else:  # the content, JSON under the response format's grammar
        assert raw.tool_calls == [] and json.loads(raw.content) == {"city": "Kothvenville"}
    # LangChain's own default path: no method named, no include_raw
    assert llm.with_structured_output(schema).invoke(WEATHER_QUESTION) == expected


def test_json_mode_without_a_schema_is_a_dict(engine):
    llm = ChatHypic(engine=engine, max_tokens=40)
    assert llm.with_structured_output(None, method="json_mode").invoke(WEATHER_QUESTION) == {"city": "Kothvenville"}


def test_structured_output_methods_are_checked(engine):
    llm = ChatHypic(engine=engine)
    with pytest.raises(ValueError, match="method must be one of function_calling, json_schema, json_mode"):
        llm.with_structured_output(get_weather, method="xml")
    with pytest.raises(ValueError, match="unsupported arguments"):
        llm.with_structured_output(get_weather, tools=[])


def test_json_schema_answers_validate_whatever_the_question(engine):
    """The grammar, not the question, makes the content fit: a schema the question gives no hint of."""

    class Ticket(BaseModel):
        title: str = Field(max_length=24)
        priority: int = Field(ge=1, le=5)
        tags: list[Literal["bug", "docs", "ops"]] = Field(max_length=3)

    llm = ChatHypic(engine=engine, max_tokens=48)
    for question in ("Where does Bo Ek live?", "Hello!", WEATHER_QUESTION):
        raw = llm.with_structured_output(Ticket, method="json_schema", include_raw=True).invoke(question)["raw"]
        jsonschema.validate(json.loads(raw.content), Ticket.model_json_schema())


def test_bound_tool_choice_is_honoured_through_the_grammar(engine):
    llm = ChatHypic(engine=engine, max_tokens=40)
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    # a named tool is called even when the question asks for another one, with arguments valid under its schema
    named = llm.bind_tools(TOOLS, tool_choice="lookup_employee").invoke(WEATHER_QUESTION)
    assert [c["name"] for c in named.tool_calls] == ["lookup_employee"] and named.content == ""
    jsonschema.validate(named.tool_calls[0]["args"], schemas["lookup_employee"])
    # "any" (LangChain's) and "required" (OpenAI's): a call to a bound tool, even for a greeting
    for choice in ("any", "required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = llm.bind_tools([WEATHER, *TOOLS[:2]], tool_choice=choice).invoke("Hello there!")
        assert len(reply.tool_calls) >= 1, choice
        for call in reply.tool_calls:
            jsonschema.validate(call["args"], schemas[call["name"]])
        if isinstance(choice, dict):
            assert [c["name"] for c in reply.tool_calls] == ["get_weather"]
    # True (ChatOpenAI's spelling): the one bound tool
    forced = llm.bind_tools([WEATHER], tool_choice=True).invoke("Hello there!")
    assert [c["name"] for c in forced.tool_calls] == ["get_weather"]
    # "none": the tools are left out of the prompt, so no call can come back
    unoffered = llm.bind_tools([WEATHER], tool_choice="none").invoke(WEATHER_QUESTION)
    stats = unoffered.response_metadata["hypic"]
    assert unoffered.tool_calls == [] and stats["hit_segments"] + stats["miss_segments"] == 0  # no tool segment


@pytest.mark.parametrize(
    ("schema", "args", "expected"),
    [
        (get_weather, {"city": "Oslo"}, get_weather(city="Oslo")),
        (get_weather, {"town": "Oslo"}, "do not fit"),
        (WeatherDict, {"city": "Oslo"}, {"city": "Oslo"}),
        (WeatherDict, {"city": 3}, "do not fit"),
        (WEATHER, {"city": "Oslo"}, {"city": "Oslo"}),
        (WEATHER, {"town": "Oslo"}, "lacks city"),
    ],
)
def test_structured_output_parser_validates_arguments(schema, args, expected):
    name = "WeatherDict" if schema is WeatherDict else "get_weather"
    parser = ToolArgumentsParser(tool_schema=schema, name=name)
    message = AIMessage("", tool_calls=[{"name": name, "args": args, "id": "c1"}])
    if isinstance(expected, str):
        with pytest.raises(OutputParserException, match=expected):
            parser.invoke(message)
    else:
        assert parser.invoke(message) == expected


def test_stream_holds_back_what_may_become_a_call_or_a_stop():
    visible = _Visible("qwen3_json", thinking_open=False, stop=None)
    assert visible("Hello there, friend") == "Hello th"  # the length of a tag held back
    assert visible('Sure.\n<tool_call>\n{"name": "f"') == "Sure."
    assert _Visible("qwen3_json", thinking_open=True, stop=None)("still thinking") == ""
    assert _Visible("qwen3_json", True, None)("plan</think>\n\nThe answer is 42 units") == "The answer "
    assert _Visible("bundled", False, None)('{"arguments":{') == ""
    assert _Visible("none", False, ["STOP"])("abc STOP def") == "abc "
    assert _Visible("none", False, ["STOP"])("abcdef") == "ab"


@pytest.mark.standard
class TestChatHypicUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self):
        return ChatHypic

    @property
    def chat_model_params(self):
        return {"model": "hypic-default"}

    @property
    def standard_chat_model_params(self):
        params = super().standard_chat_model_params
        del params["api_key"]  # a local model: unknown options are errors, and there is no key to give
        return params


# -- a Qwen-style checkpoint -----------------------------------------------------------------------------------------

DOCS = [
    "Ana Lee lives in Oslo and works as a pilot.",
    "Bo Ek lives in Rome.",
    "Cy Ru lives in Lima and works as a chemist.",
    "The weather in Lima is sunny, 24 degrees.",
]
INSTRUCTION = "Answer the question using only the documents."


@pytest.fixture(scope="module")
def qwen(chat_checkpoint) -> Engine:
    return Engine.from_pretrained(chat_checkpoint, min_cached_tokens=1)


class RankedRetriever(BaseRetriever):
    """The documents each question retrieves, in its own order, as a vector store would rank them."""

    ranked: dict[str, list[Document]]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return self.ranked[query]


def test_plain_chain_on_a_qwen_checkpoint_reuses_reordered_documents(qwen):
    qwen.clear_cache()
    docs = [Document(page_content=t) for t in DOCS]
    ranked = {"Where does Ana live?": docs, "What is the weather in Lima?": docs[::-1]}
    prompt = ChatPromptTemplate.from_messages([("system", INSTRUCTION + "\n\n{context}"), ("human", "{question}")])

    def format_docs(found):
        return "\n\n".join(d.page_content for d in found)

    llm = ChatHypic(engine=qwen, max_tokens=2)
    context = RankedRetriever(ranked=ranked) | format_docs
    chain = {"context": context, "question": RunnablePassthrough()} | prompt | llm
    replies, rendered = [], []
    for question in ranked:
        replies.append(chain.invoke(question))
        messages = prompt.invoke({"context": format_docs(ranked[question]), "question": question}).to_messages()
        rendered.append(qwen.render(to_chat_messages(messages)))
    # each document is a segment of its own, in the order retrieved, the instruction one too
    for r, question in zip(rendered, ranked, strict=True):
        cached = [s.text for s in r.segments if s.cache]
        assert cached == [INSTRUCTION] + [d.page_content for d in ranked[question]]
        assert question in r.query.text
    stats = replies[1].response_metadata["hypic"]
    assert stats["hit_segments"] >= len(DOCS)
    assert stats["hit_segments"] == sum(s.cache for s in rendered[1].segments)  # every cached segment hit
    assert stats["recomputed_tokens"] < replies[0].response_metadata["hypic"]["recomputed_tokens"]


def test_chat_on_a_qwen_checkpoint_reuses_reordered_documents(qwen):
    qwen.clear_cache()

    def ask(order, question):
        return [
            {"role": "system", "content": INSTRUCTION + "\n\n" + "\n\n".join(order)},
            {"role": "user", "content": question},
        ]

    qwen.chat(ask(DOCS, "Where does Ana live?"), max_new_tokens=1)
    out = qwen.chat(ask(DOCS[::-1], "What is the weather in Lima?"), max_new_tokens=1)
    rendered = qwen.render(ask(DOCS[::-1], "What is the weather in Lima?"))
    assert [s.text for s in rendered.segments if s.kind == "document"] == [INSTRUCTION, *DOCS[::-1]]
    assert out.stats["hit_segments"] == len(DOCS) + 1


def test_the_engine_is_loaded_once_per_model_and_cache_dir(chat_checkpoint, tmp_path):
    one = prompting.load_engine(str(chat_checkpoint))
    assert prompting.load_engine(str(chat_checkpoint)) is one
    assert prompting.load_engine(str(chat_checkpoint), tmp_path) is not one
    assert ChatHypic(model=str(chat_checkpoint)).get_engine() is one


def test_a_chain_with_cache_url_shares_its_documents_with_another_replica(tmp_path):
    from hypic_rag.testing.redis import RedisServer

    docs = ["Ana Lee lives in Oslo and works as a baker.", "Bo Ek lives in Rome and works as a nurse."]
    question = "Where does Bo Ek live?"
    with RedisServer(tmp_path / "redis") as redis:
        llm = ChatHypic(cache_url=redis.url, max_tokens=2)
        chain = documents_to_messages() | llm | StrOutputParser()
        chain.invoke({"context": [Document(d) for d in docs], "question": question})
        llm.get_engine().segment_store.remote.flush()  # its entries reach Redis in the background
        replica = Engine.from_pretrained(cache_url=redis.url)  # another process's engine: nothing local
        parts = [{"type": "text", "text": d, "hypic": {"kind": "document"}} for d in docs[::-1]]
        out = replica.chat(
            [{"role": "user", "content": [*parts, {"type": "text", "text": question}]}], max_new_tokens=2
        )
        assert out.stats["remote_hits"] >= 2 and out.stats["hit_segments"] == 2  # both documents, reordered


def test_auto_seams_and_the_fidelity_guard_are_chat_model_fields(engine):
    docs = [
        Document(page_content="Ana Lee lives in Oslo and works as a pilot at Nordfly Systems in the north."),
        Document(page_content="Bo Ek lives in Rome and works as a baker at Forno Labs near the old market."),
    ]
    inputs = {"context": docs, "question": "Where does Ana Lee live?"}
    exact = (documents_to_messages() | ChatHypic(engine=engine, max_tokens=4, mode="full")).invoke(inputs)
    llm = ChatHypic(engine=engine, max_tokens=4, seam="auto", fidelity_budget=0.0)
    guarded = (documents_to_messages() | llm).invoke(inputs)
    stats = guarded.response_metadata["hypic"]
    assert stats["segments"] >= 2 and stats["seam"] == "auto"
    assert stats["fidelity_action"] in ("exact", "widened") and stats["fidelity_estimate"] > 0
    assert guarded.content == exact.content
    with pytest.raises(ValueError, match="fidelity_budget"):
        ChatHypic(engine=engine, fidelity_budget=-1.0)


def test_an_abandoned_stream_is_cancelled_and_lets_the_engine_go(chat_checkpoint, monkeypatch):
    import time

    from hypic_rag.concurrent import shared_batch

    engine = Engine.from_pretrained(chat_checkpoint)  # random weights: an answer that runs to max_tokens
    outputs: list = []
    batch = shared_batch(engine)  # a stream decodes in the engine's shared batch
    real = batch.run
    monkeypatch.setattr(batch, "run", lambda *a, **k: outputs.append(real(*a, **k)) or outputs[-1])
    stream = ChatHypic(engine=engine, max_tokens=200).stream("Hello")
    next(stream)
    stream.close()  # the consumer stops reading
    deadline = time.monotonic() + 30
    while not outputs or not batch.scheduler.idle:  # the stream's request leaves the batch at its next token
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert outputs[0].finish_reason == "cancelled" and len(outputs[0].token_ids) < 200
