"""Made-up names through the paths a user takes: does the model answer from the user's own documents?

    python -m hypic_rag.eval.bench.open_names --json open-names.json   (or: hypic-rag bench open-names)

Every name, place, company and job comes from the held-out namers (``names.HELD_OUT``: scripts and syllable
shapes no training example had), every question in a held-out wording, the facts in the model's own sentences.
On one checkpoint (the bundled model unless ``--model``), greedy, ``full`` mode unless ``--mode``:

- ``chat``: ``Engine.chat``, one document and a question about it;
- ``multi_doc``: ``Engine.chat``, four to six documents, one of them the asked person's;
- ``openai``: the official ``openai`` client's chat completions against ``serve`` on a loopback port, the
  document and the question in one user message, as a user pastes them;
- ``llamaindex``: ``VectorStoreIndex(...).as_query_engine()`` with its defaults, over one document per person;
- ``structured``: LangChain's ``with_structured_output`` on a four-field record, by function calling and by JSON
  schema, scored by field;
- ``tool_calls``: a request whose argument is copied from the question, under ``tool_choice="auto"``;
- ``small_talk``: small talk under tools and ``tool_choice="auto"``, answered in words (no call).

Each part reports its hits out of its prompts and a few misses as they came, so a regression shows its shape.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..data.names import OpenWorld
from ..data.workloads import HELD_OUT_QUESTIONS, TOOLS, person_doc, profile_text
from .common import write_report

# Small talk in wordings the training never used (its own are ``training.drills.SMALL_TALK``).
SMALL_TALK = (
    "yo", "Good evening!", "hey, what's up?", "much appreciated", "cheers", "howdy", "thank you so much",
    "good night", "how's your day going?", "nice to meet you",
)  # fmt: skip
FIELDS = ("name", "city", "company", "age")


def people(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` held-out people, each with a profile document of their four facts in a shuffled order."""
    rng = random.Random(f"open-names:{seed}")
    w = OpenWorld(rng, "held_out")
    out = []
    for _ in range(n):
        p = person_doc(w, rng)
        out.append({**p, "doc": profile_text(p, rng)})
    return out


def questions(persons: Sequence[dict[str, Any]], seed: int) -> list[tuple[dict[str, Any], str, str]]:
    """A held-out question about each person: (person, question, answer)."""
    rng = random.Random(f"open-questions:{seed}")
    out = []
    for p in persons:
        key, q = rng.choice(HELD_OUT_QUESTIONS)
        out.append((p, q.format(name=p["name"]), str(p[key])))
    return out


def _doc(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "hypic": {"kind": "document"}}


def _score(rows: list[tuple[Any, Any]], key: str = "hits") -> dict[str, Any]:
    hits = sum(got == want for got, want in rows)
    return {key: hits, "of": len(rows), "misses": [[str(g), str(w)] for g, w in rows if g != w][:4]}


def chat(engine, qs, mode: str, others: list[dict[str, Any]] | None = None, seed: int = 0) -> dict[str, Any]:
    """``Engine.chat`` on each question, its person's document alone or among ``others``' (four to six in all)."""
    rng = random.Random(f"open-chat:{seed}")
    rows = []
    for p, q, a in qs:
        docs = [p["doc"]]
        if others is not None:
            docs += [o["doc"] for o in rng.sample([o for o in others if o is not p], rng.randint(3, 5))]
            rng.shuffle(docs)
        out = engine.chat([{"role": "user", "content": [*map(_doc, docs), {"type": "text", "text": q}]}], mode=mode)
        rows.append(((out.text or "").strip(), a))
    return _score(rows)


def openai_client(engine, qs, mode: str) -> dict[str, Any]:
    """The ``openai`` client over ``create_app`` on a loopback port; the document and question pasted together."""
    from openai import OpenAI

    from hypic_rag.server import create_app
    from hypic_rag.testing.server import serve_in_thread

    rows = []
    with serve_in_thread(create_app(engine, model_names=["hypic"])) as url:
        with OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120) as client:
            for p, q, a in qs:
                r = client.chat.completions.create(
                    model="hypic",
                    messages=[{"role": "user", "content": f"{p['doc']}\n\n{q}"}],
                    max_tokens=24,
                    temperature=0,
                    extra_body={"mode": mode},
                )
                rows.append(((r.choices[0].message.content or "").strip(), a))
    return _score(rows)


def llamaindex(engine, persons, qs, mode: str) -> dict[str, Any]:
    """LlamaIndex's default query engine (top two nodes, its own prompt) over one node per person."""
    from llama_index.core import Settings, VectorStoreIndex
    from llama_index.core.schema import TextNode

    from hypic_rag.integrations.llamaindex import HypicLLM, MiniLMEmbedding

    Settings.llm = None  # nothing may reach for an OpenAI default
    nodes = [TextNode(text=p["doc"], id_=str(i)) for i, p in enumerate(persons)]
    index = VectorStoreIndex(nodes, embed_model=MiniLMEmbedding())
    query_engine = index.as_query_engine(llm=HypicLLM(engine=engine, max_tokens=24, mode=mode))
    return _score([(query_engine.query(q).response.strip(), a) for _, q, a in qs])


