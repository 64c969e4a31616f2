"""The agent tool loop on the bundled model: it completes a task that needs two tools (the second
call uses what the first returned), every step finds the tool schemas and earlier steps cached, tool
errors reach the trace, and bad arguments are clear errors."""

from __future__ import annotations

import copy
import json

import pytest

from hypic_rag.eval.data import TOOLS
from hypic_rag.integrations.agent import Tool, ToolAgent, describe

NAME = "Stithgo Dithgaith"
PEOPLE = {NAME: {"name": NAME, "city": "Kothvenville", "company": "Krudrel Labs", "role": "pilot"}}
TASK = f"Look up {NAME} in the employee records, then get the weather in their home city."


def lookup_employee(name: str) -> dict:
    if name not in PEOPLE:
        raise KeyError(name)
    return PEOPLE[name]


FORECAST = "light rain, 12 degrees"


def get_weather(city: str) -> dict:
    return {"city": city, "forecast": FORECAST}


def _schema(name):
    return next(t for t in TOOLS if t["function"]["name"] == name)


def _tools():
    return [Tool(_schema("lookup_employee"), lookup_employee), Tool(_schema("get_weather"), get_weather)]


def test_two_tool_task_completes_and_every_step_reuses_the_cache(engine):
    engine.clear_cache()
    calls = []
    agent = ToolAgent(_tools(), engine, max_steps=4, memory=["The user's manager is Girsti Krumnoum."])
    result = agent.run(TASK, on_step=calls.append)
    assert calls == result.trace
    # the model looked the person up, used the city the lookup returned, and answered from the report
    assert [step.call for step in result.trace] == [
        ("lookup_employee", {"name": NAME}),
        ("get_weather", {"city": "Kothvenville"}),
        None,
    ]
    assert result.trace[0].result == PEOPLE[NAME] and result.trace[1].result == get_weather("Kothvenville")
    assert result.stopped == "answer" and result.answer == result.trace[-1].text == FORECAST
    for i, step in enumerate(result.trace):
        # two tool schemas, the memory entry and one segment per earlier step; after the first step,
        # only the newest step is new to the cache
        assert step.stats["hit_segments"] + step.stats["miss_segments"] == 3 + i
        assert step.stats["miss_segments"] == (3 if i == 0 else 1)
    assert describe(result).count("\n") == len(result.trace) - 1


def test_each_step_is_a_chat_request_in_the_layout_the_model_was_trained_on(engine, monkeypatch):
    seen, chat = [], engine.chat

    def spy(messages, **kwargs):
        seen.append((copy.deepcopy(messages), kwargs["tools"]))
        return chat(messages, **kwargs)

    monkeypatch.setattr(engine, "chat", spy)
    ToolAgent(_tools(), engine, memory=[" The user's manager is Girsti Krumnoum. "]).run(TASK)
    assert len(seen) == 3 and all(tools == [t.schema for t in _tools()] for _, tools in seen)
    rendered = engine.render(*seen[-1])
    record = json.dumps(PEOPLE[NAME], separators=(",", ":"), sort_keys=True)
    report = json.dumps(get_weather("Kothvenville"), separators=(",", ":"), sort_keys=True)
    assert [s.text for s in rendered.segments] == [
        f"<tool>{json.dumps(_schema('lookup_employee'), separators=(',', ':'))}</tool>\n",
        f"<tool>{json.dumps(_schema('get_weather'), separators=(',', ':'))}</tool>\n",
        "<mem>The user's manager is Girsti Krumnoum.</mem>\n",
        f'<turn>call: {{"arguments":{{"name":"{NAME}"}},"name":"lookup_employee"}}\nresult: {record}</turn>\n',
        f'<turn>call: {{"arguments":{{"city":"Kothvenville"}},"name":"get_weather"}}\nresult: {report}</turn>\n',
    ]
    assert rendered.query.text == f"<q>{TASK}</q>\n<a>"


def test_step_cap_holds(engine):
    result = ToolAgent(_tools(), engine, max_steps=1).run(TASK)
    assert result.stopped == "max_steps" and result.answer is None and len(result.trace) == 1


def test_tool_errors_reach_the_trace():
    agent = ToolAgent(_tools())
    result, error = agent._call("lookup_employee", {"name": "Nobody Known"})
    assert error == "KeyError: 'Nobody Known'" and result == {"error": error}
    result, error = agent._call("get_weather", {"town": "x"})
    assert error.startswith("TypeError") and "town" in error


def test_tool_from_function_and_bad_arguments(engine):
    tool = Tool.from_function(get_weather, "Current weather in a city.")
    assert tool.schema["function"]["parameters"]["properties"] == {"city": {"type": "string"}}
    with pytest.raises(ValueError, match="max_steps"):
        ToolAgent([tool], max_steps=0)
    with pytest.raises(ValueError, match="unique"):
        ToolAgent([tool, tool])
    with pytest.raises(ValueError, match="task is empty"):
        ToolAgent([tool], engine).run(" ")
