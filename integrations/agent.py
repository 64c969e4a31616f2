"""An agent tool loop on the engine: each step is a chat request (``Engine.chat``) whose tool schemas,
memory entries and earlier steps the checkpoint's template makes segments, so each step recomputes
only its seams, the newest step and the task.

    agent = ToolAgent(tools=[Tool.from_function(lookup_employee, "Employee record by full name.")])
    result = agent.run("Look up Ana Lee in the employee records, then get the weather in their home city.")
    result.answer, result.trace

Written here rather than on LangChain's agent runtime (which pulls in langgraph) because the loop is a
dozen lines and each step's messages must keep the form the model was trained on: the task as the
user's question after the memory entries, each step an assistant ``tool_calls`` message and a ``tool``
message (``chat.formats.bundled.tool_step``).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from hypic_rag import Engine
from hypic_rag.chat.formats.bundled import tool_step

from .prompting import default_engine

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean"}


@dataclass
class Tool:
    """A callable with its OpenAI-format function schema."""

    schema: dict
    fn: Callable[..., Any]

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @classmethod
    def from_function(cls, fn: Callable[..., Any], description: str | None = None) -> Tool:
        """Schema from the signature: each parameter is required, typed from its annotation."""
        props: dict[str, dict] = {}
        for p in inspect.signature(fn).parameters.values():
            annotation = p.annotation if p.annotation is not inspect.Parameter.empty else str
            if isinstance(annotation, str):  # postponed annotations
                annotation = {"int": int, "float": float, "bool": bool}.get(annotation, str)
            props[p.name] = {"type": _JSON_TYPES.get(annotation, "string")}
        desc = description or (inspect.getdoc(fn) or fn.__name__).splitlines()[0]
        params = {"type": "object", "properties": props, "required": list(props)}
        function = {"name": fn.__name__, "description": desc, "parameters": params}
        return cls({"type": "function", "function": function}, fn)


@dataclass
class AgentStep:
    """One model call: the tool call it made (or None for the final answer), the result, and its stats."""

    text: str
    call: tuple[str, dict] | None
    result: Any = None
    error: str | None = None
    ttft_s: float = 0.0
    stats: dict = field(default_factory=dict)


@dataclass
class AgentResult:
    answer: str | None
    trace: list[AgentStep]
    stopped: str  # "answer" or "max_steps"


class ToolAgent:
    """Calls tools until the model answers in plain text, or ``max_steps`` model calls have run."""

    def __init__(
        self,
        tools: Sequence[Tool],
        engine: Engine | None = None,
        *,
        memory: Sequence[str] = (),
        max_steps: int = 4,
        mode: str = "hypic",
        max_new_tokens: int = 64,
        tool_timeout_s: float = 30.0,
    ) -> None:
        """``tool_timeout_s`` bounds each tool call: a tool still running then becomes an error result (its
        thread is left to finish; Python cannot stop it)."""
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ValueError(f"max_steps must be an integer >= 1, got {max_steps!r}")
        if isinstance(memory, str) or not all(isinstance(m, str) for m in memory):
            raise ValueError("memory must be a list of strings, one per memory entry")
        if isinstance(tool_timeout_s, bool) or not isinstance(tool_timeout_s, (int, float)) or not tool_timeout_s > 0:
            raise ValueError(f"tool_timeout_s must be a number > 0, got {tool_timeout_s!r}")
        if not all(isinstance(t, Tool) for t in tools):
            raise ValueError("tools must be a list of Tool (Tool.from_function(fn) makes one)")
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.tools = {t.name: t for t in tools}
        self.engine = engine
        self.memory = list(memory)
        self.max_steps = max_steps
        self.mode = mode
        self.max_new_tokens = max_new_tokens
        self.tool_timeout_s = float(tool_timeout_s)

    def _call(self, name: str, args: dict) -> tuple[Any, str | None]:
        """The tool's result, or an error result the model sees (and may recover from): an exception, a call
        past ``tool_timeout_s``, or a result that JSON cannot encode."""
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tool-{name}")
        try:
            result = pool.submit(self.tools[name].fn, **args).result(timeout=self.tool_timeout_s)
            json.dumps(result)
        except FutureTimeout:
            error = f"TimeoutError: {name} did not return within {self.tool_timeout_s:g} s"
            return {"error": error}, error
        except Exception as exc:  # the tool raised, or its result is not JSON
            error = f"{type(exc).__name__}: {exc}"
            return {"error": error}, error
        finally:
            pool.shutdown(wait=False)
        return result, None

    def run(self, task: str, on_step: Callable[[AgentStep], None] | None = None) -> AgentResult:
        if not task.strip():
            raise ValueError("the task is empty")
        engine = self.engine or default_engine()
        schemas = [t.schema for t in self.tools.values()]
        memory = [{"type": "text", "text": m.strip(), "hypic": {"kind": "memory"}} for m in self.memory]
        messages = [{"role": "user", "content": [*memory, {"type": "text", "text": task}]}]
        trace: list[AgentStep] = []
        for i in range(self.max_steps):
            out = engine.chat(
                messages,
                tools=schemas,
                mode=self.mode,
                max_new_tokens=self.max_new_tokens,
                temperature=0.0,
                segmentation="auto",
            )
            calls = [c for c in out.tool_calls if c["name"] in self.tools]
            call = (calls[0]["name"], calls[0]["arguments"]) if calls else None
            text = engine.decode(out.token_ids).strip() if out.tool_calls else (out.text or "").strip()
            step = AgentStep(text, call, ttft_s=out.ttft_s, stats=out.stats)
            trace.append(step)
            if call is None:
                if on_step is not None:
                    on_step(step)
                return AgentResult(text, trace, "answer")
            step.result, step.error = self._call(*call)
            if on_step is not None:
                on_step(step)
            messages += tool_step(f"call_{i}", call[0], call[1], step.result)
        return AgentResult(None, trace, "max_steps")


def describe(result: AgentResult) -> str:
    """The trace as readable lines."""
    lines = []
    for i, step in enumerate(result.trace, 1):
        hits = f"{step.stats.get('hit_segments', 0)} hits"
        if step.call is None:
            lines.append(f"{i}. answer: {step.text}  ({hits})")
        else:
            result = json.dumps(step.result, default=str)
            lines.append(f"{i}. {step.call[0]}({json.dumps(step.call[1])}) -> {result}  ({hits})")
    return "\n".join(lines)
