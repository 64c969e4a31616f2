"""Recall drills: the copying practice training runs before and beside the workloads.

- ``kv_drills``: dense key-value recall on the pools' one-token names, the first phase of training.
- ``recall_examples``: key-value documents as workload examples, each followed by questions about it.
- ``key_examples``: recall keyed on companies and places as well as names.
- ``hop_examples`` and ``list_examples``: ``multi_hop`` and ``aggregate`` cut to their skill, one short
  sentence per document, so most of the tokens trained on are the skill's.
- ``relation_examples``: recall across a relation's words, keys sharing their last word.
- ``sentence_drills``: ``relation_examples``' sentences as dense token drills, every value and key recalled.
- ``agent_memory_examples``: agent steps with memory entries about other people before the task.
- ``literal_call_examples``: tool calls whose arguments are literals only the question holds.
- ``paraphrase_examples``: people with made-up names, asked about in many wordings.
- ``record_examples``: a person's record as structured output asks for it, every value copied from a document.
- ``small_talk_examples``: what a user says that needs no tool, under tools, answered in words.
- ``copy_drills``: dense recall of open-vocabulary names (``names``), every value copied token by token.
"""

from __future__ import annotations

import copy
import json
import random
from collections import Counter
from functools import partial

from hypic_rag.eval.data.names import SCRAMBLED, TRAINING, OpenWorld
from hypic_rag.eval.data.pools import (
    BRANDS,
    COLORS,
    DAYS,
    FIRST_NAMES,
    FORECASTS,
    LAST_NAMES,
    ORG_KINDS,
    PET_NAMES,
    PLACES,
    ROLES,
    World,
)
from hypic_rag.eval.data.workloads import (
    NAMES,
    SIZES,
    SMALL_SIZES,
    TOOLS,
    Example,
    Worlds,
    _agent,
    _describe_person,
    ask,
    format_call,
    headquarters,
    hop_qa,
    list_qa,
    part,
    person_doc,
    person_facts,
)


def recall_examples(n: int, seed: int, broad: bool = False, phrases: bool = False) -> list[Example]:
    """Associative recall as a workload example: one document of key-value pairs, then a question per
    key: short, dense copying practice, the skill every workload needs. Keys and values are pool
    names; ``broad`` makes keys full names and values anything an answer can be (numbers, roles,
    phrases), since a model drilled on names alone copied names and guessed everything else.
    ``phrases`` makes every value several words (``_phrase``): the grown model copied a value's first
    word and guessed the rest ("Pifath Works" for "Pifath Labs"), so only copying on past a space
    scores here."""
    rng = random.Random(f"recall:{seed}" + (":phrases" if phrases else ":broad" if broad else ""))
    keys, values = FIRST_NAMES + LAST_NAMES, PLACES + BRANDS
    out = []
    for _ in range(n):
        count = rng.randint(2, 8)
        if broad or phrases:
            firsts, lasts = rng.sample(FIRST_NAMES, count), rng.sample(LAST_NAMES, count)
            brands = rng.sample(BRANDS, max(1, count // 2)) if phrases else []
            values = [_phrase(rng, brands) if phrases else _any_value(rng) for _ in range(count)]
            pairs = [(f"{f} {la}", v) for f, la, v in zip(firsts, lasts, values, strict=True)]
        else:
            pairs = list(zip(rng.sample(keys, count), rng.sample(values, 8), strict=False))
        out.append(_key_value_example(pairs, rng))
    return out


def _key_value_example(pairs: list[tuple[str, str]], rng: random.Random) -> Example:
    """One document of "key value." pairs, then a question per key."""
    text = " ".join(f"{k} {v}." for k, v in pairs)
    return _asking([part("document", text)], [(f"{k}?", v) for k, v in pairs], rng)


def _asking(docs: list[dict], qa: list[tuple[str, str]], rng: random.Random, **meta) -> Example:
    """An example of ``docs`` asking each of ``qa`` in a shuffled order, the first as its own question."""
    rng.shuffle(qa)
    return Example([ask(docs, qa[0][0])], [qa[0][1]], "f1", meta={"qa": qa, **meta})


def _any_value(rng: random.Random) -> str:
    """A value of any kind an answer can be: place, company, role, number, forecast, colour or day, name."""
    kind = rng.randrange(7)
    if kind == 0:
        return rng.choice(PLACES)
    if kind == 1:
        return f"{rng.choice(BRANDS)} {rng.choice(ORG_KINDS)}"
    if kind == 2:
        return rng.choice(ROLES)
    if kind == 3:
        return str(rng.randint(0, 99))
    if kind == 4:
        return f"{rng.choice(FORECASTS)}, {rng.randint(-5, 35)} degrees"
    if kind == 5:
        return rng.choice(COLORS + DAYS)
    return rng.choice(PET_NAMES)


def _phrase(rng: random.Random, brands: list[str]) -> str:
    """Two or three words no prior predicts past the first: a company whose brand others in the
    document share with another kind, or words drawn from any pools."""
    if rng.random() < 0.5:
        return f"{rng.choice(brands)} {rng.choice(ORG_KINDS)}"
    pools = (PLACES, BRANDS, ORG_KINDS, ROLES, COLORS, FIRST_NAMES, LAST_NAMES)
    return " ".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(2, 3)))


