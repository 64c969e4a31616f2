"""What the engine thread spends its time on under a flood of tool requests, and what a streamed answer beside that
flood pays per token.

    python -m hypic_rag.eval.bench.engine_thread --json engine-thread.json   (or: hypic-rag bench engine-thread)

The bundled model is served in this process (``server.create_app`` on a loopback port). A streamed canary (a short
question whose answer a regex holds to words until ``canary_tokens`` tokens, since the bundled model's own answers
are a few tokens long) is asked ``canaries`` times alone, then again while a flood of chat requests
with ``tools`` tool schemas each (the same ones, as an agent sends them; ``fresh``: new names and fields in every
request, so that no grammar and no segment is cached from an earlier one) arrives every ``period_s`` seconds for
``flood_s`` seconds, each answered with ``flood_tokens`` tokens (one by default: the flood is the requests'
preparing and prefill, not a second decode load). The canary's
time per token is the span from its first streamed token to its last, over the tokens between.

The engine thread runs under ``cProfile`` throughout (the worker's loop is wrapped before the app starts): the
report gives the share of its time in each of the steps that prepare a request (rendering the template,
tokenizing, building and compiling the output grammar), which belong on the server's compile threads, not here.
Timings are this machine's, measured side by side in one run; the shares are what matters.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from .common import write_report

TOP = 12  # functions reported by their own time on the engine thread
# Where a request's preparing spends its time, as the profile names the functions (file fragment, function).
PREPARE_STEPS: dict[str, tuple[tuple[str, str], ...]] = {
    "template render": (("chat/template.py", "render"),),
    "tokenize": (("tokenizer.py", "literal_ids"), ("prepare.py", "encode"), ("engine.py", "encode")),
    "grammar build": (("chat/grammar.py", "answer_grammar"),),
    "grammar compile": (("grammar.py", "matcher"),),
}


def _tools(n: int, salt: int) -> list[dict[str, Any]]:
    """``n`` tool schemas no earlier request had: their names and fields carry ``salt``."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"tool_{salt}_{i}",
                "description": f"Look up record {i} of batch {salt}.",
                "parameters": {
                    "type": "object",
                    "properties": {f"field_{salt}_{i}": {"type": "string"}, "count": {"type": "integer"}},
                    "required": [f"field_{salt}_{i}"],
                },
            },
        }
        for i in range(n)
    ]


def _canary(client: httpx.Client, url: str, tokens: int) -> float:
    """One streamed answer's seconds per token, from its first token to its last."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Ana Lee lives in Oslo. Where does Ana Lee live?"}],
        "max_tokens": tokens,
        "stream": True,
        "hypic": {"mode": "full"},
        # words until the budget: the bundled model's own answers are a few tokens long
        "guided_regex": "[a-z]{2,8}( [a-z]{2,8}){100}",
    }
    stamps = []
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if line.startswith("data: {") and '"content"' in line:
                stamps.append(time.perf_counter())
    if len(stamps) < 3:
        raise RuntimeError(f"the canary streamed {len(stamps)} chunks; expected about {tokens}")
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1)


def _profiled_loop(profile: cProfile.Profile) -> Any:
    """The worker's ``_loop`` run under ``profile`` (cProfile sees only the thread that enables it)."""
    from hypic_rag.server.worker import EngineWorker

    loop = EngineWorker._loop

    def run(worker: EngineWorker) -> None:
        profile.enable()
        try:
            loop(worker)
        finally:
            profile.disable()

    return loop, run


def _shares(profile: cProfile.Profile) -> dict[str, Any]:
    stats = pstats.Stats(profile)
    entries: dict[tuple[str, int, str], tuple] = stats.stats  # type: ignore[attr-defined]
    total = max((cumulative for (_, _, _, cumulative, _) in entries.values()), default=0.0)
    out: dict[str, Any] = {"engine_thread_s": round(total, 3)}
    for step, names in PREPARE_STEPS.items():
        spent = sum(
            cumulative
            for (file, _, function), (_, _, _, cumulative, _) in entries.items()
            if any(file.endswith(fragment) and function == name for fragment, name in names)
        )
        out[step] = {"s": round(spent, 4), "share": round(spent / total, 4) if total else 0.0}
    own = sorted(entries.items(), key=lambda item: -item[1][2])[:TOP]
    out["top_own_time"] = [
        {"function": f"{Path(file).name}:{function}", "s": round(tottime, 4)}
        for (file, _, function), (_, _, tottime, _, _) in own
    ]
    return out


