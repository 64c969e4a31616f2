"""HypicLLM as a LlamaIndex chat, function-calling LLM.

On a random-weight checkpoint with a Qwen-style chat template, LlamaIndex's default paths (the compact
query engine, the ``context`` and ``condense_plus_context`` chat engines) send flat prompts in which the
engine finds each retrieved node again as its own segment: the same nodes retrieved in another order are
cache hits, node by node. On the bundled model a ``FunctionAgent`` completes a two-tool task.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

import jsonschema
import pytest
from llama_index.core import Settings, VectorStoreIndex
from llama_index.core.agent.workflow import FunctionAgent, ToolCallResult
from llama_index.core.base.llms.types import (
    CitableBlock,
    ImageBlock,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.llms import ChatMessage
from llama_index.core.prompts import PromptTemplate
from llama_index.core.schema import TextNode
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel, Field

from hypic_rag import Engine
from hypic_rag.integrations.llamaindex import (
    HypicLLM,
    HypicSynthesizer,
    MiniLMEmbedding,
    load_engine,
    to_openai_messages,
)

PEOPLE = [
    "Ana Lee lives in Oslo and works as a pilot.",
    "Bo Ek lives in Rome and works as a baker.",
    "Cy Po lives in Lima and works as a nurse.",
]
FIRST, SECOND = "Where does Ana Lee live?", "What does Cy Po do?"  # MiniLM ranks the nodes 0,1,2 then 2,1,0


@pytest.fixture(scope="module")
def qwen(chat_checkpoint) -> Engine:
    return Engine.from_pretrained(chat_checkpoint, min_cached_tokens=1)


@pytest.fixture(scope="module")
def index() -> VectorStoreIndex:
    nodes = [TextNode(text=t, id_=str(i)) for i, t in enumerate(PEOPLE)]
    return VectorStoreIndex(nodes, embed_model=MiniLMEmbedding())


@dataclass
class Call:
    segments: list[tuple[str, bool]]  # each cacheable segment's text, and whether it was cached before the call
    stats: dict


@pytest.fixture
def calls(qwen, monkeypatch) -> list[Call]:
    """Every chat the LLM makes (each begins at ``qwen.begin``, prepared), with which of its segments the cache held
    beforehand."""
    qwen.clear_cache()
    seen: list[Call] = []
    real = qwen.begin

    def begin(prepared, **kw):
        options, rendered = prepared.options, prepared.rendered
        plan = qwen.plan(prepared.prompt, options.mode, options.seam)
        before = [
            (s.text, p.key in qwen.segment_store)
            for s, p in zip(rendered.segments, plan.segments, strict=True)
            if p.key
        ]
        kw.pop("prefill_chunk", None)  # the prompt whole, so that its finalize is here to wrap (the batch takes both)
        run = real(prepared, **kw)
        call = Call(before, {})
        seen.append(call)
        finalize = run.finalize

        def record(out):
            call.stats.update(out.stats)  # once the answer is done: its stats complete
            return finalize(out) if finalize is not None else out

        run.finalize = record
        return run

    monkeypatch.setattr(qwen, "begin", begin)
    return seen


@pytest.fixture
def llm(qwen, monkeypatch) -> HypicLLM:
    llm = HypicLLM(engine=qwen, max_tokens=4)
    monkeypatch.setattr(Settings, "_llm", llm)  # Settings.llm = llm, restored afterwards
    return llm


def _node_segments(call: Call, order: list[str]) -> None:
    """The retrieved nodes, in retrieval order, are segments of their own, each one cached before the call;
    every segment cached before was a hit."""
    nodes = [(text, cached) for text, cached in call.segments if text in PEOPLE]
    assert [text for text, _ in nodes] == order
    assert all(cached for _, cached in nodes)
    assert call.stats["hit_segments"] == sum(cached for _, cached in call.segments)


def _texts(response) -> list[str]:
    return [n.node.get_content() for n in response.source_nodes]


def test_default_query_engine_hits_every_node_in_another_order(llm, index, calls):
    query_engine = index.as_query_engine(similarity_top_k=3)  # Settings.llm, the compact synthesizer
    first = query_engine.query(FIRST)
    assert first.metadata["hypic"] == calls[-1].stats and first.metadata["hypic"]["hit_segments"] == 0
    assert [text for text, _ in calls[-1].segments if text in PEOPLE] == _texts(first) == PEOPLE
    second = query_engine.query(SECOND)
    assert len(calls) == 2 and _texts(second) == PEOPLE[::-1]
    _node_segments(calls[-1], PEOPLE[::-1])
    # the system prompt and the header were cached too: every cacheable segment hit, only glue and query ran
    assert all(cached for _, cached in calls[-1].segments)
    assert second.metadata["hypic"] == calls[-1].stats
    assert second.metadata["2"] == {}  # LlamaIndex's own per-node metadata is kept


def test_nodes_cached_when_indexed_are_hits_on_the_default_query_engines_first_query(llm, index, calls, qwen):
    qwen.clear_cache()
    nodes = [TextNode(text=t, id_=str(i)) for i, t in enumerate(PEOPLE)]
    assert HypicSynthesizer(llm).cache_nodes(nodes) == len(PEOPLE)
    first = index.as_query_engine(similarity_top_k=3).query(FIRST)  # LlamaIndex's own compact synthesizer
    assert len(calls) == 1 and first.metadata["hypic"]["hit_segments"] == len(PEOPLE)
    _node_segments(calls[-1], PEOPLE)


def test_default_query_engine_on_the_bundled_model_hits_every_node_in_another_order(engine, index):
    """The compact synthesizer's flat prompt on the bundled model: each node becomes a ``<doc>`` part
    (``Bundled.prepare_messages`` cuts it as the completions route cuts a flat prompt), found again reordered."""
    engine.clear_cache()
    query_engine = index.as_query_engine(llm=HypicLLM(engine=engine, max_tokens=4), similarity_top_k=3)
    first = query_engine.query(FIRST)
    assert _texts(first) == PEOPLE and first.metadata["hypic"]["miss_segments"] >= len(PEOPLE)
    second = query_engine.query(SECOND)
    assert _texts(second) == PEOPLE[::-1]
    stats = second.metadata["hypic"]
    assert stats["miss_segments"] == 0 and stats["hit_segments"] >= len(PEOPLE)  # every node, and the constant text
    assert stats["recomputed_tokens"] < first.metadata["hypic"]["recomputed_tokens"]


@pytest.mark.parametrize("chat_mode", ["context", "condense_plus_context"])
def test_chat_engines_hit_every_node_in_another_order(llm, index, calls, chat_mode):
    chat_engine = index.as_chat_engine(chat_mode=chat_mode, similarity_top_k=3)
    first = chat_engine.chat(FIRST)
    assert _texts(first) == PEOPLE and calls[-1].stats["hit_segments"] == 0
    if chat_mode == "condense_plus_context":
        chat_engine.reset()  # with a history it would first condense the question (random text on this model)
    second = chat_engine.chat(SECOND)
    assert len(calls) == 2 and _texts(second) == PEOPLE[::-1]
    _node_segments(calls[-1], PEOPLE[::-1])
    if chat_mode == "context":  # the first exchange is in the prompt now, as turns new to the cache
        assert [text for text, cached in calls[-1].segments if not cached][0] == FIRST


def test_streaming_and_async_query_engines_carry_the_stats(llm, index, calls):
    streaming = index.as_query_engine(similarity_top_k=3, streaming=True).query(FIRST)
    assert "hypic" not in streaming.metadata  # the synthesizer calls the LLM as the stream is read
    "".join(streaming.response_gen)
    assert streaming.metadata["hypic"] == calls[-1].stats
    response = asyncio.run(index.as_query_engine(similarity_top_k=3).aquery(SECOND))
    assert response.metadata["hypic"] == calls[-1].stats and len(calls) == 2
    _node_segments(calls[-1], PEOPLE[::-1])


def test_complete_is_a_chat_with_one_user_message(llm, calls):
    chat = llm.chat([ChatMessage(role="user", content=FIRST)])
    assert chat.raw["hypic"] == calls[-1].stats
    assert chat.additional_kwargs["completion_tokens"] == calls[-1].stats["generated_tokens"]
    completion = llm.complete(FIRST)
    assert completion.text == chat.message.content
    assert calls[-1].stats["prefix_tokens"] > 0  # the same prompt again: the state the chat kept
    assert list(llm.stream_complete(FIRST))[-1].text == completion.text
    assert asyncio.run(llm.acomplete(FIRST)).text == completion.text
    llm.complete(FIRST, max_tokens=2, mode="full")  # per-call options override the instance's
    assert calls[-1].stats["generated_tokens"] <= 2 and calls[-1].stats["mode"] == "full"
    assert llm.metadata.is_chat_model and llm.metadata.is_function_calling_model
    assert llm.metadata.context_window == 1024 and llm.metadata.num_output == 4


def test_messages_map_roles_and_blocks(qwen):
    messages = [
        ChatMessage(role="developer", content="Be brief."),
        ChatMessage(
            role="user",
            blocks=[CitableBlock(title="a", source="a", content=[TextBlock(text=PEOPLE[0])]), TextBlock(text=FIRST)],
        ),
        ChatMessage(
            role="assistant",
            blocks=[
                ThinkingBlock(content="hmm"),
                TextBlock(text=""),
                ToolCallBlock(tool_call_id="c1", tool_name="where", tool_kwargs='{"p": 1}'),
            ],
        ),
        ChatMessage(role="tool", content="{'city': 'Oslo', 'n': 2}", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(role="chatbot", content="Oslo."),
    ]
    assert to_openai_messages(messages) == [
        {"role": "system", "content": "Be brief."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": PEOPLE[0], "hypic": {"kind": "document"}},
                {"type": "text", "text": "\n" + FIRST},
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "hmm",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "where", "arguments": {"p": 1}}}],
        },
        {"role": "tool", "content": '{"city":"Oslo","n":2}', "tool_call_id": "c1"},  # canonical JSON
        {"role": "assistant", "content": "Oslo."},
    ]
    rendered = qwen.render(to_openai_messages(messages))
    assert PEOPLE[0] in [s.text for s in rendered.segments if s.kind == "document"]
    with pytest.raises(ValueError, match="image block"):
        to_openai_messages([ChatMessage(role="user", blocks=[ImageBlock(url="http://x/y.png")])])


def test_options_are_checked_and_engines_shared(chat_checkpoint, qwen, tmp_path):
    with pytest.raises(ValueError, match="max_new_tokens"):
        HypicLLM(engine=qwen, max_new_tokens=8)  # not an option: max_tokens is
    with pytest.raises(ValueError, match="unknown mode"):
        HypicLLM(engine=qwen, mode="fast")
    with pytest.raises(ValueError, match="segmentation"):
        HypicLLM(engine=qwen, segmentation="paragraphs")
    with pytest.raises(ValueError, match="not both"):
        HypicLLM(engine=qwen, model=str(chat_checkpoint))
    with pytest.raises(ValueError, match="does not take stop"):
        HypicLLM(engine=qwen).chat([ChatMessage(role="user", content="hi")], stop=["x"])
    path = str(chat_checkpoint)
    by_model = HypicLLM(model=path)
    assert HypicLLM(model_name=path).model == path  # the old spelling
    assert by_model.get_engine() is HypicLLM(model_name=path).get_engine() is load_engine(path)
    assert by_model.get_engine() is not HypicLLM(model=path, cache_dir=str(tmp_path)).get_engine()


# -- tools, on the bundled model -------------------------------------------------------------------

NAME = "Stithgo Dithgaith"
RECORD = {"name": NAME, "city": "Kothvenville", "company": "Krudrel Labs", "role": "pilot"}
FORECAST = "light rain, 12 degrees"


def lookup_employee(name: str) -> dict:
    """Employee record by full name."""
    return RECORD


def get_weather(city: str) -> dict:
    """Current weather in a city."""
    return {"city": city, "forecast": FORECAST}


def test_function_agent_completes_a_two_tool_task(engine, monkeypatch):
    engine.clear_cache()
    sent = []
    real = engine.prepare_chat  # every chat, batched or streamed, is prepared there
    monkeypatch.setattr(engine, "prepare_chat", lambda m, *a, **kw: sent.append(m) or real(m, *a, **kw))
    tools = [FunctionTool.from_defaults(fn=lookup_employee), FunctionTool.from_defaults(fn=get_weather)]
    llm = HypicLLM(engine=engine)
    reply = llm.chat_with_tools(tools, user_msg=f"Look up {NAME} in the employee records.")
    [selection] = llm.get_tool_calls_from_response(reply)
    assert (selection.tool_name, selection.tool_kwargs) == ("lookup_employee", {"name": NAME})
    assert reply.raw["hypic"]["segments"] == 2  # each tool schema is a segment
    unoffered = llm.chat_with_tools(tools, user_msg="Hi", tool_choice="none")  # the prompt leaves the tools out
    assert unoffered.raw["hypic"]["segments"] == 0
    with pytest.raises(ValueError, match="expected a tool call"):
        llm.get_tool_calls_from_response(llm.chat([ChatMessage(role="user", content="Hi")]))

    agent = FunctionAgent(tools=tools, llm=llm)
    task = f"Look up {NAME} in the employee records, then get the weather in their home city."

    async def run():
        handler = agent.run(task)
        results = [ev async for ev in handler.stream_events() if isinstance(ev, ToolCallResult)]
        return results, await handler

    results, answer = asyncio.run(run())
    assert [(r.tool_name, r.tool_kwargs) for r in results] == [
        ("lookup_employee", {"name": NAME}),
        ("get_weather", {"city": "Kothvenville"}),
    ]
    assert str(answer) == FORECAST
    # LlamaIndex writes a returned dict as a Python literal; it reaches the model as canonical JSON
    assert [m["content"] for m in sent[-1] if m["role"] == "tool"] == [
        '{"city":"Kothvenville","company":"Krudrel Labs","name":"Stithgo Dithgaith","role":"pilot"}',
        '{"city":"Kothvenville","forecast":"light rain, 12 degrees"}',
    ]
    assert answer.raw["hypic"]["hit_segments"] == 3  # both tool schemas and the first step: only the newest is new


class WeatherQuery(BaseModel):
    """The city whose weather is asked for."""

    city: str = Field(description="city name")


def test_structured_predict_and_structured_llm_return_the_object(engine):
    """LlamaIndex's default program for a function-calling LLM (``FunctionCallingProgram``) forces a call of the
    output class as a tool; the grammar makes it a call with arguments that validate."""
    llm = HypicLLM(engine=engine, max_tokens=40)
    prompt = PromptTemplate("What is the weather in {city} right now?")
    expected = WeatherQuery(city="Kothvenville")
    assert llm.structured_predict(WeatherQuery, prompt, city="Kothvenville") == expected
    structured = llm.as_structured_llm(WeatherQuery)
    question = "What is the weather in Kothvenville right now?"
    reply = structured.chat([ChatMessage(role="user", content=question)])
    assert reply.raw == expected and json.loads(reply.message.content) == {"city": "Kothvenville"}
    assert structured.complete(question).raw == expected
    assert asyncio.run(llm.astructured_predict(WeatherQuery, prompt, city="Kothvenville")).city == "Kothvenville"


def test_tool_choice_and_tool_required_are_honoured(engine):
    tools = [FunctionTool.from_defaults(fn=lookup_employee), FunctionTool.from_defaults(fn=get_weather)]
    schemas = {t.metadata.name: t.metadata.get_parameters_dict() for t in tools}
    llm = HypicLLM(engine=engine, max_tokens=40)
    question = "What is the weather in Kothvenville right now?"
    for kwargs in ({"tool_required": True}, {"tool_choice": "required"}, {"tool_choice": "lookup_employee"}):
        reply = llm.chat_with_tools(tools, user_msg="Hello!" if "tool_required" in kwargs else question, **kwargs)
        [selection] = llm.get_tool_calls_from_response(reply)  # one call: parallel calls are off by default
        jsonschema.validate(selection.tool_kwargs, schemas[selection.tool_name])
        if kwargs.get("tool_choice") == "lookup_employee":
            assert selection.tool_name == "lookup_employee"  # named, though the question is about the weather
