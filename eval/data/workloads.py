"""Nine synthetic RAG and agent workloads over a fictional world, deterministic per seed.

    make("single_doc", n=200, seed=1) -> list[Example]

Every example draws fresh fictional people, places, organisations and products (from ``pools``), so
answers can only come from the prompt's segments, never from memory. An example is OpenAI-style
``messages`` and ``tools``: one user message whose text parts are its documents, memory entries and
turns (each tagged ``"hypic": {"kind": ...}``), then the question as plain text; an agent step's earlier
calls are assistant ``tool_calls`` with ``tool`` results. A checkpoint's chat template makes the prompt
(``render``, ``Engine.chat``); the bundled model's wraps each piece in its tag, so the same piece is the
same segment and the same tokens wherever it appears. ``corpus`` builds the demo's knowledge base from
the same people; ``longbench`` reads and writes these examples in LongBench's schema.

- ``single_doc``: one of 4-12 documents states the answer (F1).
- ``multi_hop``: a fact in one document leads to the answer in another (F1).
- ``aggregate``: a list gathered over several documents (F1).
- ``tool_call``: 4-8 OpenAI-format tool schemas; the query needs exactly one call, whose arguments
  come from the query or a document; the answer is the call as JSON (exact match of the parsed call).
- ``memory``: memory entries and earlier turns; the query needs one remembered fact (F1).
- ``framework_qa``: ``single_doc`` in a framework's default prompt (F1).
- ``conversation``: a conversation asked turn by turn: documents and a first question, more questions, a document
  added mid-conversation, a tool call and its result; the last question asks a fact from any of them (F1). Its
  ``meta["turns"]`` says where the earlier turns were asked: the harness asks them first, in the same mode.
- ``open_single_doc`` and ``open_multi_doc``: the held-out split. A person's facts in the model's own sentences,
  in one document or among 4-6, with names, places, companies and jobs from the held-out namers (``names``) and a
  question worded as no training example is (exact match): what the model does with names it has never seen.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hypic_rag.chat.formats.bundled import BUNDLED, bundled_template, format_call, tool_step
from hypic_rag.chat.segmentation import RenderedPrompt, segment_prompt
from hypic_rag.chat.template import ChatTemplate
from hypic_rag.segments import Segment

from .names import OpenWorld
from .pools import COLORS, DAYS, FORECASTS, PETS, World

WORKLOADS = (
    "single_doc",
    "multi_hop",
    "aggregate",
    "tool_call",
    "memory",
    "framework_qa",
    "conversation",
    "open_single_doc",
    "open_multi_doc",
)
# What a workload draws its names from: the pools (``World``), or, for training, the open-vocabulary namers.
Worlds = Callable[[random.Random], "World | OpenWorld"]
NAMES = {"pools": World, "open": lambda rng: OpenWorld(rng, "training")}
# Scored, never trained on: the held-out split (``names.HELD_OUT``).
HELD_OUT_WORKLOADS = ("open_single_doc", "open_multi_doc")
WORKLOAD_METRICS = {
    "single_doc": "f1",
    "multi_hop": "f1",
    "aggregate": "f1",
    "tool_call": "tool_call",
    "memory": "f1",
    "framework_qa": "f1",
    "conversation": "f1",
    "open_single_doc": "exact_match",
    "open_multi_doc": "exact_match",
}
# The prompts RAG frameworks send by default, word for word (a test holds them to the installed libraries):
# LlamaIndex's text-QA prompt, as a chat (its system prompt, then the context and the query in one user message)
# and as the completions route's one prompt; LangChain's RAG prompt of its tutorials (the hub's rlm/rag-prompt).
LLAMAINDEX_QA_SYSTEM = (
    "You are an expert Q&A system that is trusted around the world.\nAlways answer the query using the provided "
    "context information, and not prior knowledge.\nSome rules to follow:\n1. Never directly reference the given "
    "context in your answer.\n2. Avoid statements like 'Based on the context, ...' or 'The context information "
    "...' or anything along those lines."
)
LLAMAINDEX_QA = (
    "Context information is below.\n---------------------\n{context_str}\n---------------------\nGiven the "
    "context information and not prior knowledge, answer the query.\nQuery: {query_str}\nAnswer: "
)
LANGCHAIN_RAG = (
    "You are an assistant for question-answering tasks. Use the following pieces of retrieved context to answer "
    "the question. If you don't know the answer, just say that you don't know. Use three sentences maximum and keep "
    "the answer concise.\nQuestion: {question} \nContext: {context} \nAnswer:"
)
# "completions_route" is LlamaIndex's completion prompt sent to the completions route, as ``OpenAILike``'s defaults
# send it: flat text, no chat template (``meta["completion"]``).
FRAMEWORK_FORMS = ("llamaindex_chat", "llamaindex_completion", "langchain_rag", "completions_route")
# How an example's prompt is cut into segments (``segment_prompt``): its tagged parts, and also the tool
# schemas and tool results, which ``explicit`` would leave to run in context as template glue.
SEGMENTATION = "auto"


def part(kind: str, text: str) -> dict:
    """A text part that is one segment of ``kind`` (``document``, ``memory``, ``turn`` ...)."""
    return {"type": "text", "text": text, "hypic": {"kind": kind}}


def ask(parts: Sequence[dict], question: str) -> dict:
    """The user message: ``parts``, then the question as plain text."""
    return {"role": "user", "content": [*parts, {"type": "text", "text": question}]}


@dataclass
class Example:
    messages: list[dict]  # OpenAI-style chat messages
    answers: list[str]
    metric: str
    tools: list[dict] | None = None  # OpenAI function schemas
    workload: str = ""
    # "id"; "qa": every (question, answer) the segments support; "reasoning": the worked step, by question
    meta: dict = field(default_factory=dict)

    def _question_at(self) -> int:
        return max(i for i, m in enumerate(self.messages) if m["role"] == "user")

    @property
    def query(self) -> str:
        """The question: the plain text of the last user message."""
        content = self.messages[self._question_at()]["content"]
        return content if isinstance(content, str) else "".join(p["text"] for p in content if "hypic" not in p)

    def asking(self, question: str) -> list[dict]:
        """The messages with ``question`` in place of the example's own."""
        at = self._question_at()
        content = self.messages[at]["content"]
        parts = [] if isinstance(content, str) else [p for p in content if "hypic" in p]
        return [*self.messages[:at], {**self.messages[at], **ask(parts, question)}, *self.messages[at + 1 :]]

    @property
    def segments(self) -> list[Segment]:
        """The segments of the prompt the bundled model's template makes (``render``)."""
        return render(self).segments