def hop_examples(n: int, seed: int, small: bool = False) -> list[Example]:
    """Two hops, densely: one-sentence documents "X works at O." and "O is headquartered in C.", some
    people's home cities beside them (a city that is not the answer), then ``multi_hop``'s question
    for every person and the second hop's for every company. The bundled model found that an HQ city
    was asked for, but not which: every wrong answer was another company's HQ, and trained to write the
    first hop out (``hop_qa``'s reasoning) it still copied whichever HQ city followed "headquartered
    in" (20 of 30), so the HQ is asked by company too. The companies of a prompt share their last words,
    so only the first tells them apart (a guess that the model keyed on a company's last word, which a
    count did not bear out: 7 of 32 wrong answers were a same-named kind's city, 5.4 by chance)."""
    rng = random.Random(f"hops:{seed}" + (":small" if small else ""))
    out = []
    for _ in range(n):
        w = World(rng)
        people = [person_doc(w, rng) for _ in range(rng.randint(2, 3) if small else rng.randint(3, 6))]
        kinds = rng.sample(ORG_KINDS, rng.randint(1, 2))
        for p in people:  # companies share their last word: only the brand tells them apart
            p["org"] = f"{p['org'].split()[0]} {rng.choice(kinds)}"
        texts = [person_facts(p)["org"] for p in people]
        texts += [person_facts(p)["city"] for p in people if rng.random() < 0.5]
        hq = {p["org"]: w.city() for p in people}
        texts += [headquarters(org, city) for org, city in hq.items()]
        rng.shuffle(texts)
        qa, reasoning = hop_qa(people, hq)
        qa += [(f"Where is {org} headquartered?", city) for org, city in hq.items()]
        out.append(_asking([part("document", t) for t in texts], qa, rng, reasoning=reasoning))
    return out


def list_examples(n: int, seed: int, small: bool = False) -> list[Example]:
    """Lists, densely: one-sentence documents "X lives in C." over two or three cities, then
    ``aggregate``'s question for every city, the names in document order. The bundled model's lists
    had wrong members and repeats: here every name is one short sentence from its city."""
    rng = random.Random(f"lists:{seed}" + (":small" if small else ""))
    out = []
    for _ in range(n):
        w = World(rng)
        cities = [w.city() for _ in range(rng.randint(2, 3))]
        people = [person_doc(w, rng) for _ in range(rng.randint(3, 5) if small else rng.randint(5, 10))]
        for p in people:
            p["city"] = rng.choice(cities)
        out.append(_asking([part("document", person_facts(p)["city"]) for p in people], list_qa(people), rng))
    return out


