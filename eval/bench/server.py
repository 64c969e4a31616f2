"""Throughput under a TTFT SLO, measured over HTTP on a live ``hypic-rag serve``, beside the simulator's prediction.

    python -m hypic_rag.eval.bench.server --json bench-server.json     (or: hypic-rag bench --server)

1. **Serve.** A random-weight checkpoint (Qwen3.5-0.8B layer shapes, ``layers`` decoder layers) with a ChatML
   template and a BPE tokenizer trained on the corpus's words, served by ``hypic-rag serve`` in its own process on
   127.0.0.1 (one torch thread by default; the load generator has the other core).
2. **Service times.** Over HTTP, one request at a time, just before each mode's live run (this shared machine's
   speed drifts over a run): the TTFT (to the first streamed chunk) of a k-document prompt for each number
   c = 0..k of cached documents, as ``bench.slo`` measures them in-process; the median of ``repeats``. These
   feed the simulator, so simulator and live run share service times and differ only where the simulator's
   model of the server (one FIFO queue, a request's TTFT = waiting + a fixed service time per c, an LRU of
   documents or prefix nodes) differs from the real one. Each probe also reports the engine's own mean prefill
   time, to tell a slower machine from a wrong model.
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
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import httpx

from .common import write_report
from .slo import SIM_MODES, CacheModel, Traffic, max_qps, percentile

MODEL = "bench"
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
_SYLLABLES = [a + b for a in "bdfgklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en", "il", "on", "us")]


def _words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choices(_SYLLABLES, k=rng.randint(1, 3))) for _ in range(n))


def build_checkpoint(
    out: Path, layers: int, vocab: int = 2000, seed: int = 0, shapes: dict[str, Any] | None = None
) -> Path:
    """A random checkpoint (Qwen3.5-0.8B layer shapes unless ``shapes``) with a ChatML template and a tokenizer
    for the corpus's words."""
    from hypic_rag.testing.synthetic import add_chat_files
    from hypic_rag.testing.synthetic import build_checkpoint as build

    from .common import layer_shapes

    config = layer_shapes(layers, shapes, max_position_embeddings=262144)
    build("qwen3_5_text", out, config, seed)
    rng = random.Random(seed)
    vocab = min(vocab, config["vocab_size"])  # every token id must be one the model has
    return add_chat_files(out, CHATML, vocab_size=vocab, texts=[_words(rng, 200) for _ in range(50)])


def default_traffic() -> Traffic:
    """4 documents of 256 tokens from a corpus of 100 with Zipf(1.1) popularity, and a 32-token question."""
    return Traffic(corpus=100, k=4, zipf=1.1, doc_tokens=256, query_tokens=32)


