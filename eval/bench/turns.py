"""Conversations and agent loops, turn by turn: what each turn costs in ``full``, ``prefix`` and ``hypic``.

    python -m hypic_rag.eval.bench.turns --json turns.json   (or: hypic-rag bench turns)

Three workloads, on the bundled model and on a random checkpoint of Qwen3.5-0.8B's layer shapes with the
Qwen3.5-style chat template (``testing/templates/qwen3_5.jinja``, reasoning off):

- ``conversation``: four documents in the system message and one question a turn, ``turns`` turns;
- ``tool_loop``: a task, then ``steps`` steps, each appending the assistant's tool call, the tool's result and a
  user line (the calls are written for the model, as an agent framework writes them back);
- ``insertion``: a warm conversation of ``turns // 5`` turns, then a fifth document inserted after the first
  question (a retrieval that came late), and the conversation asked again; the document was read before, in
  another conversation, so its segment is cached.

Every mode answers the same conversation: the history holds ``prefix``'s answers (the exact mode's, which equal
``full``'s), so a turn's answers can be compared across modes. Each mode has its own engine, and so its own
caches. Per turn and mode: prompt tokens, ``new_tokens`` (the prompt's tokens after the longest run it shares with
the last turn's prompt and answer, ``prefix``'s ids), recomputed, cached and restored (``prefix_tokens``) tokens,
TTFT, whether the answer equals ``prefix``'s, and the KL divergence of its first token's distribution from ``full``'s.
The summary gives, from the third turn on, the most a turn
recomputed beyond its new tokens (in seams), TTFT at the last turn over the second, and the answers that differ.
"""

from __future__ import annotations

import argparse
import gc
import random
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from statistics import median
from typing import Any

from .common import write_report

MODES = ("full", "prefix", "hypic")
NAMES = ["Ana Lee", "Bo Ek", "Cy Ru", "Di Fox", "Ed Holm", "Flo Kim", "Gus Tan", "Hal Berg"]
CITIES = ["Oslo", "Rome", "Lima", "Kyiv", "Quito", "Perth", "Dakar", "Hanoi"]
JOBS = ["a pilot", "a nurse", "a chef", "a baker", "a judge", "a tailor", "a farmer", "a singer"]
TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a person up in the directory.",
        "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]},
    },
}


def _documents(n: int, offset: int = 0) -> list[str]:
    return [
        f"{NAMES[i % 8]} lives in {CITIES[(i * 3) % 8]} and works as {JOBS[(i * 5) % 8]}. "
        f"{NAMES[i % 8]} was born in {1950 + 7 * i} and has {i % 4 + 1} children."
        for i in range(offset, offset + n)
    ]


def _question(t: int) -> str:
    name = NAMES[t % 4]
    return [f"Where does {name} live?", f"What does {name} do?", f"When was {name} born?"][t % 3]