def key_examples(n: int, seed: int, small: bool = False) -> list[Example]:
    """Recall keyed on anything: pairs whose keys are companies, places or full names, then a question
    per key. Every earlier drill and single-document question keyed on a person's name, and the model
    learned to look up by names only: asked where a company is headquartered, with the sentence in front
    of it, it answered 7 of 20; a list (by city) and a second hop (by company) key on other things. The
    companies, and the people, of a document share their last word, so the first word is the key."""
    rng = random.Random(f"keys:{seed}" + (":small" if small else ""))
    out = []
    for _ in range(n):
        w = World(rng)
        kind, last = rng.choice(ORG_KINDS), w.person().split()[1]
        pairs = []
        for _ in range(rng.randint(2, 4) if small else rng.randint(3, 8)):
            # two-word keys share their last word, so the first word is the key
            key = rng.choice((f"{w.org().split()[0]} {kind}", f"{w.person().split()[0]} {last}", w.city()))
            pairs.append((key, rng.choice((w.city, w.person, lambda: _any_value(rng)))()))
        out.append(_key_value_example(pairs, rng))
    return out


# Relations a key can stand in: the sentence, the question that asks its value, the question that asks
# its key back, and the kind of value. Their words between key and value run from two to five.
RELATIONS: dict[str, tuple[tuple[str, str, str, str], ...]] = {
    "org": (
        (
            "{k} is headquartered in {v}.",
            "Where is {k} headquartered?",
            "Which company is headquartered in {v}?",
            "city",
        ),
        ("{k} is based in {v}.", "Where is {k} based?", "Which company is based in {v}?", "city"),
        ("{k} has an office in {v}.", "Where does {k} have an office?", "Which company has an office in {v}?", "city"),
        ("{k} was founded in {v}.", "When was {k} founded?", "Which company was founded in {v}?", "year"),
        ("{k} is run by {v}.", "Who runs {k}?", "Which company is run by {v}?", "person"),
    ),
    "person": (
        ("{k} lives in {v}.", "Where does {k} live?", "Who lives in {v}?", "city"),
        ("{k} works at {v}.", "Where does {k} work?", "Who works at {v}?", "org"),
        ("{k} was born in {v}.", "Where was {k} born?", "Who was born in {v}?", "city"),
        ("{k} is married to {v}.", "Who is {k} married to?", "Who is married to {v}?", "person"),
    ),
}


def relation_examples(
    n: int, seed: int, small: bool = False, kinds: tuple[str, ...] = tuple(RELATIONS)
) -> list[Example]:
    """Recall across a relation: one-sentence documents "K is headquartered in V.", "K lives in V." ...,
    each key in one to three relations, the keys of a prompt sharing their last word (companies of one
    kind, people of one family), then every sentence asked forwards and back. The bundled model
    recalled "O V." keyed on a company 29 times in 30, but with "is headquartered in" between them 5 in
    30, and "X lives in C." only when the people's last names differed: it looked values up by the word
    next to the relation. Here only the key's first word, read across the relation, finds the value,
    and the same key stands in several relations, so the relation must match too. ``kinds`` narrows
    the keys to companies or people: after 1,000 steps the model read people's relations 41 times in 43
    and companies' 12 in 57."""
    narrowed = "" if kinds == tuple(RELATIONS) else ":" + ",".join(kinds)
    rng = random.Random(f"relations:{seed}" + (":small" if small else "") + narrowed)
    out = []
    for _ in range(n):
        w = World(rng)
        kind = rng.choice(kinds)
        relations = rng.sample(RELATIONS[kind], rng.randint(1, 3))
        count = rng.randint(2, 3) if small else rng.randint(3, 6)
        shared = rng.choice(ORG_KINDS) if kind == "org" else w.person().split()[1]
        keys = [f"{(w.org() if kind == 'org' else w.person()).split()[0]} {shared}" for _ in range(count)]
        values = {"city": w.city, "org": w.org, "person": w.person, "year": lambda: str(rng.randint(1850, 2020))}
        texts, qa = [], []
        for key in keys:
            for sentence, forward, back, value_kind in rng.sample(relations, rng.randint(1, len(relations))):
                value = values[value_kind]()
                texts.append(sentence.format(k=key, v=value))
                qa.append((forward.format(k=key), value))
                qa.append((back.format(v=value), key))
        # a year or a value drawn twice can answer two questions back: ask those forwards only
        backs = Counter(q for q, _ in qa)
        qa = [(q, a) for q, a in qa if backs[q] == 1]
        rng.shuffle(texts)
        out.append(_asking([part("document", t) for t in texts], qa, rng))
    return out