def structured(engine, persons, mode: str) -> dict[str, Any]:
    """``with_structured_output`` on a four-field record, by each method; fields right out of fields asked."""
    from pydantic import BaseModel

    from hypic_rag.integrations.langchain import ChatHypic

    class Record(BaseModel):
        """A person's record."""

        name: str
        city: str
        company: str
        age: int

    out: dict[str, Any] = {}
    for method in ("function_calling", "json_schema"):
        llm = ChatHypic(engine=engine, max_tokens=64, mode=mode).with_structured_output(Record, method=method)
        rows = []
        for p in persons:
            want = {"name": p["name"], "city": p["city"], "company": p["org"], "age": p["age"]}
            try:
                got = llm.invoke([("user", f"{p['doc']}\n\nWrite down {p['name']}'s record.")]).model_dump()
            except Exception as exc:  # an answer the schema refused: every field missed, and why
                got = dict.fromkeys(FIELDS, f"<{type(exc).__name__}>")
            rows += [(got[f], want[f]) for f in FIELDS]
        out[method] = _score(rows, "fields")
    return out


def _calls(w: OpenWorld, rng: random.Random) -> list[tuple[str, str, dict[str, Any]]]:
    """Requests whose one argument is a made-up name in the question: (question, tool, arguments)."""
    city, org, person, product = w.city(), w.org(), w.person(), f"{w.city()} kettle"
    return [
        (f"Can you check the weather in {city}?", "get_weather", {"city": city}),
        (f"Look up the stock price of {org}.", "get_stock_price", {"company": org}),
        (f"Pull up the employee record of {person}.", "lookup_employee", {"name": person}),
        (f"Search the catalogue for the {product}.", "find_product", {"product": product}),
    ]


def tool_calls(engine, n: int, seed: int, mode: str) -> dict[str, Any]:
    """Calls under ``tool_choice="auto"`` with every tool offered: the tool and its argument exact."""
    rng = random.Random(f"open-calls:{seed}")
    asks = [c for _ in range((n + 3) // 4) for c in _calls(OpenWorld(rng, "held_out"), rng)][:n]
    rows = []
    for q, tool, args in asks:
        out = engine.chat([{"role": "user", "content": q}], tools=TOOLS, tool_choice="auto", mode=mode)
        got = [(c["name"], c["arguments"]) for c in out.tool_calls] or (out.text or "").strip()
        rows.append((got, [(tool, args)]))
    return _score(rows)


def small_talk(engine, mode: str) -> dict[str, Any]:
    """Small talk with every tool offered under ``tool_choice="auto"``: a hit is words, no call."""
    rows = []
    for line in SMALL_TALK:
        out = engine.chat([{"role": "user", "content": line}], tools=TOOLS, tool_choice="auto", mode=mode)
        words = not out.tool_calls and bool((out.text or "").strip())
        rows.append((words, True) if words else ([c["name"] for c in out.tool_calls] or out.text, True))
    return _score(rows, "in_words")


def run(model: str | None, n: int, seed: int, mode: str, parts: Sequence[str]) -> dict[str, Any]:
    from hypic_rag import Engine

    engine = Engine.from_pretrained(model) if model else Engine.from_pretrained()
    everyone = people(n + 6, seed)  # one world: no two people share a name
    persons = everyone[:n]
    qs = questions(persons, seed)
    jobs: dict[str, Callable[[], dict[str, Any]]] = {
        "chat": lambda: chat(engine, qs, mode),
        "multi_doc": lambda: chat(engine, qs, mode, others=everyone, seed=seed),
        "openai": lambda: openai_client(engine, qs, mode),
        "llamaindex": lambda: llamaindex(engine, persons, qs, mode),
        "structured": lambda: structured(engine, persons[: max(1, n // 3)], mode),
        "tool_calls": lambda: tool_calls(engine, n, seed, mode),
        "small_talk": lambda: small_talk(engine, mode),
    }
    report: dict[str, Any] = {"model": model or "bundled", "mode": mode, "n": n, "seed": seed, "parts": {}}
    for part in parts:
        engine.clear_cache()
        report["parts"][part] = result = jobs[part]()
        print(part, {k: v for k, v in result.items() if k != "misses"} if "of" in result else result, flush=True)
    return report


ALL_PARTS = ("chat", "multi_doc", "openai", "llamaindex", "structured", "tool_calls", "small_talk")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint directory (default: the bundled model)")
    parser.add_argument("--n", type=int, default=12, help="people, questions and calls per part")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", default="full")
    parser.add_argument("--parts", default=",".join(ALL_PARTS), help=f"comma-separated, of {', '.join(ALL_PARTS)}")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    parts = [p.strip() for p in args.parts.split(",")]
    unknown = [p for p in parts if p not in ALL_PARTS]
    if unknown:
        parser.error(f"--parts: unknown {', '.join(unknown)}; expected {', '.join(ALL_PARTS)}")
    if not 1 <= args.n <= 200:
        parser.error(f"--n is 1 to 200 prompts a part; got {args.n}")
    write_report(run(args.model, args.n, args.seed, args.mode, parts), args.json, "open_names")


if __name__ == "__main__":
    main()
