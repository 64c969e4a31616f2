"""An unmodified client: LlamaIndex's ``OpenAILike`` with its defaults (``is_chat_model=False``, so every call is a
``POST /v1/completions``) completes, streams and answers chat messages against the server."""

from __future__ import annotations

import asyncio

from llama_index.core.llms import ChatMessage
from llama_index.llms.openai_like import OpenAILike

from hypic_rag.server.completions import prompt_segments

from .conftest import MODEL

PROMPT = (
    "Context:\nAna Lee lives in Oslo and works as a baker.\n\nBo Ek lives in Rome and works as a nurse.\n\n"
    "Question: where does Bo Ek live?\nAnswer:"
)


def _llm(server: str, **kwargs) -> OpenAILike:
    return OpenAILike(model=MODEL, api_base=server + "/v1", api_key="unused", max_retries=0, **kwargs)


def test_openai_like_with_its_defaults_completes(server, reference):
    llm = _llm(server, max_tokens=8, temperature=0.0)
    assert not llm.metadata.is_chat_model  # the default: the completions route
    reply = llm.complete(PROMPT)
    segments, query = prompt_segments(PROMPT)
    assert reply.text == reference.generate(segments, query, max_new_tokens=8, temperature=0.0).text
    assert reply.raw.usage.prompt_tokens > 0 and reply.raw.object == "text_completion"  # the openai client's
    assert "".join(r.delta for r in llm.stream_complete(PROMPT)) == reply.text
    assert asyncio.run(llm.acomplete(PROMPT)).text == reply.text
    # chat messages too, written into one prompt by LlamaIndex itself
    chat = llm.chat([ChatMessage(role="user", content="Where does Bo Ek live?")])
    assert chat.message.role == "assistant" and isinstance(chat.message.content, str)


def test_openai_like_repeats_find_reordered_documents(server):
    llm = _llm(server, max_tokens=2)
    docs = ["Cy Ru lives in Lima and works as a pilot.", "Dee Ox lives in Kyiv and works as a cook."]

    def ask(order):
        return llm.complete("Context:\n" + "\n\n".join(order) + "\n\nQuestion: where does Cy Ru live?\nAnswer:")

    first, second = ask(docs), ask(docs[::-1])
    assert first.raw.usage.prompt_tokens_details.cached_tokens == 0
    assert 0 < second.raw.usage.prompt_tokens_details.cached_tokens < second.raw.usage.prompt_tokens


def test_function_agent_over_http_sees_the_prompt_it_sees_in_process(server):
    """LlamaIndex sends a tool's returned dict as a Python literal; the server normalises it as ``HypicLLM``
    does in process (``format_tool_result``), so the bundled model reads the result it was trained on."""
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool

    name, city, forecast = "Stithgo Dithgaith", "Kothvenville", "light rain, 12 degrees"

    def lookup_employee(name: str) -> dict:
        """Employee record by full name."""
        return {"name": name, "city": city, "company": "Krudrel Labs", "role": "pilot"}

    def get_weather(city: str) -> dict:
        """Current weather in a city."""
        return {"city": city, "forecast": forecast}

    tools = [FunctionTool.from_defaults(fn=lookup_employee), FunctionTool.from_defaults(fn=get_weather)]
    llm = _llm(server, is_chat_model=True, is_function_calling_model=True, temperature=0.0, max_tokens=64)
    task = f"Look up {name} in the employee records, then get the weather in their home city."
    for _ in range(2):
        agent = FunctionAgent(tools=tools, llm=llm)

        async def run(agent=agent):
            from llama_index.core.agent.workflow import ToolCallResult

            handler = agent.run(task, max_iterations=6)
            calls = [
                (e.tool_name, e.tool_kwargs) async for e in handler.stream_events() if isinstance(e, ToolCallResult)
            ]
            return calls, await handler

        calls, answer = asyncio.run(run())
        assert calls == [("lookup_employee", {"name": name}), ("get_weather", {"city": city})]
        assert str(answer) == forecast