MEMORY_NOTES = (
    "The user's manager is {name}.",
    "The user's colleague {name} lives in {city}.",
    "{name} works at {org}.",
    "The user prefers short answers.",
)


def agent_memory_examples(n: int, seed: int, small: bool = False) -> list[Example]:
    """Agent steps with memory entries before the task, about other people: the agent loop puts its
    memory there (``ToolAgent(memory=...)``), and the agent workload has none. After the sentence
    drills the model looked up the manager a memory entry named instead of the task's person."""
    rng = random.Random(f"agent-memory:{seed}" + (":small" if small else ""))
    out = []
    for _ in range(n):
        ex = _agent(rng, SMALL_SIZES if small else SIZES)
        w = World(rng)
        notes = [
            rng.choice(MEMORY_NOTES).format(name=w.person(), city=w.city(), org=w.org())
            for _ in range(rng.randint(1, 2))
        ]
        first = ex.messages[0]
        ex.messages[0] = {**first, "content": [*(part("memory", t) for t in notes), *first["content"]]}
        out.append(ex)
    return out


_VERBS = ("magic", "compute", "get", "fetch", "apply", "check", "score", "count", "find", "lookup", "double", "parse")
_NOUNS = ("function", "value", "total", "code", "item", "order", "ticket", "number", "level", "status", "index", "sum")
_PARAMS = ("input", "x", "n", "value", "number", "count", "code", "query", "item_id", "text", "name", "key", "a", "b")
_WORDS = ("river", "window", "garden", "candle", "orange", "silver", "hello", "report", "blue", "north")
_ADJECTIVES = ("Chinese", "Japanese", "small", "French", "local", "German", "new", "Swedish")
_FIELDS = ("technology", "shipping", "farming", "design", "software", "food", "travel", "energy")
_ONE = (
    "What is the value of {fn}({v})? Use the tool.",
    "What is {fn}({v})?",
    "Call {fn} with {v}.",
    "Use {fn} on {v}.",
    "Run {fn} for {v}, please.",
    "Compute {fn}({v}) with the tool.",
    "What does {fn} give for {p} {v}?",
)
_TWO = ("What is {fn}({a}, {b})?", "Call {fn} with {p} {a} and {q} {b}.", "Use the tool: {fn}({a}, {b}).")
_NONE = ("What is the value of {fn}? Use the tool.", "Call {fn}.", "Run {fn} now.", "{description}")


def _world(names: str) -> Worlds:
    """The world a named drill draws from (``workloads.NAMES``), checked before any work."""
    if names not in NAMES:
        raise ValueError(f"names must be {' or '.join(map(repr, NAMES))}, not {names!r}")
    return NAMES[names]


def _literal_tool(rng: random.Random, name: str, description: str, params: dict[str, str]) -> dict:
    """A schema as frameworks write one (LangChain's from a typed function: bare types, bounds on integers,
    ``properties`` first) or as hand-written ones are (a description per property, ``type`` first)."""
    framework = rng.random() < 0.6
    props: dict = {}
    for key, kind in params.items():
        prop: dict = {"type": kind}
        if framework and kind == "integer" and rng.random() < 0.5:
            prop = {"exclusiveMaximum": 1000, "exclusiveMinimum": -1000, **prop}
        if not framework:
            prop["description"] = "a number" if kind == "integer" else key.replace("_", " ")
        props[key] = prop
    required = {"required": list(params)} if params else {}
    schema = (
        {"properties": props, **required, "type": "object"}
        if framework
        else {"type": "object", "properties": props, **required}
    )
    return {"type": "function", "function": {"name": name, "description": description, "parameters": schema}}


