"""Concurrent in-process streams: ``n`` LangChain and LlamaIndex streams at once against the same ones one after
another, on the bundled model.

    python -m hypic_rag.eval.bench.streams --json streams.json   (or: hypic-rag bench streams)

Each stream asks its own question about a document and is held by a regex to ``words`` words (the bundled model's
own answers are a few words long), so every answer is as long. Three ways to run ``n`` streams together, each
timed beside the same streams one after another in the same run: LangChain's ``astream`` gathered on one event loop,
LangChain's ``stream`` from ``n`` threads, LlamaIndex's ``astream_chat`` gathered. Reported: the speed-up (one after
another ÷ together) and whether every answer together is the answer it gets alone.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .common import write_report

NAMES = ["Ana Lee", "Bo Ek", "Cy Ru", "Di Fox", "Ed Holm", "Flo Kim", "Gus Tan", "Hal Berg", "Ivy Lund", "Jo Park"]
CITIES = ["Oslo", "Rome", "Lima", "Kyiv", "Quito", "Perth", "Dakar", "Hanoi", "Riga", "Bern"]


def _questions(n: int) -> list[str]:
    return [
        f"{NAMES[i % len(NAMES)]} lives in {CITIES[i % len(CITIES)]}. Where does {NAMES[i % len(NAMES)]} live? ({i})"
        for i in range(n)
    ]


def _timed(work: Callable[[], list[str]]) -> tuple[float, list[str]]:
    begin = time.perf_counter()
    answers = work()
    return time.perf_counter() - begin, answers


def run(n: int = 8, words: int = 40, rounds: int = 2) -> dict[str, Any]:
    from llama_index.core.llms import ChatMessage

    from hypic_rag import Engine
    from hypic_rag.integrations.langchain import ChatHypic
    from hypic_rag.integrations.llamaindex import HypicLLM

    if n < 2 or words < 1 or rounds < 1:
        raise ValueError("the bench needs n >= 2 streams, words >= 1 and rounds >= 1")
    engine = Engine.from_pretrained()
    held = {"type": "regex", "regex": f"[a-z]{{2,8}}( [a-z]{{2,8}}){{{words - 1}}}"}
    chat = ChatHypic(engine=engine, max_tokens=8 * words, response_format=held)
    index = HypicLLM(engine=engine, max_tokens=8 * words, response_format=held)
    questions = _questions(n)

    def lc_stream(q: str) -> str:
        return "".join(str(c.content) for c in chat.stream(q))

    async def lc_astream(q: str) -> str:
        return "".join([str(c.content) async for c in chat.astream(q)])

    def li_stream(q: str) -> str:
        return "".join(r.delta or "" for r in index.stream_chat([ChatMessage(role="user", content=q)]))

    async def li_astream(q: str) -> str:
        gen = await index.astream_chat([ChatMessage(role="user", content=q)])
        return "".join([r.delta or "" async for r in gen])

    async def gathered(one: Callable[[str], Any]) -> list[str]:
        return list(await asyncio.gather(*(one(q) for q in questions)))

    def threads() -> list[str]:
        with ThreadPoolExecutor(n) as pool:
            return list(pool.map(lc_stream, questions))

    ways: dict[str, tuple[Callable[[], list[str]], Callable[[], list[str]]]] = {
        "langchain astream": (
            lambda: [lc_stream(q) for q in questions],
            lambda: asyncio.run(gathered(lc_astream)),
        ),
        "langchain stream, threads": (lambda: [lc_stream(q) for q in questions], threads),
        "llamaindex astream_chat": (
            lambda: [li_stream(q) for q in questions],
            lambda: asyncio.run(gathered(li_astream)),
        ),
    }
    lc_stream(questions[0])  # warm: the documents' template pieces, the grammar
    li_stream(questions[0])
    report: dict[str, Any] = {}
    for name, (one_by_one, together) in ways.items():
        best_alone = best_together = float("inf")
        same = True
        for _ in range(rounds):  # the two take turns, so that a slower spell of the machine slows both
            t_alone, alone = _timed(one_by_one)
            t_together, both = _timed(together)
            best_alone, best_together = min(best_alone, t_alone), min(best_together, t_together)
            same = same and both == alone
        words_seen = sum(len(a.split()) for a in alone) / len(alone)
        report[name] = {
            "one_after_another_s": round(best_alone, 3),
            "together_s": round(best_together, 3),
            "speedup": round(best_alone / best_together, 2),
            "answers_equal_alone": same,
            "mean_words": round(words_seen, 1),
        }
    return {"benchmark": "streams", "settings": {"n": n, "words": words, "rounds": rounds}, "ways": report}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hypic-rag bench streams", description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=8, help="streams at once")
    parser.add_argument("--words", type=int, default=40, help="words in each answer")
    parser.add_argument("--rounds", type=int, default=2, help="times each way runs (the best is kept)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.n, args.words, args.rounds)
    for name, row in report["ways"].items():
        print(f"{name}: {row}")
    write_report(report, args.json, "streams")


if __name__ == "__main__":
    main()
