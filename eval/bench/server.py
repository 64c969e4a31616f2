"""Throughput under a TTFT SLO, measured over HTTP on a live ``hypic-rag serve``, beside the simulator's prediction.

    python -m hypic_rag.eval.bench.server --json bench-server.json     (or: hypic-rag bench --server)

1. **Serve.** A random-weight checkpoint (Qwen3.5-0.8B layer shapes, ``layers`` decoder layers) with a ChatML
   template and a BPE tokenizer trained on the corpus's words, served by ``hypic-rag serve`` in its own process on
   127.0.0.1 (one torch thread by default; the load generator has the other core).
2. **Service times.** Over HTTP, one request at a time: the TTFT (to the first streamed chunk) of a k-document
   prompt for each mode and each number c = 0..k of cached documents, as ``bench.slo`` measures them in-process;
   the median of ``repeats``. These feed the simulator, so simulator and live run share service times and differ
   only where the simulator's model of the server (one FIFO queue, a request's TTFT = waiting + its service time,
   an LRU of documents or prefix nodes) differs from the real one.
3. **Simulate.** ``bench.slo``'s simulator on the same traffic (Zipf documents in random order, Poisson arrivals):
   the highest QPS whose P90 TTFT is within the SLO.
4. **Live.** For each mode, its cache warmed by ``warmup`` requests of the same traffic sent one at a time, then
   probes: ``requests`` requests at Poisson arrivals at a QPS (each on its own connection, ``max_tokens=1`` and
   streamed), P90 TTFT over all but the first tenth; the highest QPS within the SLO is found by bracketing the
   simulator's answer and bisecting, ``probes`` probes in all. Every probe is bounded in requests and in time.

The SLO is ``slo_factor`` x the TTFT of an idle ``full`` request.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from .slo import SIM_MODES, CacheModel, Traffic, max_qps, percentile

MODEL = "bench"
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_SYLLABLES = [a + b for a in "bdfgklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en", "il", "on", "us")]


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choices(_SYLLABLES, k=rng.randint(1, 3))) for _ in range(n))


def build_checkpoint(out: Path, layers: int, vocab: int = 2000, seed: int = 0) -> Path:
    """A random Qwen3.5-0.8B-shaped checkpoint with a ChatML template and a tokenizer for the corpus's words."""
    from hypic_rag.testing.synthetic import add_chat_files
    from hypic_rag.testing.synthetic import build_checkpoint as build

    from .common import layer_shapes

    build("qwen3_5_text", out, layer_shapes(layers, max_position_embeddings=262144), seed)
    rng = random.Random(seed)
    return add_chat_files(out, CHATML, vocab_size=vocab, texts=[_words(rng, 200) for _ in range(50)])


class Corpus:
    """Document ``i`` is words drawn from its own seed until it is ``doc_tokens`` tokens; queries are fresh."""

    def __init__(self, tokenizer: Any, traffic: Traffic, seed: int = 0) -> None:
        self.tokenizer, self.traffic, self.seed = tokenizer, traffic, seed
        self._docs: dict[int, str] = {}
        self._queries = random.Random(seed + 1)

    def _sized(self, rng: random.Random, tokens: int) -> str:
        text = ""
        while len(self.tokenizer.encode(text).ids) < tokens:
            text += (" " if text else "") + _words(rng, 8)
        return text

    def doc(self, i: int) -> str:
        if i not in self._docs:
            self._docs[i] = self._sized(random.Random(f"{self.seed}-{i}"), self.traffic.doc_tokens)
        return self._docs[i]

    def messages(self, docs: Sequence[int]) -> list[dict[str, Any]]:
        parts = [{"type": "text", "text": self.doc(d) + "\n\n", "hypic": {"kind": "document"}} for d in docs]
        query = "Question: " + self._sized(self._queries, self.traffic.query_tokens) + "?"
        return [{"role": "user", "content": [*parts, {"type": "text", "text": query}]}]