def _literal(rng: random.Random, w: World | OpenWorld, kind: str) -> tuple[str, object]:
    """A value as the question writes it and as the call's argument holds it."""
    if kind == "integer":
        v = rng.randint(0, 9) if rng.random() < 0.4 else rng.randint(10, 999)
        return str(v), v
    text = rng.choice([w.person(), w.city(), w.product(), rng.choice(_WORDS), str(rng.randint(0, 999))])
    return text, text


def literal_call_examples(n: int, seed: int, small: bool = False, names: str = "pools") -> list[Example]:
    """Tool calls whose arguments only the question holds, written literally ("magic_function(3)" →
    ``{"input": 3}``; a customer's quoted name; a tool with no parameters called with ``{}``), under tools
    described as frameworks describe them: the tool-calling workloads take every argument from a sentence
    of theirs, so the model had learnt their keys and values, not to copy a literal it was handed.
    ``names="open"`` writes the people, places, products and companies with made-up words (``names.TRAINING``)."""
    world = _world(names)
    rng = random.Random(f"literal-calls:{seed}" + (":small" if small else "") + (":open" if names == "open" else ""))
    out = []
    for _ in range(n):
        w = world(rng)
        fn = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
        shape = rng.choices(("one", "two", "none", "customer"), weights=(5, 2, 2, 2))[0]
        if shape == "customer":
            fn = rng.choice(("create_customer", "unicode_customer", "add_customer", "new_customer"))
            name, what = w.org(), f"a {rng.choice(_ADJECTIVES)} {rng.choice(_FIELDS)} company"
            query = f"Create a customer named '{name}' - {what}"
            params, args = (
                {"customer_name": "string", "description": "string"},
                {"customer_name": name, "description": what},
            )
            description = "Tool for creating a customer."
        elif shape == "none":
            fn += rng.choice(("", "", "_no_args", "_now"))
            description = f"Calculate {_article(fn)} {fn.replace('_', ' ')}."
            query = rng.choice(_NONE).format(fn=fn, description=description)
            params, args = {}, {}
        else:
            keys = rng.sample(_PARAMS, 1 if shape == "one" else 2)
            params = {k: rng.choice(("integer", "integer", "string")) for k in keys}
            shown, args = [], {}
            for k in keys:
                text, value = _literal(rng, w, params[k])
                shown.append(text)
                args[k] = value
            description = f"Apply {_article(fn)} {fn.replace('_', ' ')} to an input."
            if shape == "one":
                query = rng.choice(_ONE).format(fn=fn, v=shown[0], p=keys[0].replace("_", " "))
            else:
                query = rng.choice(_TWO).format(fn=fn, a=shown[0], b=shown[1], p=keys[0], q=keys[1])
        tools = [_literal_tool(rng, fn, description, params)]
        tools += rng.sample(TOOLS, rng.choice((0, 0, 1, 2)))  # the workloads' own tools beside it, at times
        rng.shuffle(tools)
        out.append(Example([ask([], query)], [format_call(fn, args)], "tool_call", copy.deepcopy(tools)))
    return out


def _article(phrase: str) -> str:
    return "an" if phrase[0] in "aeiou" else "a"


# Training's wordings of the four person questions (the held-out split asks in wordings of its own).
PARAPHRASES = {
    "city": (
        "Where does {name} live?", "Which city does {name} live in?", "Where is {name} based?", "{name} lives where?",
        "In what city is {name}?", "Tell me where {name} lives.", "What city is {name} from?", "Where's {name}'s home?",
    ),
    "org": (
        "Which company does {name} work for?", "Where does {name} work?", "Who employs {name}?",
        "What company is {name} at?", "{name} works for which company?", "Name the company {name} works at.",
    ),
    "role": (
        "What is the job of {name}?", "What is {name}'s job?", "What work does {name} do?",
        "What is {name}'s occupation?", "{name} works as what?", "What is {name}'s profession?",
    ),
    "age": ("How old is {name}?", "What age is {name}?", "{name} is how old?", "How many years old is {name}?",
            "Tell me {name}'s age."),
}  # fmt: skip