def run(
    tools: int = 12,
    period_s: float = 0.1,
    flood_s: float = 10.0,
    canaries: int = 5,
    canary_tokens: int = 40,
    fresh: bool = False,
    flood_tokens: int = 1,
) -> dict[str, Any]:
    from hypic_rag import Engine
    from hypic_rag.server import create_app
    from hypic_rag.server.worker import EngineWorker
    from hypic_rag.testing.server import serve_in_thread

    if tools < 1 or not 0 < period_s <= flood_s or canaries < 1 or canary_tokens < 3:
        raise ValueError("the bench needs tools >= 1, 0 < period_s <= flood_s, canaries >= 1, canary_tokens >= 3")
    profile = cProfile.Profile()
    original, profiled = _profiled_loop(profile)
    EngineWorker._loop = profiled  # type: ignore[method-assign]
    sent = answered = refused = 0
    try:
        app = create_app(Engine.from_pretrained(), model_names=["m"], max_queue=256)
        with serve_in_thread(app) as url, httpx.Client() as client:
            _canary(client, url, canary_tokens)  # warm
            alone = [_canary(client, url, canary_tokens) for _ in range(canaries)]
            stop = threading.Event()

            def one(salt: int) -> None:
                nonlocal answered, refused
                body = {
                    "model": "m",
                    "messages": [{"role": "user", "content": f"Look up record {salt}."}],
                    "tools": _tools(tools, salt if fresh else 0),
                    "max_tokens": flood_tokens,
                }
                reply = httpx.post(url + "/v1/chat/completions", json=body, timeout=120)
                if reply.status_code == 200:
                    answered += 1
                else:
                    refused += 1

            def flood(pool: ThreadPoolExecutor) -> None:
                nonlocal sent
                begin = time.perf_counter()
                while not stop.is_set() and time.perf_counter() - begin < flood_s:
                    pool.submit(one, sent)
                    sent += 1
                    stop.wait(period_s)

            with ThreadPoolExecutor(32) as pool:
                flooding = threading.Thread(target=flood, args=(pool,))
                flooding.start()
                beside = []
                while flooding.is_alive() and len(beside) < canaries:
                    beside.append(_canary(client, url, canary_tokens))
                stop.set()
                flooding.join()
    finally:
        EngineWorker._loop = original  # type: ignore[method-assign]
    if not beside:
        raise RuntimeError("no canary finished while the flood ran; lengthen flood_s")
    return {
        "benchmark": "engine_thread",
        "settings": {
            "tools": tools,
            "fresh": fresh,
            "period_s": period_s,
            "flood_s": flood_s,
            "canary_tokens": canary_tokens,
            "flood_tokens": flood_tokens,
        },
        "flood": {"sent": sent, "answered": answered, "refused": refused},
        "canary_ms_per_token": {
            "alone": round(1000 * statistics.median(alone), 2),
            "beside_flood": round(1000 * statistics.median(beside), 2),
            "beside_runs": len(beside),
        },
        "engine_thread": _shares(profile),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="hypic-rag bench engine-thread", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tools", type=int, default=12, help="tool schemas per flood request")
    parser.add_argument("--period", type=float, default=0.1, help="seconds between flood requests")
    parser.add_argument("--flood-seconds", type=float, default=10.0, help="how long the flood runs")
    parser.add_argument("--canaries", type=int, default=5, help="streamed canaries alone, and beside the flood")
    parser.add_argument("--fresh", action="store_true", help="new tool schemas in every flood request")
    parser.add_argument("--flood-tokens", type=int, default=1, help="max_tokens of each flood request")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(
        args.tools, args.period, args.flood_seconds, args.canaries, fresh=args.fresh, flood_tokens=args.flood_tokens
    )
    print(
        f"canary ms/token: alone {report['canary_ms_per_token']['alone']}, "
        f"beside the flood {report['canary_ms_per_token']['beside_flood']}"
    )
    for step, spent in report["engine_thread"].items():
        if step != "top_own_time":
            print(f"engine thread, {step}: {spent}")
    for entry in report["engine_thread"]["top_own_time"]:
        print(f"  {entry['s']:8.3f} s  {entry['function']}")
    write_report(report, args.json, "engine_thread")


if __name__ == "__main__":
    main()
