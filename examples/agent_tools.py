"""An agent tool loop on the bundled model, offline: two tools, a memory entry, a step cap, a trace.

python examples/agent_tools.py
"""

from __future__ import annotations

from hypic_rag.integrations.agent import AgentResult, Tool, ToolAgent, describe

EMPLOYEES = {
    "Stithgo Dithgaith": {
        "name": "Stithgo Dithgaith",
        "city": "Kothvenville",
        "company": "Krudrel Labs",
        "role": "pilot",
    }
}


def lookup_employee(name: str) -> dict:
    """Employee record by full name."""
    return EMPLOYEES[name]


def get_weather(city: str) -> dict:
    """Current weather in a city."""
    return {"city": city, "forecast": "light rain, 12 degrees"}


def main() -> AgentResult:
    agent = ToolAgent(
        [Tool.from_function(lookup_employee), Tool.from_function(get_weather)],
        memory=["The user's manager is Girsti Krumnoum."],
        max_steps=4,
    )
    result = agent.run("Look up Stithgo Dithgaith in the employee records, then get the weather in their home city.")
    print(describe(result))
    print(f"stopped: {result.stopped}; answer: {result.answer!r}")
    return result


if __name__ == "__main__":
    main()