@contextmanager
def running_server(checkpoint: Path, threads: int, log: Callable[[str], None]) -> Any:
    """``hypic-rag serve`` on a free loopback port, in its own process; yields its base URL."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    command = [sys.executable, "-m", "hypic_rag.cli", "serve", "--model", str(checkpoint), "--port", str(port)]
    command += ["--served-model-name", MODEL, "--max-queue", "4096", "--log-level", "warning"]
    proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"the server exited: {proc.stdout.read() if proc.stdout else ''}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the server did not come up in 300 s")
            time.sleep(0.2)
        log(f"server up at {url} ({threads} torch thread{'s' * (threads > 1)})")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def ttft(client: httpx.Client, url: str, messages: list[dict], mode: str, timeout: float = 600) -> float:
    """Seconds from sending the request to its first streamed chunk (the first token)."""
    body = {"model": MODEL, "messages": messages, "max_tokens": 1, "stream": True, "hypic": {"mode": mode}}
    start = time.perf_counter()
    first = None
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=timeout) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.read().decode()}")
        for line in response.iter_lines():  # read to the end, so the next request finds the engine idle
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("the stream ended without a chunk")
    return first


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def measure_service(
    url: str, corpus: Corpus, traffic: Traffic, repeats: int, log: Callable[[str], None]
) -> tuple[dict[str, list[float]], dict[str, float]]:
    """TTFT per mode per cached count c = 0..k over HTTP, and the bytes per cached document / prefix node."""
    fresh = iter(range(10**6, 10**7))  # documents outside the corpus: cold unless this function warms them
    k, table = traffic.k, {}
    hypic_docs = 0
    with httpx.Client() as client:
        for mode in SIM_MODES:  # warm-up: first calls pay for allocation and lazy initialisation
            ttft(client, url, corpus.messages([next(fresh) for _ in range(k)]), mode)
        hypic_docs += k
        for mode in SIM_MODES:
            row = []
            for c in range(k + 1):
                times = []
                for _ in range(repeats):
                    cached = [next(fresh) for _ in range(c)]
                    if c and mode != "full":
                        ttft(client, url, corpus.messages(cached if mode == "prefix" else cached[::-1]), mode)
                    prompt = cached + [next(fresh) for _ in range(k - c)]
                    times.append(ttft(client, url, corpus.messages(prompt), mode))
                    hypic_docs += k if mode == "hypic" else 0
                row.append(statistics.median(times))
            table[mode] = row
            log(f"  {mode:<7} TTFT over HTTP by cached documents 0..{k}: " + " ".join(f"{t:.3f}" for t in row))
    per_entry = {
        "hypic": metric(url, 'hypic_cache_bytes{tier="memory"}') / hypic_docs,
        "prefix": metric(url, 'hypic_cache_bytes{tier="prefix"}')
        / max(1.0, metric(url, 'hypic_cache_entries{tier="prefix"}')),
    }
    return table, per_entry


def probe(
    url: str, corpus: Corpus, requests: list[list[int]], mode: str, qps: float, seed: int, time_limit: float
) -> dict[str, Any]:
    """``requests`` at Poisson arrivals at ``qps``; TTFT measured from each one's scheduled arrival."""
    rng = random.Random(seed + 7)
    arrivals, clock = [], 0.0
    for _ in requests:
        clock += rng.expovariate(qps)
        arrivals.append(clock)
    bodies = [corpus.messages(docs) for docs in requests]  # built before the clock starts
    results: list[float | None] = [None] * len(requests)
    errors: list[str] = []
    start = time.perf_counter()

    def one(i: int) -> None:
        with httpx.Client() as client:
            delay = start + arrivals[i] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                lag = time.perf_counter() - (start + arrivals[i])  # the load generator's own delay, if any
                results[i] = lag + ttft(client, url, bodies[i], mode, timeout=time_limit)
            except Exception as exc:  # a failed request is reported, never dropped
                errors.append(f"{type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(max_workers=min(256, len(requests))) as pool:
        list(pool.map(one, range(len(requests))))
    done = [t for t in results[len(requests) // 10 :] if t is not None]
    p90 = percentile(done, 90) if done else float("inf")
    return {
        "qps": qps,
        "requests": len(requests),
        "p90_ttft_s": p90,
        "errors": errors,
        "wall_s": time.perf_counter() - start,
    }


def live_max_qps(
    ok: Callable[[float], bool], guess: float, probes: int, log: Callable[[str], None]
) -> tuple[float, list[float]]:
    """The highest QPS that passes ``ok``: bracket ``guess`` (doubling or halving), then bisect, ``probes`` in all."""
    tried: list[float] = []
    lo, hi = 0.0, float("inf")
    q = guess
    for _ in range(probes):
        tried.append(q)
        if ok(q):
            lo = q
            q = q * 1.5 if hi == float("inf") else (lo + hi) / 2
        else:
            hi = q
            q = q / 1.5 if lo == 0 else (lo + hi) / 2
    return lo, tried


def run(
    traffic: Traffic | None = None,
    layers: int = 2,
    slo_factor: float = 2.0,
    requests: int = 40,
    warmup: int = 40,
    probes: int = 4,
    repeats: int = 3,
    threads: int = 1,
    sim_requests: int = 2000,
    memory_bytes: int = 2 << 30,
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    traffic = traffic or Traffic(corpus=100, k=4, zipf=1.1, doc_tokens=256, query_tokens=32)
    if min(traffic.k, traffic.corpus - traffic.k, layers, requests, probes, repeats, threads) < 1 or slo_factor <= 0:
        raise ValueError("k, layers, requests, probes, repeats and threads must be >= 1, the corpus larger than k")
    from tokenizers import Tokenizer

    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_checkpoint(Path(tmp) / "model", layers, seed=seed)
        corpus = Corpus(Tokenizer.from_file(str(checkpoint / "tokenizer.json")), traffic, seed)
        log(f"random qwen3_5_text, {layers} layers; {traffic.k} docs x {traffic.doc_tokens} tokens per request")
        with running_server(checkpoint, threads, log) as url:
            log("service times over HTTP:")
            service, per_entry = measure_service(url, corpus, traffic, repeats, log)
            slo = slo_factor * service["full"][0]
            capacity = {"full": 1, **{m: max(1, int(memory_bytes // per_entry[m])) for m in ("hypic", "prefix")}}
            log(f"SLO: P90 TTFT <= {slo:.3f}s ({slo_factor}x an idle full request over HTTP)")
            predicted = {m: max_qps(m, service[m], capacity[m], traffic, slo, sim_requests, seed) for m in SIM_MODES}
            results: dict[str, Any] = {}
            for index, mode in enumerate(SIM_MODES):
                stream = traffic.requests(warmup + requests * probes, seed + 100 * index)
                with httpx.Client() as client:
                    for docs in stream[:warmup]:
                        ttft(client, url, corpus.messages(docs), mode)
                queue = iter(range(probes))
                runs: list[dict[str, Any]] = []

                def ok(q: float, mode: str = mode, stream: list = stream, runs: list = runs, queue=queue) -> bool:
                    i = next(queue)
                    batch = stream[warmup + i * requests : warmup + (i + 1) * requests]
                    row = probe(url, corpus, batch, mode, q, seed + i, time_limit=max(60.0, 20 * slo))
                    # The simulator on the same requests at the same QPS, from the cache the live run had.
                    cache = CacheModel(mode, capacity[mode])
                    for docs in stream[: warmup + i * requests]:
                        cache.serve(docs)
                    row["predicted_p90_ttft_s"] = _predict_p90(cache, service[mode], batch, q, seed + i)
                    row["ok"] = not row["errors"] and row["p90_ttft_s"] <= slo
                    runs.append(row)
                    log(
                        f"  {mode:<7} {q:7.3f} QPS: P90 TTFT {row['p90_ttft_s']:.3f}s live, "
                        f"{row['predicted_p90_ttft_s']:.3f}s simulated, {len(row['errors'])} errors "
                        f"-> {'within' if row['ok'] else 'over'} the SLO"
                    )
                    return row["ok"]

                live, _ = live_max_qps(ok, predicted[mode], probes, log)
                results[mode] = {"live_max_qps": live, "simulated_max_qps": predicted[mode], "probes": runs}
                log(f"  {mode:<7} max QPS live {live:.3f}, simulated {predicted[mode]:.3f}")
    live_ratio = {m: _ratio(results[m]["live_max_qps"], results["prefix"]["live_max_qps"]) for m in SIM_MODES}
    sim_ratio = {m: _ratio(results[m]["simulated_max_qps"], results["prefix"]["simulated_max_qps"]) for m in SIM_MODES}
    log(f"hypic / prefix QPS: live {live_ratio['hypic']:.2f}x, simulated {sim_ratio['hypic']:.2f}x")
    return {
        "benchmark": "server",
        "workload": vars(traffic),
        "layers": layers,
        "server_threads": threads,
        "slo_s": slo,
        "percentile": 90,
        "service_ttft_s": service,
        "bytes_per_entry": per_entry,
        "capacity_entries": capacity,
        "requests_per_probe": requests,
        "warmup_requests": warmup,
        "results": results,
        "live_qps_over_prefix": live_ratio,
        "simulated_qps_over_prefix": sim_ratio,
        "simulated_over_live": {
            m: _ratio(results[m]["simulated_max_qps"], results[m]["live_max_qps"]) for m in SIM_MODES
        },
    }


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def _predict_p90(cache: CacheModel, service: list[float], batch: list[list[int]], qps: float, seed: int) -> float:
    """``simulate``'s queue on exactly these requests and arrivals, from ``cache`` as it stands."""
    rng = random.Random(seed + 7)  # the arrivals ``probe`` drew
    clock = free_at = 0.0
    ttfts = []
    for docs in batch:
        clock += rng.expovariate(qps)
        start = max(clock, free_at)
        free_at = start + service[cache.serve(docs)]
        ttfts.append(free_at - clock)
    return percentile(ttfts[len(batch) // 10 :], 90)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=int, default=100)
    parser.add_argument("--k", type=int, default=4, help="documents per request")
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--doc-tokens", type=int, default=256)
    parser.add_argument("--query-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--slo-factor", type=float, default=2.0)
    parser.add_argument("--requests", type=int, default=40, help="requests per live probe")
    parser.add_argument("--warmup", type=int, default=40, help="requests that warm each mode's cache first")
    parser.add_argument("--probes", type=int, default=4, help="live QPS probes per mode")
    parser.add_argument("--repeats", type=int, default=3, help="service-time measurements per point (median)")
    parser.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    traffic = Traffic(args.corpus, args.k, args.zipf, args.doc_tokens, args.query_tokens)
    report = run(
        traffic, args.layers, args.slo_factor, args.requests, args.warmup, args.probes, args.repeats, args.threads
    )
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
