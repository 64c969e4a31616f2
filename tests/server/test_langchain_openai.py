"""An unmodified client: LangChain's ``ChatOpenAI`` pointed at the server runs a chain, streams, and calls tools."""

from __future__ import annotations

from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

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
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    # the server writes messages as the model reads them, as the integrations do
    expected = reference.chat(
        reference.chat_setup.format.prepare_messages(messages), max_new_tokens=16, temperature=0.0
    )
    assert answer == expected.text
    streamed = "".join(chain.stream({"context": CONTEXT, "question": "Where does Bo Ek live?"}))
    assert streamed == answer


def test_chat_openai_and_chat_hypic_report_the_same_cache_reads(server, reference):
    from hypic_rag.integrations.langchain import ChatHypic

    reference.clear_cache()
    docs = ["Ivo Sten lives in Bergen and works as a welder.", "Una Pell lives in Porto and works as a judge."]

    def ask(order: list[str]) -> list[dict]:
        parts = [{"type": "text", "text": d + "\n\n", "hypic": {"kind": "document"}} for d in order]
        return [{"role": "user", "content": [*parts, {"type": "text", "text": "Where does Ivo Sten live?"}]}]

    theirs = _llm(server, temperature=0, max_tokens=2)
    ours = ChatHypic(engine=reference, max_tokens=2)
    for order in (docs, docs[::-1]):
        over_http, in_process = theirs.invoke(ask(order)), ours.invoke(ask(order))
        read = over_http.usage_metadata["input_token_details"]["cache_read"]
        assert read == in_process.usage_metadata["input_token_details"]["cache_read"]
    assert read > 0


def test_chat_openai_tool_calls(server):
    llm = _llm(server, temperature=0, max_tokens=48).bind_tools(TOOLS)
    message = llm.invoke("Look up Stithgo Dithgaith in the employee records.")
    assert [c["name"] for c in message.tool_calls] == ["lookup_employee"]
    assert message.tool_calls[0]["args"] == {"name": "Stithgo Dithgaith"}
    assert message.usage_metadata["input_tokens"] > 0


class Product(BaseModel):
    """Search the catalogue for a product."""

    product: str = Field(description="product name")


def test_chat_openai_with_structured_output_returns_the_model(server):
    for kwargs in ({}, {"method": "function_calling"}):  # {}: the default method, json_schema
        llm = _llm(server, temperature=0, max_tokens=32).with_structured_output(Product, **kwargs)
        answer = llm.invoke("Find the Temme kettle in the catalogue.")
        assert isinstance(answer, Product) and answer.product == "Temme kettle", kwargs
    llm = _llm(server, temperature=0, max_tokens=32).with_structured_output(None, method="json_mode")
    assert isinstance(llm.invoke("Find the Temme kettle in the catalogue."), dict)


class Person(BaseModel):
    name: str
    age: int
    city: str


def test_chat_openai_structured_output_reads_a_person_from_a_document(server):
    doc = (
        "Fastos Taisbre lives in Douthbarport. Fastos Taisbre works at Palvaith Foundry. "
        "Fastos Taisbre is 33 years old."
    )
    llm = _llm(server, temperature=0, max_tokens=60).with_structured_output(Person)  # the default method
    answer = llm.invoke([("user", f"{doc}\n\nWhere does Fastos Taisbre live?")])
    assert isinstance(answer, Person) and answer.city == "Douthbarport", answer


def test_langgraph_prebuilt_agent_over_the_server_completes_the_two_tool_task(server):
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.prebuilt import create_react_agent

    from tests.integrations.test_langgraph import FORECAST, PEOPLE, TOOLS, _task

    graph = create_react_agent(_llm(server, temperature=0, max_tokens=48), tools=TOOLS)
    for name in list(PEOPLE)[:2]:
        messages = graph.invoke({"messages": [HumanMessage(_task(name))]}, {"recursion_limit": 8})["messages"]
        calls = [(c["name"], c["args"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
        assert calls == [("lookup_employee", {"name": name}), ("get_weather", {"city": PEOPLE[name]["city"]})]
        assert messages[-1].content == FORECAST


def test_langchains_create_agent_over_the_server_completes_the_two_tool_task(server):
    from langchain.agents import create_agent
    from langchain_core.messages import AIMessage, HumanMessage

    from tests.integrations.test_langgraph import FORECAST, PEOPLE, TOOLS, _task

    agent = create_agent(_llm(server, temperature=0, max_tokens=48), tools=TOOLS)
    for name in list(PEOPLE)[:2]:
        messages = agent.invoke({"messages": [HumanMessage(_task(name))]}, {"recursion_limit": 8})["messages"]
        calls = [(c["name"], c["args"]) for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
        assert calls == [("lookup_employee", {"name": name}), ("get_weather", {"city": PEOPLE[name]["city"]})]
        assert messages[-1].content == FORECAST
