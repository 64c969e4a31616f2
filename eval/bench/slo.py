"""Throughput under a TTFT SLO: a serving simulation driven by service times measured on the engine.

    python -m hypic_rag.eval.bench.slo --json slo.json

1. **Measure.** On one checkpoint, the TTFT of a k-document prompt for each mode and each number of
   cached documents c = 0..k: ``hypic`` with c documents cached (in any order), ``prefix`` with the
   first c documents cached as a prefix, ``full`` (no reuse).
2. **Simulate.** Poisson arrivals; each request draws k distinct documents from a corpus with Zipf
   popularity, in random order, plus a fresh query. One server, first come first served. Each mode
   keeps its own cache model: a byte-budget LRU of documents (``hypic``) or of whole-segment prefix
   nodes (``prefix``), sized from the entries measured in step 1. TTFT = queueing + service.
3. **Search.** The highest QPS whose P90 TTFT stays under the SLO, by bisection.
4. **Check.** A closed-loop run on the real engine (one client, back to back) against the service
   times the simulator predicts for the same request sequence and cache model.

Written here because the question is narrow (one queue, known service times) and a discrete-event
library would add a dependency for a loop of a few lines.
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hypic_rag import Engine, Segment

from .common import RandomSegments, best_of, random_engine, write_report

SIM_MODES = ("full", "prefix", "hypic")


@dataclass
class Traffic:
    """What the simulated server is asked: ``k`` documents per request from a corpus with Zipf popularity."""

    corpus: int = 200
    k: int = 4
    zipf: float = 1.1
    doc_tokens: int = 512
    query_tokens: int = 32

    def requests(self, n: int, seed: int) -> list[list[int]]:
        """``n`` requests, each k distinct document ids (Zipf popularity) in random order."""
        rng = random.Random(seed)
        weights = [1.0 / (i + 1) ** self.zipf for i in range(self.corpus)]
        cumulative = list(itertools.accumulate(weights))  # what ``choices`` would sum again on every draw
        out = []
        for _ in range(n):
            chosen: list[int] = []
            while len(chosen) < self.k:
                d = rng.choices(range(self.corpus), cum_weights=cumulative)[0]
                if d not in chosen:
                    chosen.append(d)
            rng.shuffle(chosen)
            out.append(chosen)
        return out


class CacheModel:
    """How many of a request's documents a mode finds cached, with LRU eviction by count."""

    def __init__(self, mode: str, capacity: int) -> None:
        self.mode, self.capacity = mode, capacity
        self.lru: OrderedDict[tuple[int, ...] | int, None] = OrderedDict()

    def _touch(self, key: tuple[int, ...] | int) -> None:
        self.lru.pop(key, None)
        self.lru[key] = None
        while len(self.lru) > self.capacity:
            self.lru.popitem(last=False)

    def serve(self, docs: Sequence[int]) -> int:
        """The cached count c for this request, then the cache as the engine leaves it."""
        if self.mode == "full":
            return 0
        if self.mode == "hypic":
            cached = sum(d in self.lru for d in docs)
            for d in docs:
                self._touch(d)
            return cached
        depth = 0
        while depth < len(docs) and tuple(docs[: depth + 1]) in self.lru:
            depth += 1
        for i in range(len(docs)):
            self._touch(tuple(docs[: i + 1]))
        return depth


class Docs:
    """The corpus's documents as random-token segments, each made when first asked for, and fresh queries."""

    def __init__(self, engine: Engine, traffic: Traffic, seed: int = 0) -> None:
        self.random, self.traffic = RandomSegments(engine.config.vocab_size, seed), traffic
        self.docs: dict[int, Segment] = {}

    def doc(self, i: int) -> Segment:
        if i not in self.docs:
            self.docs[i] = self.random.segment(self.traffic.doc_tokens)
        return self.docs[i]

    def query(self) -> Segment:
        return self.random.segment(self.traffic.query_tokens, "query")