def paraphrase_examples(n: int, seed: int, small: bool = False) -> list[Example]:
    """One to four people with made-up names (``names.TRAINING``), each fact asked in one of ``PARAPHRASES``'
    wordings: trained on one wording per fact, the model matched the wording, not the question."""
    rng = random.Random(f"paraphrases:{seed}")
    out = []
    for _ in range(n):
        w = OpenWorld(rng, "training")
        people = [person_doc(w, rng) for _ in range(rng.randint(1, 2 if small else 4))]
        docs = [part("document", _describe_person(p, rng)) for p in people]
        qa = [(rng.choice(PARAPHRASES[k]).format(name=p["name"]), str(p[k])) for p in people for k in PARAPHRASES]
        out.append(_asking(docs, qa, rng))
    return out


# A record's fields as schemas name them: the person's attribute, the names a schema gives it, its JSON type.
RECORD_FIELDS = (
    ("name", ("name", "full_name", "person"), "string"),
    ("city", ("city", "location", "home_city"), "string"),
    ("org", ("company", "employer", "organization"), "string"),
    ("role", ("job", "role", "occupation"), "string"),
    ("age", ("age", "years"), "integer"),
)
RECORD_ASKS = ("Write down {name}'s record.", "Extract the details of {name}.", "Fill in the record for {name}.")


def record_examples(n: int, seed: int, small: bool = False, names: str = "pools") -> list[Example]:
    """A person's record as ``with_structured_output`` asks for it: three to five fields, by function calling (the
    schema a tool, the answer its call) or as JSON content (``json_schema``: the grammar holds the keys, in the
    schema's order), every value copied from the person's document among one to three others. Asked so, the model
    gave every record the first document's age and glued a company word to the city."""
    world = _world(names)
    rng = random.Random(f"records:{seed}" + (":open" if names == "open" else ""))
    out = []
    for _ in range(n):
        w = world(rng)
        people = [person_doc(w, rng) for _ in range(rng.randint(1, 4))]
        p = rng.choice(people)
        fields = [RECORD_FIELDS[0], *rng.sample(RECORD_FIELDS[1:], rng.randint(2, 4))]
        if rng.random() < 0.3:
            rng.shuffle(fields)
        keys = [(attr, rng.choice(spellings), kind) for attr, spellings, kind in fields]
        title = rng.choice(("Person", "Record", "Employee", "PersonRecord", "Profile"))
        schema = {
            "properties": {key: {"title": key.replace("_", " ").title(), "type": kind} for _, key, kind in keys},
            "required": [key for _, key, _ in keys],
            "title": title,
            "type": "object",
        }
        args = {key: p[attr] if kind == "integer" else str(p[attr]) for attr, key, kind in keys}
        docs = [part("document", _describe_person(q, rng)) for q in people]
        question = rng.choice(RECORD_ASKS).format(name=p["name"])
        if rng.random() < 0.5:  # function calling: the schema is the one tool, the answer its call
            tool = {"type": "function", "function": {"name": title, "description": "", "parameters": schema}}
            out.append(Example([ask(docs, question)], [format_call(title, args)], "tool_call", [tool]))
        else:  # JSON content, keys in the schema's order, as the output grammar writes them
            answer = json.dumps(args, separators=(",", ":"), ensure_ascii=False)
            out.append(Example([ask(docs, question)], [answer], "exact_match"))
    return out


# What a user says that needs no tool (wordings, the reply): under tools, a greeting is answered in words.
SMALL_TALK = (
    (("hi", "Hi!", "hello", "Hello there.", "hey", "Good morning!", "hi there"), "Hello! How can I help you?"),
    (("thanks", "Thank you!", "thanks a lot", "Great, thank you."), "You're welcome."),
    (("How are you?", "how are you doing", "How's it going?"), "I'm well, thank you. How can I help?"),
    (("bye", "Goodbye!", "see you later"), "Goodbye!"),
    (("Who are you?", "what are you?"), "I am an assistant: I answer from what you give me and call tools."),
    (("ok", "Okay.", "cool", "nice"), "Let me know if you need anything else."),
)


