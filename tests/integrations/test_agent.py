"""The agent tool loop on the bundled model: tools run on the calls the model writes, the step cap
holds, tool errors reach the trace, and every step finds the tool schemas and earlier steps cached."""

from __future__ import annotations

import pytest

from hypic_rag.eval.workloads import TOOLS
from hypic_rag.integrations.agent import Tool, ToolAgent, describe

NAME = "Stithgo Dithgaith"
PEOPLE = {NAME: {"name": NAME, "city": "Kothvenville", "company": "Krudrel Labs", "role": "pilot"}}
TASK = f"Look up {NAME} in the employee records, then get the weather in their home city."


def lookup_employee(name: str) -> dict:
    if name not in PEOPLE:
        raise KeyError(name)
    return PEOPLE[name]


def get_weather(city: str) -> dict:
    return {"city": city, "forecast": "light rain, 12 degrees"}


def _schema(name):
    return next(t for t in TOOLS if t["function"]["name"] == name)


def _tools():
    return [Tool(_schema("lookup_employee"), lookup_employee), Tool(_schema("get_weather"), get_weather)]


def test_loop_runs_the_calls_and_reuses_the_cache_at_every_step(engine):
    engine.clear_cache()
    calls = []
    agent = ToolAgent(_tools(), engine, max_steps=3, memory=["The user's manager is Girsti Krumnoum."])
    result = agent.run(TASK, on_step=calls.append)
    assert calls == result.trace and 1 <= len(result.trace) <= 3
    assert result.stopped in ("answer", "max_steps")
    if result.stopped == "answer":
        assert result.answer == result.trace[-1].text and result.trace[-1].call is None
    for i, step in enumerate(result.trace):
        if step.call is not None:  # a call of a known tool ran, and its result (or error) is recorded
            assert step.call[0] in ("lookup_employee", "get_weather")
            assert step.result is not None
        # two tool schemas, the memory entry and one segment per earlier step; after the first step,
        # only the newest step can be new to the cache (a repeated call repeats a cached segment)
        assert step.stats["hit_segments"] + step.stats["miss_segments"] == 3 + i
        assert (step.stats["miss_segments"] == 3) if i == 0 else (step.stats["miss_segments"] <= 1)
    assert describe(result).count("\n") == len(result.trace) - 1


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