def _common(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


class Run:
    """One engine per mode over one checkpoint, and the turns asked of them."""

    def __init__(self, path: Path | None, template_kwargs: dict[str, Any], max_new_tokens: int) -> None:
        from hypic_rag import Engine

        self.engines = {m: Engine.from_pretrained(path) if path else Engine.from_pretrained() for m in MODES}
        self.kwargs = {"max_new_tokens": max_new_tokens, "temperature": 0.0}
        self.template_kwargs = template_kwargs
        self.seam = self.engines["hypic"].seam

    def turn(self, messages: list[dict[str, Any]], before: list[int], tools: list | None = None) -> dict[str, Any]:
        """Every mode answers ``messages``; ``before`` is the last turn's prompt and answer (``prefix``'s)."""
        from hypic_rag.fidelity import kl_divergence

        row: dict[str, Any] = {}
        outs = {}
        for mode in MODES:
            engine = self.engines[mode]
            outs[mode] = engine.chat(
                messages, tools=tools, mode=mode, chat_template_kwargs=self.template_kwargs, **self.kwargs
            )
        exact = outs["prefix"]
        ids = self.engines["prefix"].render(messages, tools, self.template_kwargs).token_ids
        row["prompt_tokens"] = exact.stats["prompt_tokens"]
        row["new_tokens"] = len(ids) - _common(ids, before)
        row["_next"] = [*ids, *exact.token_ids]
        for mode, out in outs.items():
            stats = out.stats
            row[mode] = {
                "recomputed_tokens": stats["recomputed_tokens"],
                "cached_tokens": stats["cached_tokens"],
                "prefix_tokens": stats.get("prefix_tokens", 0),
                "run_tokens": stats.get("run_tokens", 0),
                "ttft_s": round(out.ttft_s, 5),
                "same_answer": out.token_ids == exact.token_ids,
                "kl_to_full": float(kl_divergence(outs["full"].prompt_logits, out.prompt_logits)),
            }
        row["_answer"] = exact.text or ""
        return row


def _clean(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows]


def conversation(
    run: Run, turns: int, log: Callable[[str], None]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[int]]:
    """The conversation's rows, its messages and the last turn's prompt and answer (``prefix``'s ids)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "\n\n".join(_documents(4))}]
    rows: list[dict[str, Any]] = []
    before: list[int] = []
    for t in range(turns):
        messages.append({"role": "user", "content": _question(t)})
        row = run.turn(messages, before)
        before = row["_next"]
        messages.append({"role": "assistant", "content": row["_answer"]})
        rows.append(row)
        log(f"  turn {t + 1}: {_line(row)}")
    return rows, messages, before


def tool_loop(run: Run, steps: int, log: Callable[[str], None]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Use the directory to answer."},
        {"role": "user", "content": "Find where everyone in the directory lives."},
    ]
    rows: list[dict[str, Any]] = []
    before: list[int] = []
    for s in range(steps):
        row = run.turn(messages, before, tools=[TOOL])
        before = row["_next"]
        name, call = NAMES[s % 8], f"call_{s}"
        messages += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": call, "type": "function", "function": {"name": "lookup", "arguments": {"name": name}}}
                ],
            },
            {"role": "tool", "tool_call_id": call, "name": "lookup", "content": _documents(1, s)[0]},
            {"role": "user", "content": f"Next one after {name}."},
        ]
        rows.append(row)
        log(f"  step {s + 1}: {_line(row)}")
    return rows


def insertion(run: Run, turns: int, log: Callable[[str], None]) -> dict[str, Any]:
    _, messages, before = conversation(run, turns, lambda _: None)
    note = [
        {"role": "user", "content": "Also note: " + _documents(1, 4)[0]},
        {"role": "assistant", "content": "Noted."},
    ]
    for mode, engine in run.engines.items():  # another conversation read the document first
        asked = [messages[0], *note, {"role": "user", "content": _question(0)}]
        engine.chat(asked, mode=mode, chat_template_kwargs=run.template_kwargs, **run.kwargs)
    inserted = [*messages[:3], *note, *messages[3:], {"role": "user", "content": _question(turns)}]
    row = run.turn(inserted, before)
    log(f"  after the insertion: {_line(row)}")
    out = _clean([row])[0]
    for mode in MODES:
        out[mode]["recomputed_share"] = round(out[mode]["recomputed_tokens"] / out["prompt_tokens"], 3)
    return out


def _line(row: dict[str, Any]) -> str:
    parts = [f"prompt {row['prompt_tokens']} new {row['new_tokens']}"]
    for m in MODES:
        r = row[m]
        parts.append(
            f"{m} {r['recomputed_tokens']} ({r['ttft_s'] * 1e3:.0f} ms{'' if r['same_answer'] else ', differs'})"
        )
    return "; ".join(parts)


def summary(rows: list[dict[str, Any]], seam: int) -> dict[str, Any]:
    """From the third turn on: the most ``hypic`` recomputed beyond a turn's new tokens (and in seams), TTFT at the
    last turn over the second (and the last five's median over turns 2-6's), per mode; the turns whose answer
    differs from ``prefix``'s."""
    later = rows[2:]
    out: dict[str, Any] = {}
    for mode in MODES:
        over = max((r[mode]["recomputed_tokens"] - r["new_tokens"] for r in later), default=0)
        out[mode] = {
            "most_beyond_new_tokens": over,
            "in_seams": round(over / seam, 2),
            "ttft_last_over_second": round(rows[-1][mode]["ttft_s"] / rows[1][mode]["ttft_s"], 3)
            if len(rows) > 1
            else None,
            # one turn's TTFT is a few ms on the bundled model, so single turns are noisy: medians of five
            "ttft_last_five_over_turns_2_to_6": round(
                median(r[mode]["ttft_s"] for r in rows[-5:]) / median(r[mode]["ttft_s"] for r in rows[1:6]), 3
            )
            if len(rows) > 1
            else None,
            "cached_share_from_turn_3": round(
                min((r[mode]["cached_tokens"] / r["prompt_tokens"] for r in later), default=0), 3
            ),
            "answers_differ": sum(not r[mode]["same_answer"] for r in rows),
            "mean_kl_to_full": sum(r[mode]["kl_to_full"] for r in rows) / len(rows),
        }
    return out


def model_run(
    name: str,
    path: Path | None,
    kwargs: dict[str, Any],
    turns: int,
    steps: int,
    tokens: int,
    log: Callable[[str], None],
) -> dict[str, Any]:
    run = Run(path, kwargs, tokens)
    seam = run.seam
    log(f"{name}: conversation of {turns} turns")
    conv = conversation(run, turns, log)[0]
    del run  # each workload's three engines (and their caches) go before the next one's are loaded
    gc.collect()
    log(f"{name}: tool loop of {steps} steps")
    loop = tool_loop(Run(path, kwargs, tokens), steps, log)
    gc.collect()
    log(f"{name}: insertion")
    inserted = insertion(Run(path, kwargs, tokens), max(2, turns // 5), log)
    return {
        "seam": seam,
        "conversation": {"summary": summary(conv, seam), "turns": _clean(conv)},
        "tool_loop": {"summary": summary(loop, seam), "steps": _clean(loop)},
        "insertion": inserted,
    }


def qwen_checkpoint(out: Path, layers: int) -> Path:
    """A random Qwen3.5-0.8B-shaped checkpoint with the Qwen3.5-style template and a tokenizer for the documents."""
    from hypic_rag.testing.synthetic import TEMPLATES, add_chat_files
    from hypic_rag.testing.synthetic import build_checkpoint as build

    from .common import layer_shapes

    config = layer_shapes(layers, max_position_embeddings=262144)
    build("qwen3_5_text", out, config, 0)
    texts = _documents(8) + [_question(t) for t in range(3)] + ["Use the directory to answer. Next one after"]
    texts = [" ".join(random.Random(i).sample(texts, len(texts))) for i in range(20)]
    return add_chat_files(out, (TEMPLATES / "qwen3_5.jinja").read_text(), vocab_size=1000, texts=texts)


def run(
    turns: int = 50,
    steps: int = 20,
    layers: int = 24,
    tokens: int = 8,
    models: Sequence[str] = ("bundled", "qwen3_5"),
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    if turns < 3 or steps < 3 or tokens < 1:
        raise ValueError("the bench needs turns >= 3, steps >= 3 and tokens >= 1")
    report: dict[str, Any] = {"turns": turns, "steps": steps, "max_new_tokens": tokens, "models": {}}
    if "bundled" in models:
        report["models"]["bundled"] = model_run("bundled", None, {}, turns, steps, tokens, log)
    if "qwen3_5" in models:
        with tempfile.TemporaryDirectory() as tmp:
            path = qwen_checkpoint(Path(tmp), layers)
            kwargs = {"enable_thinking": False}
            report["models"]["qwen3_5"] = model_run(
                f"qwen3_5 ({layers} layers)", path, kwargs, turns, steps, tokens, log
            )
            report["models"]["qwen3_5"]["layers"] = layers
    return report


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--layers", type=int, default=24, help="decoder layers of the Qwen3.5-0.8B-shaped model")
    parser.add_argument("--tokens", type=int, default=8, help="max_new_tokens of every answer")
    parser.add_argument("--models", nargs="+", default=["bundled", "qwen3_5"], choices=["bundled", "qwen3_5"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    report = run(args.turns, args.steps, args.layers, args.tokens, args.models)
    write_report(report, args.json, "turns")


if __name__ == "__main__":
    main()