class Corpus:
    """Document ``i`` is words drawn from its own seed until it is ``doc_tokens`` tokens; queries are fresh."""

    def __init__(self, tokenizer: Any, traffic: Traffic, seed: int = 0) -> None:
        self.tokenizer, self.traffic, self.seed = tokenizer, traffic, seed
        self._docs: dict[int, str] = {}
        self._queries = random.Random(seed + 1)

    @classmethod
    def of(cls, checkpoint: Path, traffic: Traffic, seed: int = 0) -> Corpus:
        """Sized with the tokenizer of ``checkpoint``."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(checkpoint / "tokenizer.json")), traffic, seed)

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
def running_server(
    checkpoint: Path, threads: int, log: Callable[[str], None], max_active: int = 8, cache_url: str | None = None
) -> Any:
    """``hypic-rag serve`` on a free loopback port, in its own process; yields its base URL."""
    from hypic_rag.testing.server import serve_in_process

    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    args = ["--model", str(checkpoint), "--served-model-name", MODEL, "--max-queue", "4096"]
    args += ["--max-active", str(max_active), "--queue-timeout", "3600"]  # a loaded machine's run must not 429
    args += ["--cache-url", cache_url] if cache_url else []
    with serve_in_process(args, env) as url:
        log(f"server up at {url} ({threads} torch thread{'s' * (threads > 1)})")
        yield url


def ttft(client: httpx.Client, url: str, messages: list[dict], mode: str, timeout: float = 600) -> float:
    """Seconds from sending the request to its first streamed chunk (the first token)."""
    return timed_stream(client, url, messages, mode, 1, timeout)[0]


def timed_stream(
    client: httpx.Client, url: str, messages: list[dict], mode: str, max_tokens: int, timeout: float = 600
) -> tuple[float, float, int]:
    """Seconds to the first streamed chunk and to the last, and the tokens generated."""
    first, last, tokens, _, _ = _stream(client, url, messages, mode, max_tokens, timeout)
    return first, last, tokens


def _stream(
    client: httpx.Client, url: str, messages: list[dict], mode: str, max_tokens: int, timeout: float = 600
) -> tuple[float, float, int, float, str]:
    """Seconds to the first streamed chunk and to the last, the tokens generated, the engine's own prefill
    seconds (its ``ttft_s``: the prompt's forward, without queueing or HTTP) and the answer's text."""
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
        "hypic": {"mode": mode},
    }
    start = time.perf_counter()
    tokens, prefill = 0, float("nan")
    first = None
    text: list[str] = []
    with client.stream("POST", url + "/v1/chat/completions", json=body, timeout=timeout) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {response.read().decode()}")
        for line in response.iter_lines():  # read to the end, so the next request finds the engine idle
            if first is None and line.startswith("data: "):
                first = time.perf_counter() - start
            if not line.startswith('data: {"id"'):
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or ():
                text.append((choice.get("delta") or {}).get("content") or "")
            if chunk.get("usage"):
                tokens, prefill = chunk["usage"]["completion_tokens"], chunk["hypic"]["ttft_s"]
    if first is None:
        raise RuntimeError("the stream ended without a chunk")
    return first, time.perf_counter() - start, tokens, prefill, "".join(text)


def metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def measure_service(
    url: str, corpus: Corpus, traffic: Traffic, mode: str, repeats: int, fresh: Any
) -> tuple[list[float], list[float], int]:
    """One mode's TTFT over HTTP for each cached count c = 0..k (the median of ``repeats``), the engine's own
    prefill seconds for the same requests, and how many documents the mode's cache took in doing so.
    ``fresh`` yields document ids outside the corpus, so each measurement starts from known cache contents."""
    k, row, engine_row, stored = traffic.k, [], [], 0
    with httpx.Client() as client:
        ttft(client, url, corpus.messages([next(fresh) for _ in range(k)]), mode)  # first calls pay for warm-up
        stored += k
        for c in range(k + 1):
            times: list[float] = []
            prefills: list[float] = []
            for _ in range(repeats):
                cached = [next(fresh) for _ in range(c)]
                if c and mode != "full":
                    ttft(client, url, corpus.messages(cached if mode == "prefix" else cached[::-1]), mode)
                prompt = cached + [next(fresh) for _ in range(k - c)]
                first, _, _, prefill, _ = _stream(client, url, corpus.messages(prompt), mode, 1)
                times.append(first)
                prefills.append(prefill)
                stored += k
            row.append(statistics.median(times))
            engine_row.append(statistics.median(prefills))
    return row, engine_row, stored


def probe(
    url: str,
    corpus: Corpus,
    requests: list[list[int]],
    mode: str,
    qps: float,
    seed: int,
    time_limit: float,
    max_tokens: int = 1,
) -> dict[str, Any]:
    """``requests`` at Poisson arrivals at ``qps``; TTFT measured from each one's scheduled arrival, and, for
    answers of more than one token, TPOT (time per output token after the first)."""
    rng = random.Random(seed + 7)
    arrivals, clock = [], 0.0
    for _ in requests:
        clock += rng.expovariate(qps)
        arrivals.append(clock)
    bodies = [corpus.messages(docs) for docs in requests]  # built before the clock starts
    results: list[float | None] = [None] * len(requests)
    tpots: list[float | None] = [None] * len(requests)
    prefills: list[float] = [float("nan")] * len(requests)
    errors: list[str] = []
    start = time.perf_counter()

    def one(i: int) -> None:
        with httpx.Client() as client:
            delay = start + arrivals[i] - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            try:
                lag = time.perf_counter() - (start + arrivals[i])  # the load generator's own delay, if any
                first, last, tokens, prefills[i], _ = _stream(client, url, bodies[i], mode, max_tokens, time_limit)
                results[i] = lag + first
                if tokens > 1:
                    tpots[i] = (last - first) / (tokens - 1)
            except Exception as exc:  # a failed request is reported, never dropped
                errors.append(f"{type(exc).__name__}: {exc}")

    with ThreadPoolExecutor(max_workers=min(256, len(requests))) as pool:
        list(pool.map(one, range(len(requests))))
    done = [t for t in results[len(requests) // 10 :] if t is not None]
    p90 = percentile(done, 90) if done else float("inf")
    per_token = [t for t in tpots[len(requests) // 10 :] if t is not None]
    kept = [t for t in prefills[len(requests) // 10 :] if t == t]
    return {
        "qps": qps,
        "requests": len(requests),
        "p90_ttft_s": p90,
        "p90_tpot_s": percentile(per_token, 90) if per_token else None,
        "mean_engine_prefill_s": statistics.mean(kept) if kept else float("nan"),
        "errors": errors,
        "wall_s": time.perf_counter() - start,
    }


class Probes:
    """One mode's live probes: probe i sends requests ``warmup + i * requests`` onwards of ``stream``."""

    def __init__(
        self,
        url: str,
        corpus: Corpus,
        mode: str,
        stream: list[list[int]],
        warmup: int,
        requests: int,
        service: list[float],
        capacity: int,
        slo: float,
        seed: int,
        max_tokens: int = 1,
        tpot_slo: float | None = None,
    ) -> None:
        self.url, self.corpus, self.mode, self.stream = url, corpus, mode, stream
        self.warmup, self.requests, self.service, self.capacity = warmup, requests, service, capacity
        self.slo, self.seed, self.max_tokens, self.tpot_slo = slo, seed, max_tokens, tpot_slo

    def run(self, qps: float, i: int, log: Callable[[str], None]) -> dict[str, Any]:
        begin = self.warmup + i * self.requests
        batch = self.stream[begin : begin + self.requests]
        limit = max(60.0, 20 * self.slo + self.max_tokens * 20 * (self.tpot_slo or 0.0))
        row = probe(self.url, self.corpus, batch, self.mode, qps, self.seed + i, limit, self.max_tokens)
        # The simulator on the same requests at the same QPS, from the cache the live run had.
        cache = CacheModel(self.mode, self.capacity)
        for docs in self.stream[:begin]:
            cache.serve(docs)
        row["predicted_p90_ttft_s"], row["predicted_mean_service_s"] = _predict(
            cache, self.service, batch, qps, self.seed + i
        )
        tpot_ok = self.tpot_slo is None or (row["p90_tpot_s"] is not None and row["p90_tpot_s"] <= self.tpot_slo)
        row["ok"] = not row["errors"] and row["p90_ttft_s"] <= self.slo and tpot_ok
        log(
            f"  {self.mode:<7} {qps:7.3f} QPS: P90 TTFT {row['p90_ttft_s']:.3f}s live, "
            f"{row['predicted_p90_ttft_s']:.3f}s simulated; mean prefill in the engine "
            f"{row['mean_engine_prefill_s']:.3f}s, simulated service {row['predicted_mean_service_s']:.3f}s"
            + (f"; P90 TPOT {row['p90_tpot_s']:.3f}s" if row["p90_tpot_s"] is not None else "")
            + f"; {len(row['errors'])} errors -> {'within' if row['ok'] else 'over'} the SLO"
        )
        return row


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
    shapes: dict[str, Any] | None = None,
    max_tokens: int = 1,
    tpot_slo_factor: float = 3.0,
    max_active: int = 64,
) -> dict[str, Any]:
    """``max_tokens`` > 1: answers of that many tokens, and a probe is within the SLO only when its P90 TPOT is
    within ``tpot_slo_factor`` x an idle ``full`` request's TPOT over HTTP too (each server step then decodes
    every running answer together)."""
    traffic = traffic or default_traffic()
    if max_tokens < 1 or tpot_slo_factor <= 0:
        raise ValueError("max_tokens must be >= 1 and tpot_slo_factor > 0")
    if min(traffic.k, traffic.corpus - traffic.k, layers, requests, probes, repeats, threads) < 1 or slo_factor <= 0:
        raise ValueError("k, layers, requests, probes, repeats and threads must be >= 1, the corpus larger than k")
    service: dict[str, list[float]] = {}
    tpot_slo = float("inf")
    engine_prefill: dict[str, list[float]] = {}
    per_entry: dict[str, float] = {}
    capacity: dict[str, int] = {"full": 1}
    predicted: dict[str, float] = {}
    results: dict[str, Any] = {}
    fresh = iter(range(10**6, 10**7))  # documents outside the corpus
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_checkpoint(Path(tmp) / "model", layers, seed=seed, shapes=shapes)
        corpus = Corpus.of(checkpoint, traffic, seed)
        log(f"random qwen3_5_text, {layers} layers; {traffic.k} docs x {traffic.doc_tokens} tokens per request")
        # Room for every request the machine can decode at once: the modes meet the machine's limit, not a slot cap.
        with running_server(checkpoint, threads, log, max_active=max_active) as url:
            for index, mode in enumerate(SIM_MODES):  # full first: its idle TTFT sets the SLO
                # Each mode's service times are measured just before its live run: the machine's speed drifts.
                service[mode], engine_prefill[mode], stored = measure_service(
                    url, corpus, traffic, mode, repeats, fresh
                )
                log(
                    f"  {mode:<7} TTFT over HTTP by cached documents 0..{traffic.k}: "
                    + " ".join(f"{t:.3f}" for t in service[mode])
                    + " (prefill in the engine: "
                    + " ".join(f"{t:.3f}" for t in engine_prefill[mode])
                    + ")"
                )
                if mode == "full":
                    slo = slo_factor * service["full"][0]
                    log(f"SLO: P90 TTFT <= {slo:.3f}s ({slo_factor}x an idle full request over HTTP)")
                    if max_tokens > 1:
                        idle = []
                        with httpx.Client() as client:
                            for _ in range(repeats):
                                docs = [next(fresh) for _ in range(traffic.k)]
                                idle.append(timed_stream(client, url, corpus.messages(docs), "full", max_tokens))
                        idle_tpot = statistics.median((last - first) / max(1, n - 1) for first, last, n in idle)
                        tpot_slo = tpot_slo_factor * idle_tpot
                        log(f"SLO: P90 TPOT <= {tpot_slo:.4f}s ({tpot_slo_factor}x an idle full request's)")
                else:
                    tier = "memory" if mode == "hypic" else "prefix"
                    held = metric(url, f'hypic_cache_bytes{{tier="{tier}"}}')
                    count = stored if mode == "hypic" else metric(url, 'hypic_cache_entries{tier="prefix"}')
                    per_entry[mode] = held / max(1.0, count)
                    capacity[mode] = max(1, int(memory_bytes // per_entry[mode]))
                predicted[mode] = max_qps(mode, service[mode], capacity[mode], traffic, slo, sim_requests, seed)
                stream = traffic.requests(warmup + requests * probes, seed + 100 * index)
                with httpx.Client() as client:
                    for docs in stream[:warmup]:
                        ttft(client, url, corpus.messages(docs), mode)
                runs: list[dict[str, Any]] = []
                plan = Probes(
                    url,
                    corpus,
                    mode,
                    stream,
                    warmup,
                    requests,
                    service[mode],
                    capacity[mode],
                    slo,
                    seed,
                    max_tokens,
                    tpot_slo if max_tokens > 1 else None,
                )

                def ok(q: float, plan: Probes = plan, runs: list = runs) -> bool:
                    runs.append(plan.run(q, len(runs), log))
                    return runs[-1]["ok"]

                # A simulator that finds no QPS within the SLO (a noisy idle measurement) still leaves a probe to try.
                guess = predicted[mode] if predicted[mode] > 0 else 1 / (4 * max(service[mode]))
                live, _ = live_max_qps(ok, guess, probes, log)
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
        "max_tokens": max_tokens,
        "max_active": max_active,
        "tpot_slo_s": tpot_slo if max_tokens > 1 else None,
        "percentile": 90,
        "service_ttft_s": service,
        "engine_prefill_s": engine_prefill,
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


def concurrency(
    layers: int = 2,
    clients: int = 16,
    max_tokens: int = 32,
    actives: Sequence[int] = (1, 16),
    traffic: Traffic | None = None,
    threads: int = 1,
    seed: int = 0,
    log: Callable[[str], None] = print,
    shapes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """``clients`` requests sent at once (the same k documents, each in its own order, and its own question),
    served with each ``max_active``: 1 answers them one after another, whole, each request alone; more decodes
    every admitted request in one forward a step (continuous batching). TTFT and end-to-end times per request,
    over HTTP, documents warm; each answer is checked against the same request's under ``max_active`` 1."""
    traffic = traffic or default_traffic()

    rng = random.Random(seed)
    orders = [rng.sample(range(traffic.k), traffic.k) for _ in range(clients)]
    report: dict[str, Any] = {"clients": clients, "max_tokens": max_tokens, "layers": layers, "runs": {}}
    answers: dict[int, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_checkpoint(Path(tmp) / "model", layers, seed=seed, shapes=shapes)
        corpus = Corpus.of(checkpoint, traffic, seed)
        bodies = [corpus.messages(order) for order in orders]
        for active in actives:
            with running_server(checkpoint, threads, log, max_active=active) as url:
                with httpx.Client() as client:
                    timed_stream(client, url, corpus.messages(list(range(traffic.k))), "hypic", 1)  # warm the docs
                cpu = metric(url, "process_cpu_seconds_total")
                start = time.perf_counter()

                def one(body: list[dict], start: float = start, url: str = url) -> tuple[float, float, int, str]:
                    with httpx.Client() as client:
                        lag = time.perf_counter() - start
                        first, last, tokens, _, text = _stream(client, url, body, "hypic", max_tokens)
                        return lag + first, lag + last, tokens, text

                with ThreadPoolExecutor(clients) as pool:
                    rows = list(pool.map(one, bodies))
                wall = time.perf_counter() - start
                cpu = metric(url, "process_cpu_seconds_total") - cpu
                steps = metric(url, "hypic_batch_size_count")
                mean_batch = metric(url, "hypic_batch_size_sum") / max(1.0, steps)
            firsts, lasts = [r[0] for r in rows], [r[1] for r in rows]
            tokens = sum(r[2] for r in rows)
            answers[active] = [r[3] for r in rows]
            run = {
                "mean_ttft_s": statistics.mean(firsts),
                "p90_ttft_s": percentile(firsts, 90),
                "max_ttft_s": max(firsts),
                "mean_e2e_s": statistics.mean(lasts),
                "wall_s": wall,
                "generated_tokens": tokens,
                "tokens_per_s": tokens / wall,
                "server_cpu_s": cpu if cpu > 0 else None,  # None where the platform exports no process metrics
                "tokens_per_server_cpu_s": tokens / cpu if cpu > 0 else None,
                "engine_steps": steps,
                "mean_batch_size": mean_batch,
            }
            if min(actives) in answers:
                same = sum(a == b for a, b in zip(answers[active], answers[min(actives)], strict=True))
                run[f"answers_equal_to_max_active_{min(actives)}"] = f"{same}/{clients}"
            report["runs"][str(active)] = run
            log(
                f"  max_active {active}: TTFT mean {run['mean_ttft_s']:.2f}s, P90 {run['p90_ttft_s']:.2f}s, "
                f"max {run['max_ttft_s']:.2f}s; end-to-end mean {run['mean_e2e_s']:.2f}s; "
                f"{clients} answers in {wall:.2f}s ({run['tokens_per_s']:.1f} tokens/s, mean batch {mean_batch:.1f})"
            )
    first, last = (report["runs"][str(a)]["tokens_per_s"] for a in (actives[0], actives[-1]))
    report["tokens_per_s_ratio"] = last / first
    log(f"tokens/s, max_active {actives[-1]} over {actives[0]}: {last / first:.2f}x")
    first, last = (report["runs"][str(a)]["tokens_per_server_cpu_s"] for a in (actives[0], actives[-1]))
    if first and last:  # the server's own CPU seconds: on a shared machine, waits for a core count for neither
        report["tokens_per_server_cpu_s_ratio"] = last / first
        log(f"tokens per server CPU second, max_active {actives[-1]} over {actives[0]}: {last / first:.2f}x")
    return report


def replicas(
    layers: int = 2,
    requests: int = 120,
    traffic: Traffic | None = None,
    threads: int = 1,
    seed: int = 0,
    log: Callable[[str], None] = print,
    shapes: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Two ``hypic-rag serve`` replicas taking the same traffic in turn (as a round-robin balancer gives it),
    without and with a shared Redis tier: the share of document segments each run finds cached."""
    from hypic_rag.testing.redis import RedisServer

    traffic = traffic or default_traffic()

    stream = traffic.requests(requests, seed + 7)
    report: dict[str, Any] = {"requests": requests, "workload": vars(traffic), "runs": {}}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_checkpoint(Path(tmp) / "model", layers, seed=seed, shapes=shapes)
        corpus = Corpus.of(checkpoint, traffic, seed)
        bodies = [corpus.messages(docs) for docs in stream]
        for shared in (False, True):
            redis = RedisServer(Path(tmp) / "redis", maxmemory="2gb") if shared else nullcontext()
            with redis:  # started only for the run that shares it
                url = redis.url if shared else None
                with (
                    running_server(checkpoint, threads, log, cache_url=url) as a,
                    running_server(checkpoint, threads, log, cache_url=url) as b,
                    httpx.Client() as client,
                ):
                    hits = segments = 0
                    for i, messages in enumerate(bodies):
                        body = {"model": MODEL, "messages": messages, "max_tokens": 1, "hypic": {"mode": "hypic"}}
                        out = client.post((a, b)[i % 2] + "/v1/chat/completions", json=body, timeout=600).json()
                        hits += out["hypic"]["hit_segments"]  # documents only: template glue is never cached
                        segments += traffic.k
                        time.sleep(0.05)  # the other replica's background write reaches Redis first
            name = "shared_redis" if shared else "separate"
            report["runs"][name] = {"hit_ratio": hits / segments, "hit_segments": hits, "segments": segments}
            log(f"  2 replicas, {name}: {hits}/{segments} segments cached ({100 * hits / segments:.1f}%)")
    return report


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def _predict(
    cache: CacheModel, service: list[float], batch: list[list[int]], qps: float, seed: int
) -> tuple[float, float]:
    """``simulate``'s queue on exactly these requests and arrivals, from ``cache`` as it stands: the P90 TTFT and
    the mean service time (both over all but the first tenth, as ``probe`` counts them)."""
    rng = random.Random(seed + 7)  # the arrivals ``probe`` drew
    clock = free_at = 0.0
    ttfts, services = [], []
    for docs in batch:
        clock += rng.expovariate(qps)
        start = max(clock, free_at)
        services.append(service[cache.serve(docs)])
        free_at = start + services[-1]
        ttfts.append(free_at - clock)
    skip = len(batch) // 10
    return percentile(ttfts[skip:], 90), statistics.mean(services[skip:])


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
    parser.add_argument("--max-tokens", type=int, default=1, help="answer length; above 1 a TPOT SLO applies too")
    parser.add_argument("--tpot-slo-factor", type=float, default=3.0, help="x an idle full request's TPOT")
    parser.add_argument(
        "--concurrency", action="store_true", help="instead: 16 requests at once, served with max_active 1 and 16"
    )
    parser.add_argument(
        "--replicas", action="store_true", help="instead: the hit ratio of 2 replicas with and without shared Redis"
    )
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    traffic = Traffic(args.corpus, args.k, args.zipf, args.doc_tokens, args.query_tokens)
    if args.concurrency:
        report = concurrency(args.layers, traffic=traffic, threads=args.threads)
    elif args.replicas:
        report = replicas(args.layers, traffic=traffic, threads=args.threads)
    else:
        report = run(
            traffic,
            args.layers,
            args.slo_factor,
            args.requests,
            args.warmup,
            args.probes,
            args.repeats,
            args.threads,
            max_tokens=args.max_tokens,
            tpot_slo_factor=args.tpot_slo_factor,
        )
    if args.json:
        write_report(report, args.json, "server")


if __name__ == "__main__":
    main()