def render(ex: Example, template: ChatTemplate | None = None, *, question: str | None = None) -> RenderedPrompt:
    """``ex``'s prompt through ``template`` (the bundled model's by default), cut into
    segments as ``Engine.chat`` cuts it; ``question`` asks another of the questions its pieces support. On the
    bundled model's template the messages are first written as its integrations and server write a
    framework's (``Bundled.prepare_messages``), so a model trains on what it is served: a no-op for the
    workloads written in its form, the paragraphs of a framework's flat prompt cut into documents."""
    messages = ex.messages if question is None else ex.asking(question)
    if template is None:
        messages = BUNDLED.prepare_messages(messages, SEGMENTATION)
    return segment_prompt(template or bundled_template(), messages, tools=ex.tools, segmentation=SEGMENTATION)


def person_doc(w: World | OpenWorld, rng: random.Random) -> dict:
    """A fictional person: a name, a home city, an employer, a role and an age."""
    return {
        "name": w.person(),
        "city": w.city(),
        "org": w.org(),
        "role": w.role(),
        "age": rng.randint(21, 79),
    }


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _describe_person(p: dict, rng: random.Random) -> str:
    """One of four phrasings; the last is the demo's profile document (its one-fact sentences, in any
    order), so the model trains on the shape its demo serves."""
    name, role = p["name"], p["role"]
    form = rng.randrange(4)
    if form == 3:
        return profile_text(p, rng)
    return [
        f"{name} lives in {p['city']} and works at {p['org']} as {_a(role)}. {name} is {p['age']} years old.",
        f"{name} is {_a(role)} at {p['org']}. Age: {p['age']}. Home city: {p['city']}.",
        f"Profile of {name}: {p['age']} years old, {role} at {p['org']}, based in {p['city']}.",
    ][form]


PERSON_QUESTIONS = [
    ("city", "Where does {name} live?"),
    ("org", "Which company does {name} work for?"),
    ("role", "What is the job of {name}?"),
    ("age", "How old is {name}?"),
]