def small_talk_examples(n: int, seed: int, small: bool = False) -> list[Example]:
    """Small talk under tools, answered in words: trained only on requests that needed a tool, the model called
    one for "hi"."""
    rng = random.Random(f"small-talk:{seed}")
    out = []
    for _ in range(n):
        wordings, reply = rng.choice(SMALL_TALK)
        tools = rng.sample(TOOLS, rng.randint(1, 3))
        if rng.random() < 0.3:
            fn = f"{rng.choice(_VERBS)}_{rng.choice(_NOUNS)}"
            tools.append(_literal_tool(rng, fn, f"Apply {_article(fn)} {fn.replace('_', ' ')} to an input.", {}))
        rng.shuffle(tools)
        out.append(Example([ask([], rng.choice(wordings))], [reply], "exact_match", copy.deepcopy(tools)))
    return out


# Drills that a training mix can name beside the workloads (``--mix``); those in NAMED_DRILLS take ``names``.
SKILL_DRILLS = {
    "hops": hop_examples,
    "lists": list_examples,
    "keys": key_examples,
    "relations": relation_examples,
    "company_relations": partial(relation_examples, kinds=("org",)),
    "agent_memory": agent_memory_examples,
    "literal_calls": literal_call_examples,
    "small_talk": small_talk_examples,
    "paraphrases": paraphrase_examples,
    "records": record_examples,
}
NAMED_DRILLS = ("literal_calls", "records")


def kv_drills(tok, n: int, seed: int, max_pairs: int = 4, spaced: bool = False) -> list[tuple[list[int], list[int]]]:
    """Dense key-value recall on the pools' one-token names, ``k1v1k2v2...k2v2k1v1``, the loss
    on every recalled value: the first phase of training. On these the retrieval circuit forms within
    a few hundred steps (2-4 pairs); from the workloads alone it never did here, from 2-8 pairs not in
    2,700 steps, nor with a space token between the names (``spaced``, as in the prompts), which
    serves as the bridge once the circuit has formed."""
    rng = random.Random(f"kv:{seed}")
    space = tok.encode(" ", add_special_tokens=False).ids if spaced else []
    keys, values = FIRST_NAMES + LAST_NAMES, PLACES + BRANDS
    out = []
    for _ in range(n):
        pairs = list(zip(rng.sample(keys, rng.randint(2, max_pairs)), rng.sample(values, max_pairs), strict=False))
        asked = pairs + rng.sample(pairs, len(pairs))
        ids: list[int] = []
        labels: list[int] = []
        for i, (k, v) in enumerate(asked):
            k_ids, v_ids = tok.encode(k, add_special_tokens=False).ids, tok.encode(v, add_special_tokens=False).ids
            ids += k_ids + space + v_ids + space
            labels += [-100] * len(k_ids + space) + (v_ids if i >= len(pairs) else [-100] * len(v_ids))
            labels += [-100] * len(space)
        out.append((ids, labels))
    return out


