"""LangGraph's prebuilt ReAct agent on ChatHypic and the bundled model: it completes the two-tool task that
``ToolAgent`` completes (look a person up, get the weather in their city, answer with the forecast) for several
people. ToolNode writes each result as spaced JSON; ChatHypic canonicalises it, so every model call renders the
very prompt ``ToolAgent`` builds for the same step (tool schemas, one ``turn`` per call and result, the task), and
each step finds the schemas and the earlier steps cached."""

from __future__ import annotations

import json
import random
from typing import Annotated

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.prebuilt import create_react_agent

from hypic_rag.chat.formats import BUNDLED
from hypic_rag.eval.data.pools import World
from hypic_rag.integrations.agent import Tool, ToolAgent
from hypic_rag.integrations.langchain import ChatHypic, to_chat_messages

FORECAST = "light rain, 12 degrees"


def _people(n: int, seed: int) -> dict[str, dict]:
    world = World(random.Random(seed))
    people = {}
    for _ in range(n):
        name = world.person()
        people[name] = {"name": name, "city": world.city(), "company": world.org(), "role": "pilot"}
    return people


PEOPLE = _people(5, seed=5)


@tool
def lookup_employee(name: Annotated[str, "full name"]) -> dict:
    """Employee record by full name."""
    if name not in PEOPLE:
        raise KeyError(name)
    return PEOPLE[name]


@tool
def get_weather(city: Annotated[str, "city name"]) -> dict:
    """Current weather in a city."""
    return {"city": city, "forecast": FORECAST}


TOOLS = [lookup_employee, get_weather]
SCHEMAS = [convert_to_openai_tool(t) for t in TOOLS]


def _task(name: str) -> str:
    return f"Look up {name} in the employee records, then get the weather in their home city."


@pytest.fixture(scope="module")
def graph(engine):
    engine.clear_cache()
    return create_react_agent(ChatHypic(engine=engine), tools=TOOLS)


def _tool_agent_prompt(fmt, messages) -> list[str]:
    """The segments ``ToolAgent`` builds for the step after ``messages``: schemas, a turn per step, the task."""
    task = messages[0].content
    calls = {c["id"]: c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
    steps = []
    for m in messages:
        if isinstance(m, ToolMessage):
            call = calls[m.tool_call_id]
            steps.append(fmt.step_segment(call["name"], call["args"], json.loads(m.content)))
    return [s.text for s in [*map(fmt.tool_segment, SCHEMAS), *steps, fmt.query(task)]]


@pytest.mark.parametrize("name", list(PEOPLE))
def test_react_agent_completes_the_two_tool_task(engine, graph, name, fmt):
    person = PEOPLE[name]
    messages = graph.invoke({"messages": [HumanMessage(_task(name))]}, {"recursion_limit": 8})["messages"]
    calls = [(c["name"], c["args"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls == [("lookup_employee", {"name": name}), ("get_weather", {"city": person["city"]})]
    assert messages[-1].content == FORECAST and not messages[-1].tool_calls
    # ToolNode's results are spaced JSON; what the model saw is the compact, sorted form it was trained on
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert results[0].content == json.dumps(person, ensure_ascii=False)
    replies = [(i, m) for i, m in enumerate(messages) if isinstance(m, AIMessage)]
    for step, (at, reply) in enumerate(replies):
        rendered = engine.render(to_chat_messages(messages[:at], chat_format=BUNDLED), tools=SCHEMAS)
        wrapped = [s.text for s in rendered.segments] + [rendered.query.text]
        assert wrapped == _tool_agent_prompt(fmt, messages[:at])
        stats = reply.response_metadata["hypic"]
        assert stats["hit_segments"] + stats["miss_segments"] == 2 + step
        if step:
            assert stats["miss_segments"] == 1  # only the newest step is new to the cache
    # ToolAgent, on the same tools, takes the same steps to the same answer
    agent = ToolAgent([Tool(s, t.func) for s, t in zip(SCHEMAS, TOOLS, strict=True)], engine, max_steps=4)
    result = agent.run(_task(name))
    assert [step.call for step in result.trace[:-1]] == calls and result.answer == FORECAST


@pytest.mark.parametrize("name", list(PEOPLE)[:2])
def test_langchains_create_agent_completes_the_two_tool_task(engine, name):
    """LangChain's current agent API (``langchain.agents.create_agent``, what ``create_react_agent`` moved to)."""
    from langchain.agents import create_agent

    agent = create_agent(ChatHypic(engine=engine), tools=TOOLS)
    messages = agent.invoke({"messages": [HumanMessage(_task(name))]}, {"recursion_limit": 8})["messages"]
    calls = [(c["name"], c["args"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls == [("lookup_employee", {"name": name}), ("get_weather", {"city": PEOPLE[name]["city"]})]
    assert messages[-1].content == FORECAST and not messages[-1].tool_calls
