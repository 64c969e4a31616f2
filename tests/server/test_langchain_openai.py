"""An unmodified client: LangChain's ``ChatOpenAI`` pointed at the server runs a chain, streams, and calls tools."""

from __future__ import annotations

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI

from hypic_rag.eval.data import TOOLS

from .conftest import MODEL

SYSTEM = "Answer the question from the context."
CONTEXT = "Ana Lee lives in Oslo and works as a baker.\n\nBo Ek lives in Rome and works as a nurse."


def _llm(server: str, **kwargs) -> ChatOpenAI:
    return ChatOpenAI(base_url=server + "/v1", api_key="unused", model=MODEL, max_retries=0, **kwargs)


def test_a_chain_through_chat_openai_gets_the_engines_answer(server, reference):
    prompt = ChatPromptTemplate.from_messages([("system", SYSTEM), ("user", "{context}\n\nQuestion: {question}")])
    chain = prompt | _llm(server, temperature=0, max_tokens=16) | StrOutputParser()
    answer = chain.invoke({"context": CONTEXT, "question": "Where does Bo Ek live?"})
    user = f"{CONTEXT}\n\nQuestion: Where does Bo Ek live?"
    expected = reference.chat(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}], max_new_tokens=16, temperature=0.0
    )
    assert answer == expected.text
    streamed = "".join(chain.stream({"context": CONTEXT, "question": "Where does Bo Ek live?"}))
    assert streamed == answer


def test_chat_openai_tool_calls(server):
    llm = _llm(server, temperature=0, max_tokens=48).bind_tools(TOOLS)
    message = llm.invoke("Look up Stithgo Dithgaith in the employee records.")
    assert [c["name"] for c in message.tool_calls] == ["lookup_employee"]
    assert message.tool_calls[0]["args"] == {"name": "Stithgo Dithgaith"}
    assert message.usage_metadata["input_tokens"] > 0