def sentence_drills(
    tok, n: int, seed: int, asked: int | None = None, lists: bool = False
) -> list[tuple[list[int], list[int]]]:
    """Recall across a relation, densely: ``RELATIONS``' sentences run together ("B K is headquartered in
    C. ..."), keys sharing their last word, then each sentence again up to its value (the value
    recalled, as ``multi_hop``'s reasoning reads its second hop) and each back question followed by its
    key (as ``aggregate`` reads names by their city); the loss on every recalled value and key.
    The bundled model read people's relations but not companies': a second hop given the right company
    found the right HQ city 12 times in 60, the rest another company's, so a city's sentence did not
    carry its subject 8 tokens back. Dense drills are where its first retrieval circuit formed
    (``kv_drills``). Half the prompts use one relation for every key, as ``multi_hop``'s HQ documents
    do, so only the key tells the sentences apart. ``asked`` keeps that many recalls (held-out scoring).
    ``lists``: half the prompts draw every value from two or three, in one relation, and a back question
    ("... List every name.") lists every key of its value in order, as ``aggregate`` asks: drilled
    without them, the second hop rose to 59 of 60 but ``aggregate``'s F1 fell from 40.8 to 34.5."""
    rng = random.Random(f"sentences:{seed}")
    out = []
    for _ in range(n):
        w = World(rng)
        kind = rng.choice(tuple(RELATIONS))
        shared = rng.choice(ORG_KINDS) if kind == "org" else w.person().split()[1]
        count = rng.randint(2, 8)
        keys = [f"{(w.org() if kind == 'org' else w.person()).split()[0]} {shared}" for _ in range(count)]
        one = rng.choice(RELATIONS[kind]) if rng.random() < 0.5 else None
        values = {"city": w.city, "org": w.org, "person": w.person}
        years = iter(rng.sample(range(1850, 2021), count))
        pooled = lists and rng.random() < 0.5
        if pooled:
            one = one or rng.choice(RELATIONS[kind])
            size = rng.randint(2, 3)
            years_pool = [str(y) for y in rng.sample(range(1850, 2021), size)]
            pool = years_pool if one[3] == "year" else [values[one[3]]() for _ in range(size)]
        facts = []
        for key in keys:
            sentence, _, back, value_kind = one or rng.choice(RELATIONS[kind])
            if pooled:
                value, back = rng.choice(pool), back + " List every name."
            else:
                value = str(next(years)) if value_kind == "year" else values[value_kind]()
            facts.append((sentence, back, key, value))
        text = " ".join(sentence.format(k=key, v=value) for sentence, _, key, value in facts)
        recalls = []
        for sentence, back, key, value in facts:
            before, after = sentence.split("{v}")
            recalls.append((before.format(k=key), value, after))
            sharing = [k for _, _, k, v in facts if v == value]
            # a shared value has several keys: asked once, by its first, and only where lists are drilled
            if len(sharing) == 1 or (pooled and key == sharing[0]):
                recalls.append((back.format(v=value) + " ", ", ".join(sharing), "."))
        rng.shuffle(recalls)
        ids = tok.encode(text + "\n", add_special_tokens=False).ids
        labels = [-100] * len(ids)
        for prompt, answer, after in recalls[:asked]:
            p, a, e = (
                tok.encode(" " + x if i == 0 else x, add_special_tokens=False).ids
                for i, x in enumerate((prompt, answer, after))
            )
            ids += p + a + e
            labels += [-100] * len(p) + a + [-100] * len(e)
        out.append((ids, labels))
    return out


def copy_drills(
    tok, n: int, seed: int, namers: tuple = (*TRAINING, *SCRAMBLED), asked: int | None = None
) -> list[tuple[list[int], list[int]]]:
    """Dense recall of made-up names: "K V. K V. ...", keys two words and values one to three, each pair's words
    from one of ``namers``, then each key again and its value, the loss on every value token. A word the
    tokenizer never merged is five to fifteen tokens, so the value is copied a piece at a time: on the pools'
    two-token names the model had learned to recall a name, not to copy one, and on names outside them it wrote
    broken bytes. ``asked`` keeps that many recalls (held-out scoring)."""
    rng = random.Random(f"copy:{seed}")
    out = []
    for _ in range(n):
        pairs: list[tuple[str, str]] = []
        words: set[str] = set()
        count = rng.randint(2, 6)
        while len(pairs) < count:
            namer = rng.choice(namers)
            new = [namer.word(rng) for _ in range(2 + rng.randint(1, 3))]
            if len(set(new)) == len(new) and words.isdisjoint(new):
                words.update(new)
                pairs.append((" ".join(new[:2]), " ".join(new[2:])))
        ids = tok.encode(" ".join(f"{k} {v}." for k, v in pairs) + "\n", add_special_tokens=False).ids
        labels = [-100] * len(ids)
        for k, v in rng.sample(pairs, len(pairs))[:asked]:
            p, a, e = (tok.encode(x, add_special_tokens=False).ids for x in (k + " ", v, ". "))
            ids += p + a + e
            labels += [-100] * len(p) + a + [-100] * len(e)
        out.append((ids, labels))
    return out