def measure_service(engine: Engine, traffic: Traffic, repeats: int = 2, log: Callable = print) -> dict[str, Any]:
    """TTFT per mode per cached count c = 0..k, and the bytes one cached document / prefix node takes."""
    docs = Docs(engine, traffic, seed=1)
    k = traffic.k
    table: dict[str, list[float]] = {}
    nbytes: dict[str, float] = {}
    fresh = iter(range(10**6, 10**7))
    for mode in SIM_MODES:  # warm-up: first calls pay for allocation and lazy initialisation
        engine.generate([docs.doc(next(fresh)) for _ in range(k)], docs.query(), mode=mode, max_new_tokens=1)
    for mode in SIM_MODES:
        row = []
        for c in range(k + 1):

            def trial(mode: str = mode, c: int = c) -> tuple[float, None]:
                engine.clear_cache()
                cached = [docs.doc(next(fresh)) for _ in range(c)]
                if c and mode != "full":
                    warm = cached if mode == "prefix" else cached[::-1]
                    engine.generate(warm, docs.query(), mode=mode, max_new_tokens=1)
                prompt = cached + [docs.doc(next(fresh)) for _ in range(k - c)]
                out = engine.generate(prompt, docs.query(), mode=mode, max_new_tokens=1)
                assert out.stats.get("hit_segments", 0) == (c if mode != "full" else 0), out.stats
                if mode == "hypic" and c:
                    nbytes["hypic"] = out.stats["cache_bytes"] / c
                return out.ttft_s, None

            row.append(best_of(repeats, trial)[0])
        table[mode] = row
        log(f"  {mode:<7} TTFT by cached documents 0..{k}: " + " ".join(f"{t:.3f}" for t in row))
    engine.clear_cache()
    prompt = [docs.doc(next(fresh)) for _ in range(k)]
    engine.generate(prompt, docs.query(), mode="prefix", max_new_tokens=1)
    nbytes["prefix"] = engine.prefix_store.stats()["prefix_bytes"] / k
    engine.clear_cache()
    return {"ttft_s": table, "bytes_per_entry": nbytes}