def _single_doc(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    w = world(rng)
    people = [person_doc(w, rng) for _ in range(rng.randint(*size["single_doc"]))]
    qa = [(q.format(name=p["name"]), str(p[k])) for p in people for k, q in PERSON_QUESTIONS]
    rng.shuffle(qa)
    docs = [part("document", _describe_person(p, rng)) for p in people]
    return Example([ask(docs, qa[0][0])], [qa[0][1]], "f1", meta={"qa": qa})


def _framework_qa(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    """``single_doc``'s documents and questions in a framework's default prompt (``FRAMEWORK_FORMS``), the
    documents joined by blank lines into its context as the framework joins retrieved nodes: what a user of the
    framework sends without writing a prompt. One question an example (the wording holds it). A completions-route
    example keeps its flat prompt in ``meta["completion"]``: served without the chat template (``flat_prompt``)."""
    w = world(rng)
    people = [person_doc(w, rng) for _ in range(rng.randint(*size["single_doc"]))]
    question, answer = rng.choice([(q.format(name=p["name"]), str(p[k])) for p in people for k, q in PERSON_QUESTIONS])
    context = "\n\n".join(_describe_person(p, rng) for p in people)
    form = rng.choice(FRAMEWORK_FORMS)
    if form == "langchain_rag":
        messages = [{"role": "user", "content": LANGCHAIN_RAG.format(question=question, context=context)}]
    else:
        prompt = LLAMAINDEX_QA.format(context_str=context, query_str=question)
        system = [{"role": "system", "content": LLAMAINDEX_QA_SYSTEM}] if form == "llamaindex_chat" else []
        messages = [*system, {"role": "user", "content": prompt}]
        if form == "completions_route":
            return Example(messages, [answer], "f1", meta={"form": form, "completion": prompt})
    return Example(messages, [answer], "f1", meta={"form": form})


def person_facts(p: dict) -> dict[str, str]:
    """One sentence per attribute of a person, keyed like ``PERSON_QUESTIONS``."""
    name = p["name"]
    return {
        "city": f"{name} lives in {p['city']}.",
        "org": f"{name} works at {p['org']}.",
        "role": f"{name} is {_a(p['role'])}.",
        "age": f"{name} is {p['age']} years old.",
    }


def profile_text(p: dict, rng: random.Random) -> str:
    """The person's one-fact sentences in a shuffled order: the demo's profile document."""
    facts = list(person_facts(p).values())
    rng.shuffle(facts)
    return " ".join(facts)


def hop_qa(people: list[dict], hq: dict[str, str]) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """``multi_hop``'s question for each person, and the reasoning that answers it, keyed by question:
    the fact the first hop finds, written out (a model may think it before answering; training does)."""
    qa = [(f"In which city is the company that employs {p['name']} headquartered?", hq[p["org"]]) for p in people]
    reasoning = {q: headquarters(p["org"], a) for p, (q, a) in zip(people, qa, strict=True)}
    return qa, reasoning


def headquarters(org: str, city: str) -> str:
    """The sentence ``multi_hop``'s second hop reads, in a document and in the reasoning alike."""
    return f"{org} is headquartered in {city}."


def list_qa(people: list[dict]) -> list[tuple[str, str]]:
    """``aggregate``'s question for each city the people live in, and every name there, in their order."""
    return [
        (f"Who lives in {city}? List every name.", ", ".join(p["name"] for p in people if p["city"] == city))
        for city in dict.fromkeys(p["city"] for p in people)
    ]


def _multi_hop(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    w = world(rng)
    people = [person_doc(w, rng) for _ in range(rng.randint(*size["multi_hop"]))]
    hq = {p["org"]: w.city() for p in people}
    texts = [_describe_person(p, rng) for p in people]
    texts += [headquarters(org, city) for org, city in hq.items()]
    rng.shuffle(texts)
    qa, reasoning = hop_qa(people, hq)
    rng.shuffle(qa)
    docs = [part("document", t) for t in texts]
    return Example([ask(docs, qa[0][0])], [qa[0][1]], "f1", meta={"qa": qa, "reasoning": reasoning})


def _aggregate(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    w = world(rng)
    cities = [w.city() for _ in range(3)]
    people = []
    for _ in range(rng.randint(*size["aggregate"])):
        p = person_doc(w, rng)
        p["city"] = rng.choice(cities)
        people.append(p)
    qa = list_qa(people)
    rng.shuffle(qa)
    docs = [part("document", _describe_person(p, rng)) for p in people]
    return Example([ask(docs, qa[0][0])], [qa[0][1]], "f1", meta={"qa": qa})


def _tool(name: str, description: str, params: dict[str, str]) -> dict:
    props = {
        k: {"type": "integer" if t == "int" else "string", "description": t if t != "int" else "a number"}
        for k, t in params.items()
    }
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": list(params)},
        },
    }


TOOLS = [
    _tool("get_weather", "Current weather in a city.", {"city": "city name"}),
    _tool("lookup_employee", "Employee record by full name.", {"name": "full name"}),
    _tool(
        "convert_currency",
        "Convert an amount between currencies.",
        {"amount": "int", "from_currency": "code", "to_currency": "code"},
    ),
    _tool("book_room", "Book a meeting room for an hour of the day.", {"room": "room name", "hour": "int"}),
    _tool("set_timer", "Start a timer.", {"minutes": "int"}),
    _tool("get_stock_price", "Latest price of a company's stock.", {"company": "company name"}),
    _tool("send_email", "Send an email.", {"to": "full name", "subject": "subject line"}),
    _tool("find_product", "Search the catalogue for a product.", {"product": "product name"}),
    _tool("translate", "Translate a word.", {"word": "the word", "language": "target language"}),
]
_CURRENCIES = ["EUR", "USD", "JPY", "GBP", "CHF", "SEK"]
_LANGUAGES = ["French", "Swahili", "Korean", "Finnish", "Portuguese"]


Call = tuple[str, dict, str, list[str]]  # tool name, arguments, query, documents the query relies on


def _weather(w: World, rng: random.Random) -> Call:
    if rng.random() < 0.5:
        city = w.city()
        return "get_weather", {"city": city}, f"What is the weather in {city} right now?", []
    p = person_doc(w, rng)  # the argument comes from a document
    return (
        "get_weather",
        {"city": p["city"]},
        f"What is the weather where {p['name']} lives?",
        [_describe_person(p, rng)],
    )


def _stock(w: World, rng: random.Random) -> Call:
    p = person_doc(w, rng)
    query = f"What is the stock price of {p['name']}'s employer?"
    return "get_stock_price", {"company": p["org"]}, query, [_describe_person(p, rng)]


def _employee(w: World, rng: random.Random) -> Call:
    name = w.person()
    return "lookup_employee", {"name": name}, f"Pull up the employee record of {name}.", []


def _currency(w: World, rng: random.Random) -> Call:
    amount, src, dst = rng.randint(2, 900), *rng.sample(_CURRENCIES, 2)
    args = {"amount": amount, "from_currency": src, "to_currency": dst}
    return "convert_currency", args, f"Convert {amount} {src} to {dst}.", []


def _room(w: World, rng: random.Random) -> Call:
    room, hour = w.city(), rng.randint(8, 18)
    return "book_room", {"room": room, "hour": hour}, f"Book the {room} room at {hour} o'clock.", []


def _timer(w: World, rng: random.Random) -> Call:
    minutes = rng.randint(1, 90)
    return "set_timer", {"minutes": minutes}, f"Set a timer for {minutes} minutes.", []


def _email(w: World, rng: random.Random) -> Call:
    name = w.person()
    return "send_email", {"to": name, "subject": "Lunch"}, f"Email {name} with the subject Lunch.", []


def _product(w: World, rng: random.Random) -> Call:
    product = w.product()
    return "find_product", {"product": product}, f"Find the {product} in the catalogue.", []


def _translate(w: World, rng: random.Random) -> Call:
    word, language = rng.choice(["river", "window", "garden", "candle"]), rng.choice(_LANGUAGES)
    return "translate", {"word": word, "language": language}, f"Translate {word} into {language}.", []


_CALLS = [_weather, _stock, _employee, _currency, _room, _timer, _email, _product, _translate]


def _tool_call(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    w = world(rng)
    name, args, query, doc_texts = rng.choice(_CALLS)(w, rng)
    others = [t for t in TOOLS if t["function"]["name"] != name]
    tools = rng.sample(others, rng.randint(*size["tool_call"])) + [t for t in TOOLS if t["function"]["name"] == name]
    rng.shuffle(tools)
    for _ in range(rng.randint(0, 2)):  # distractor documents
        doc_texts.append(_describe_person(person_doc(w, rng), rng))
    rng.shuffle(doc_texts)
    docs = [part("document", t) for t in doc_texts]
    return Example([ask(docs, query)], [format_call(name, args)], "tool_call", copy.deepcopy(tools))


def _memory(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    w = world(rng)
    pet, pet_name, color = rng.choice(PETS), w.pet_name(), rng.choice(COLORS)
    town, day, manager = w.city(), rng.choice(DAYS), w.person()
    facts = {  # (memory entry, question, answer)
        "pet": (f"The user's {pet} is called {pet_name}.", "What is my pet called?", pet_name),
        "color": (f"The user's favourite colour is {color}.", "What is my favourite colour?", color),
        "hometown": (f"The user grew up in {town}.", "Where did I grow up?", town),
        "day": (f"The user's weekly team meeting is on {day}.", "On which day is my team meeting?", day),
        "manager": (f"The user's manager is {manager}.", "Who is my manager?", manager),
    }
    keys = rng.sample(list(facts), rng.randint(3, 5))
    parts = [part("memory", facts[k][0]) for k in keys]
    for _ in range(rng.randint(*size["memory"])):
        topic = rng.choice(["the weather", "a recipe", "train times", "a book"])
        parts.append(part("turn", f"user: Tell me about {topic}.\nassistant: Here is a short note on {topic}."))
    rng.shuffle(parts)
    qa = [facts[k][1:] for k in keys]
    rng.shuffle(qa)
    return Example([ask(parts, qa[0][0])], [qa[0][1]], "f1", meta={"qa": qa})


def employee_record(p: dict) -> dict:
    """What ``lookup_employee`` returns for a person (the agent workload's first tool)."""
    return {"name": p["name"], "city": p["city"], "company": p["org"], "role": p["role"]}


def weather_report(city: str, rng: random.Random) -> dict:
    return {"city": city, "forecast": f"{rng.choice(FORECASTS)}, {rng.randint(-5, 35)} degrees"}


def _agent(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    """One step of a tool loop: the task, then the earlier calls and their results (each a ``turn``
    segment); the answer is the next call, or the final answer once the last result is in."""
    w = world(rng)
    p = person_doc(w, rng)
    price = f"{rng.randint(10, 999)}.{rng.randint(0, 99):02d}"
    plans = [
        (
            f"Look up {p['name']} in the employee records, then get the weather in their home city.",
            [("lookup_employee", {"name": p["name"]}, employee_record(p)), ("get_weather", {"city": p["city"]}, None)],
            "forecast",
        ),
        (
            f"Look up {p['name']} in the employee records, then get the stock price of their company.",
            [
                ("lookup_employee", {"name": p["name"]}, employee_record(p)),
                ("get_stock_price", {"company": p["org"]}, {"company": p["org"], "price": price}),
            ],
            "price",
        ),
        (
            f"Get the weather in {p['city']}.",
            [("get_weather", {"city": p["city"]}, None)],
            "forecast",
        ),
    ]
    task, steps, field_name = rng.choice(plans)
    steps = [(n, a, r if r is not None else weather_report(a["city"], rng)) for n, a, r in steps]
    needed = {n for n, _, _ in steps}
    tools = [t for t in TOOLS if t["function"]["name"] in needed]
    tools += rng.sample([t for t in TOOLS if t["function"]["name"] not in needed], rng.randint(*size["agent"]))
    rng.shuffle(tools)
    done = rng.randint(0, len(steps))
    messages = [ask([], task)]
    for i, (name, args, result) in enumerate(steps[:done]):
        messages += tool_step(f"call_{i}", name, args, result)
    tools = copy.deepcopy(tools)
    if done < len(steps):
        name, args, _ = steps[done]
        return Example(messages, [format_call(name, args)], "tool_call", tools)
    return Example(messages, [str(steps[-1][2][field_name])], "f1", tools)


def _conversation(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    """Documents and a first question, then more questions (each answered right in the history), a document
    added mid-conversation with a question on it, a tool call whose result answers the next question; the
    last question asks again a fact from any of them. ``meta["turns"]``: the message counts at which the earlier
    questions were asked, so a harness can ask them first as a live conversation would."""
    w = world(rng)
    people = [person_doc(w, rng) for _ in range(rng.randint(*size["single_doc"]) + 2)]
    first, late, looked = people[:-2], people[-2], people[-1]

    def questions(p: dict) -> list[tuple[str, str]]:
        return [(q.format(name=p["name"]), str(p[k])) for k, q in PERSON_QUESTIONS]

    messages: list[dict] = []
    turns: list[int] = []
    asked: list[tuple[str, str]] = []

    def turn(parts: list[dict], qa: tuple[str, str]) -> None:
        messages.append(ask(parts, qa[0]))
        turns.append(len(messages))
        messages.append({"role": "assistant", "content": qa[1]})
        asked.append(qa)

    pool = [qa for p in first for qa in questions(p)]
    rng.shuffle(pool)
    turn([part("document", _describe_person(p, rng)) for p in first], pool.pop())
    for _ in range(rng.randint(*size["conversation"])):
        turn([], pool.pop())
    turn([part("document", _describe_person(late, rng))], rng.choice(questions(late)))
    messages.append(ask([], f"Look up {looked['name']} in the employee records."))
    turns.append(len(messages))
    messages += tool_step("call_0", "lookup_employee", {"name": looked["name"]}, employee_record(looked))
    turn([], rng.choice([qa for qa in questions(looked) if not qa[0].startswith("How old")]))
    last = rng.choice([*pool, *asked])  # a fact from the first documents, the late one or the tool's result
    messages.append(ask([], last[0]))
    tools = copy.deepcopy([t for t in TOOLS if t["function"]["name"] == "lookup_employee"])
    return Example(messages, [last[1]], "f1", tools, meta={"turns": turns})


# How many documents / people / tools / turns an example draws: the workloads as specified, and a
# small variant (fewer pieces, shorter prompts) that training uses first, where attention over a
# short context learns to find things sooner.
# The held-out split's wordings: no training example asks this way.
HELD_OUT_QUESTIONS = [
    ("city", "In which city does {name} reside?"),
    ("org", "{name} is employed by which company?"),
    ("role", "What does {name} do for a living?"),
    ("age", "What is the age of {name}?"),
]


def _held_out(rng: random.Random, documents: int) -> Example:
    w = OpenWorld(rng, "held_out")
    people = [person_doc(w, rng) for _ in range(documents)]
    docs = [part("document", profile_text(p, rng)) for p in people]
    p = rng.choice(people)
    key, question = rng.choice(HELD_OUT_QUESTIONS)
    return Example(
        [ask(docs, question.format(name=p["name"]))], [str(p[key])], "exact_match", meta={"key": key, "name": p["name"]}
    )


def _open_single_doc(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    return _held_out(rng, 1)


def _open_multi_doc(rng: random.Random, size: dict[str, tuple[int, int]], world: Worlds = World) -> Example:
    return _held_out(rng, rng.randint(4, 6))


SIZES = {
    "single_doc": (4, 12),
    "multi_hop": (3, 6),
    "aggregate": (5, 10),
    "tool_call": (3, 7),
    "memory": (1, 3),
    "agent": (1, 4),
    "conversation": (1, 3),
}
SMALL_SIZES = {
    "single_doc": (2, 4),
    "multi_hop": (2, 3),
    "aggregate": (3, 5),
    "tool_call": (1, 3),
    "memory": (0, 1),
    "agent": (0, 2),
    "conversation": (0, 1),
}

_MAKERS = {
    "single_doc": _single_doc,
    "multi_hop": _multi_hop,
    "aggregate": _aggregate,
    "tool_call": _tool_call,
    "memory": _memory,
    "framework_qa": _framework_qa,
    "conversation": _conversation,
    "open_single_doc": _open_single_doc,
    "open_multi_doc": _open_multi_doc,
    "agent": _agent,  # training mix and the agent loop's tests; not one of the scored workloads
}


def make(workload: str, n: int, seed: int, small: bool = False, names: str = "pools") -> list[Example]:
    """``n`` examples of ``workload``; the same (workload, n, seed) always gives the same examples.
    ``small`` draws fewer pieces per example (a training curriculum), from another stream; ``names``: ``pools``
    (the scored workloads' names) or ``open`` (``names.TRAINING``'s fresh words, for training to copy)."""
    if workload not in _MAKERS:
        raise ValueError(f"unknown workload {workload!r}; expected one of {', '.join(_MAKERS)}")
    if names not in NAMES:
        raise ValueError(f"names must be one of {', '.join(NAMES)}, not {names!r}")
    if names != "pools" and workload in HELD_OUT_WORKLOADS:
        raise ValueError(f"{workload} draws its own held-out names")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    rng = random.Random(f"{workload}:{seed}" + (":small" if small else "") + (f":{names}" if names != "pools" else ""))
    size = SMALL_SIZES if small else SIZES
    out = []
    for i in range(n):
        ex = _MAKERS[workload](rng, size, NAMES[names])
        ex.workload = workload
        ex.meta["id"] = f"{workload}-{seed}-{i}"
        out.append(ex)
    return out
