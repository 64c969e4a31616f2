"""An unmodified client: LlamaIndex's ``OpenAILike`` with its defaults (``is_chat_model=False``, so every call is a
``POST /v1/completions``) completes, streams and answers chat messages against the server."""

from __future__ import annotations

import asyncio

import pytest
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


@pytest.mark.parametrize("is_chat_model", [True, False], ids=["chat", "completions"])
def test_the_default_query_engine_answers_through_openai_like(server, is_chat_model):
    """``as_query_engine()`` over ``OpenAILike``: as a chat model (LlamaIndex's text-QA chat prompt on the chat
    route) and with its defaults (its completion prompt on the completions route, flat text)."""
    from llama_index.core import Settings, VectorStoreIndex
    from llama_index.core.schema import TextNode

    from hypic_rag.eval.data import corpus
    from hypic_rag.integrations.llamaindex import MiniLMEmbedding

    texts, qa = corpus(16, seed=12)
    Settings.llm = None
    index = VectorStoreIndex([TextNode(text=t, id_=str(i)) for i, t in enumerate(texts)], embed_model=MiniLMEmbedding())
    llm = _llm(server, max_tokens=24, temperature=0.0, is_chat_model=is_chat_model)
    query_engine = index.as_query_engine(llm=llm)
    eight = [4 * person + k for person in (2, 9) for k in range(4)]
    answers = [(query_engine.query(qa[i][0]).response.strip(), qa[i][1]) for i in eight]
    assert sum(got == want for got, want in answers) >= (7 if is_chat_model else 6), answers


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