def simulate(
    mode: str, service: list[float], capacity: int, traffic: Traffic, qps: float, n: int, seed: int
) -> list[float]:
    """TTFT of each request (after a warm-up tenth) at ``qps`` Poisson arrivals on one server."""
    rng = random.Random(seed + 7)
    cache = CacheModel(mode, capacity)
    clock = free_at = 0.0
    ttfts = []
    for docs in traffic.requests(n, seed):
        clock += rng.expovariate(qps)
        start = max(clock, free_at)
        free_at = start + service[cache.serve(docs)]
        ttfts.append(free_at - clock)
    return ttfts[n // 10 :]


def percentile(values: Sequence[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def max_qps(
    mode: str, service: list[float], capacity: int, traffic: Traffic, slo: float, n: int, seed: int, pct: float = 90
) -> float:
    """The highest QPS (bisection, 1% resolution) whose P{pct} TTFT is within ``slo``."""

    def ok(q: float) -> bool:
        return percentile(simulate(mode, service, capacity, traffic, q, n, seed), pct) <= slo

    lo, hi = 0.0, 1.0 / min(service)  # no server sustains more than its fastest service rate
    if not ok(hi * 0.01):
        return 0.0
    lo = hi * 0.01
    while hi - lo > 0.01 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo


def closed_loop(
    engine: Engine, traffic: Traffic, service: dict[str, list[float]], capacities: dict[str, int], n: int, seed: int
) -> dict[str, Any]:
    """Real back-to-back requests against the simulator's predicted service times for the same ones."""
    docs = Docs(engine, traffic, seed=2)
    requests = traffic.requests(n, seed)
    out: dict[str, Any] = {}
    for mode in SIM_MODES:
        engine.clear_cache()
        cache = CacheModel(mode, capacities[mode])
        measured, predicted = [], []
        for req in requests:
            got = engine.generate([docs.doc(d) for d in req], docs.query(), mode=mode, max_new_tokens=1)
            measured.append(got.ttft_s)
            predicted.append(service[mode][cache.serve(req)])
        total_m, total_p = sum(measured), sum(predicted)
        out[mode] = {
            "measured_mean_ttft_s": total_m / n,
            "predicted_mean_ttft_s": total_p / n,
            "relative_difference": (total_p - total_m) / total_m,
        }
    engine.clear_cache()
    return out


def run(
    traffic: Traffic | None = None,
    layers: int = 2,
    slo_factor: float = 2.0,
    requests: int = 2000,
    check_requests: int = 24,
    memory_bytes: int = 4 << 30,
    seed: int = 0,
    shapes: dict[str, Any] | None = None,
    log: Callable[[str], None] = print,
    repeats: int = 2,
) -> dict[str, Any]:
    """The SLO is ``slo_factor`` x the TTFT of a ``full`` request on an idle server."""
    traffic = traffic or Traffic()
    if min(traffic.k, traffic.corpus - traffic.k, layers, requests, check_requests) < 1 or slo_factor <= 0:
        raise ValueError("k, layers and request counts must be >= 1, the corpus larger than k, the SLO factor > 0")
    engine = random_engine(layers, shapes, log, memory_bytes=memory_bytes)[0]
    log(f"measuring service times: {traffic.k} docs x {traffic.doc_tokens} tokens, {layers} layers")
    measured = measure_service(engine, traffic, repeats, log=log)
    service = measured["ttft_s"]
    capacities = {m: max(1, int(memory_bytes // measured["bytes_per_entry"].get(m, 1))) for m in SIM_MODES}
    slo = slo_factor * service["full"][0]
    log(f"SLO: P90 TTFT <= {slo:.3f}s ({slo_factor}x an idle full request)")
    qps = {m: max_qps(m, service[m], capacities[m], traffic, slo, requests, seed) for m in SIM_MODES}
    for m, q in qps.items():
        log(f"  {m:<7} max QPS {q:.3f}")
    ratio = {m: qps[m] / qps["prefix"] if qps["prefix"] else float("inf") for m in SIM_MODES}
    log(f"hypic / prefix QPS: {ratio['hypic']:.2f}x")
    log(f"closed-loop check: {check_requests} real requests per mode")
    check = closed_loop(engine, traffic, service, capacities, check_requests, seed + 1)
    for m, row in check.items():
        log(
            f"  {m:<7} measured {row['measured_mean_ttft_s']:.3f}s  predicted {row['predicted_mean_ttft_s']:.3f}s  "
            f"({100 * row['relative_difference']:+.1f}%)"
        )
    return {
        "benchmark": "slo",
        "workload": vars(traffic),  # the key earlier reports used
        "layers": layers,
        "threads": torch.get_num_threads(),
        "slo_s": slo,
        "percentile": 90,
        "service_ttft_s": service,
        "bytes_per_entry": measured["bytes_per_entry"],
        "capacity_entries": capacities,
        "max_qps": qps,
        "qps_over_prefix": ratio,
        "closed_loop": check,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=int, default=200)
    parser.add_argument("--k", type=int, default=4, help="documents per request")
    parser.add_argument("--zipf", type=float, default=1.1)
    parser.add_argument("--doc-tokens", type=int, default=512)
    parser.add_argument("--query-tokens", type=int, default=32)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--slo-factor", type=float, default=2.0)
    parser.add_argument("--requests", type=int, default=2000, help="simulated requests per QPS point")
    parser.add_argument("--check-requests", type=int, default=24, help="real closed-loop requests per mode")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    traffic = Traffic(args.corpus, args.k, args.zipf, args.doc_tokens, args.query_tokens)
    report = run(traffic, args.layers, args.slo_factor, args.requests, args.check_requests)
    if args.json:
        write_report(report, args.json, "slo")


if __name__ == "__main__":
    main()
