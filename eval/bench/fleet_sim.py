"""The fleet's routing policy past this machine: its own decision code (``fleet.routing``), not a model of it,
driven by a simulator of many replicas, beside the policies users have, and against the bound of an oracle.

    python -m hypic_rag.eval.bench.fleet_sim --json bench-fleet-sim.json

1. **Traffic.** ``documents`` documents in topics of ``topic_size``. *Clustered* (as RAG traffic is): a request
   picks a topic by Zipf(``zipf``), then ``k`` of its documents in random order; *fixed order*: the same, the
   documents always in one order; *independent*: ``k`` distinct documents by Zipf(``zipf``) over all of them.
2. **Replicas.** ``replicas`` memory tiers, each the engine's own (``cache.lru.ByteLRU`` under ``cache_policy``,
   ``value`` by default: a frequency sketch decides what is admitted) sized to ``tier_share`` of the documents. A
   request's documents found in its replica's tier are hits; the others are offered to it. A request stays in
   flight for the next ``inflight * replicas`` arrivals (``inflight`` a replica on average), which is the load
   the policies see; every ``report_every`` arrivals each replica reports its tier's keys, as ``EngineReplica``
   does.
3. **Policies.** ``affinity`` (``routing.AffinityPolicy``: the router's code, fed what the router is fed);
   ``power_of_two`` (Ray Serve's default: the less loaded of two drawn at random); ``longest_prefix`` (a model of
   Ray's ``PrefixCacheAffinityRouter``: the replica that was sent the longest prefix of the request's document
   sequence, power-of-two when none was or when loads differ by more than ``imbalance``); ``round_robin``.
4. **The oracle's bound.** Tiers that between them hold the ``replicas * tier`` most requested documents, each
   request sent where its documents are: the share of requested documents in that set. No policy can pass it.
5. **Closed loop.** Over fewer replicas (``closed_replicas``; 200 documents, the tiers holding half of them
   between them, as the live benchmark's two do), clients twice the replicas that each send their next request
   when the last is answered, replicas sharing their time among their requests, a miss costing more than a hit
   (``simulate_closed``): hit ratio, the busiest replica's share and mean latency, also on *one topic* traffic
   (every request from one topic, a hot spot).
6. **Cost.** The affinity policy's time a decision and the memory its beliefs take (``tracemalloc``), at each
   replica count.

Hit ratios count the requests after the first ``warmup``; the load bound is checked at every decision.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
import tracemalloc
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hypic_rag.cache.lru import ByteLRU
from hypic_rag.fleet.routing import EPSILON, AffinityPolicy, load_bound

from .common import write_report

POLICIES = ("affinity", "power_of_two", "longest_prefix", "round_robin")
CLOSED_DOCUMENTS, CLOSED_REQUESTS = 200, 2000  # the closed loop's pool and stream (the first half warms up)
TRAFFIC = ("independent", "clustered", "fixed_order")
ONE_TOPIC = "one_topic"  # every request from the first topic: a hot spot no replica can serve alone


class _Document:
    """A cached document as a tier sees it: one unit of its budget."""

    nbytes = 1


DOCUMENT = _Document()


def zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (i + 1) ** s for i in range(n)]


@dataclass
class Traffic:
    """A stream of requests, each a sequence of document ids, and each document's share of the requests."""

    requests: list[tuple[int, ...]]
    mass: list[float]  # per document: the expected times a request asks for it


def make_traffic(kind: str, documents: int, topic_size: int, k: int, zipf: float, n: int, seed: int) -> Traffic:
    rng = random.Random(seed)
    if kind == "independent":
        weights = zipf_weights(documents, zipf)
        total = sum(weights)
        cumulative = list(itertools.accumulate(weights))  # what ``choices`` would sum again on every draw
        requests = []
        for _ in range(n):
            picked: list[int] = []
            while len(picked) < k:
                d = rng.choices(range(documents), cum_weights=cumulative)[0]
                if d not in picked:
                    picked.append(d)
            requests.append(tuple(picked))
        return Traffic(requests, [k * w / total for w in weights])  # approximately: draws without repeats
    topics = documents // topic_size
    if kind == ONE_TOPIC:
        requests = [tuple(rng.sample(range(topic_size), k)) for _ in range(n)]
        return Traffic(requests, [k / topic_size] * topic_size + [0.0] * (documents - topic_size))
    weights = zipf_weights(topics, zipf)
    total = sum(weights)
    cumulative = list(itertools.accumulate(weights))
    requests = []
    for _ in range(n):
        t = rng.choices(range(topics), cum_weights=cumulative)[0]
        docs = rng.sample(range(t * topic_size, (t + 1) * topic_size), k)
        requests.append(tuple(sorted(docs)) if kind == "fixed_order" else tuple(docs))
    mass = [weights[d // topic_size] / total * k / topic_size for d in range(topics * topic_size)]
    return Traffic(requests, mass)


def oracle_bound(traffic: Traffic, held: int) -> float:
    """The share of requested documents among the ``held`` most requested: what tiers partitioned by an
    oracle, holding that many between them, could answer at best."""
    mass = sorted(traffic.mass, reverse=True)
    return sum(mass[:held]) / sum(mass)


class Router:
    """One policy's decisions over replicas ``r0..``: ``choose(docs, load)`` -> replica; ``routed``/``report``."""

    def __init__(self, name: str, replicas: list[str], epsilon: float, imbalance: int, seed: int) -> None:
        self.name, self.replicas, self.rng = name, replicas, random.Random(seed)
        self.epsilon, self.imbalance, self.turn = epsilon, imbalance, 0
        self.affinity = AffinityPolicy(epsilon) if name == "affinity" else None
        self.prefixes: dict[str, set[tuple[int, ...]]] = {r: set() for r in replicas}
        self.decisions = 0
        self.seconds = 0.0

    def choose(self, docs: tuple[int, ...], load: dict[str, int], token: str) -> str:
        start = time.perf_counter()
        try:
            if self.affinity is not None:
                return self.affinity.choose(self.replicas, [f"d{d}" for d in docs], load, token).ranked[0]
            if self.name == "round_robin":
                self.turn += 1
                return self.replicas[self.turn % len(self.replicas)]
            if self.name == "longest_prefix":
                loads = [load.get(r, 0) for r in self.replicas]
                if max(loads) - min(loads) <= self.imbalance:
                    best = max(self.replicas, key=lambda r: (self._match(r, docs), -load.get(r, 0)))
                    if self._match(best, docs):
                        return best
            a, b = self.rng.sample(self.replicas, 2) if len(self.replicas) > 1 else (self.replicas[0],) * 2
            return a if load.get(a, 0) <= load.get(b, 0) else b
        finally:
            self.decisions += 1
            self.seconds += time.perf_counter() - start

    def bounds(self, load: dict[str, int]) -> dict[str, int]:
        """The in-flight bound each replica is held to: the affinity policy's own, else the plain one."""
        if self.affinity is not None:
            return self.affinity.bounds(load, self.replicas)
        return dict.fromkeys(self.replicas, load_bound(load, self.replicas, self.epsilon))

    def _match(self, replica: str, docs: tuple[int, ...]) -> int:
        held = self.prefixes[replica]
        n = 0
        while n < len(docs) and docs[: n + 1] in held:
            n += 1
        return n

    def routed(self, replica: str, docs: tuple[int, ...]) -> None:
        if self.affinity is not None:
            self.affinity.routed(replica, [f"d{d}" for d in docs])
        elif self.name == "longest_prefix":
            self.prefixes[replica].update(docs[: i + 1] for i in range(len(docs)))

    def report(self, replica: str, keys: Sequence[int]) -> None:
        if self.affinity is not None:
            self.affinity.report(replica, [f"d{d}" for d in keys])


def simulate(
    policy: str,
    traffic: Traffic,
    replicas: int,
    tier: int,
    inflight: int,
    report_every: int,
    warmup: int,
    epsilon: float,
    imbalance: int,
    seed: int,
    cache_policy: str = "value",
) -> dict[str, Any]:
    names = [f"r{i}" for i in range(replicas)]
    router = Router(policy, names, epsilon, imbalance, seed)
    tiers = {r: ByteLRU(tier, cache_policy) for r in names}
    load: dict[str, int] = dict.fromkeys(names, 0)
    flight: deque[str] = deque()
    hold = inflight * replicas
    hits = asked = over = 0
    share: dict[str, int] = dict.fromkeys(names, 0)
    for i, docs in enumerate(traffic.requests):
        if i % report_every == 0:
            for r in names:
                router.report(r, [int(key) for key, _ in tiers[r].items_under("")])
        bounds = router.bounds(load)
        chosen = router.choose(docs, load, f"q{i}")
        over += load[chosen] >= bounds[chosen]
        router.routed(chosen, docs)
        cache = tiers[chosen]
        found = [cache.get(str(d)) is not None for d in docs]
        for d, hit in zip(docs, found, strict=True):
            if not hit:
                cache.put(str(d), DOCUMENT)
        if i >= warmup:
            hits += sum(found)
            asked += len(docs)
            share[chosen] += 1
        load[chosen] += 1
        flight.append(chosen)
        if len(flight) > hold:
            load[flight.popleft()] -= 1
    counted = max(1, len(traffic.requests) - warmup)
    return {
        "hit_ratio": hits / max(1, asked),
        "largest_share": max(share.values()) / counted,
        "over_bound_decisions": over,
        "us_per_decision": router.seconds / max(1, router.decisions) * 1e6,
    }


def simulate_closed(
    policy: str,
    traffic: Traffic,
    replicas: int,
    tier: int,
    clients: int,
    warmup: int,
    epsilon: float = EPSILON,
    imbalance: int = 10,
    seed: int = 0,
    miss_cost: float = 2.0,
    report_every: float = 8.0,
) -> dict[str, Any]:
    """``clients`` that each send their next request when the last is answered, as the live benchmark's do. A
    replica shares its time among its requests (processor sharing: one thread, requests batched); a request's
    work is 1 plus ``miss_cost`` a document its tier missed (the live engine's prefill, in units of a hit's
    answer). Replicas report every ``report_every`` units of time. Latency is in those units."""
    names = [f"r{i}" for i in range(replicas)]
    router = Router(policy, names, epsilon, imbalance, seed)
    tiers = {r: ByteLRU(tier, "value") for r in names}
    running: dict[str, list[list[float]]] = {r: [] for r in names}  # replica -> [work left, request, sent at]
    now, sent, done, hits, asked, over = 0.0, 0, 0, 0, 0, 0
    share: dict[str, int] = dict.fromkeys(names, 0)
    latency: list[float] = []
    next_report = report_every

    def dispatch() -> None:
        nonlocal sent, hits, asked, over
        i, docs = sent, traffic.requests[sent]
        sent += 1
        load = {r: len(running[r]) for r in names}
        bounds = router.bounds(load)
        chosen = router.choose(docs, load, f"q{i}")
        over += load[chosen] >= bounds[chosen]
        router.routed(chosen, docs)
        found = [tiers[chosen].get(str(d)) is not None for d in docs]
        for d, hit in zip(docs, found, strict=True):
            if not hit:
                tiers[chosen].put(str(d), DOCUMENT)
        if i >= warmup:
            hits, asked = hits + sum(found), asked + len(docs)
            share[chosen] += 1
        running[chosen].append([1.0 + miss_cost * (len(docs) - sum(found)), float(i), now])

    def advance(dt: float) -> None:
        for jobs in running.values():
            for job in jobs:
                job[0] -= dt / len(jobs)

    for _ in range(min(clients, len(traffic.requests))):
        dispatch()
    while done < len(traffic.requests):
        r, job = min(((r, j) for r in names for j in running[r]), key=lambda rj: rj[1][0] * len(running[rj[0]]))
        dt = job[0] * len(running[r])
        if now + dt > next_report:
            advance(next_report - now)
            now, next_report = next_report, next_report + report_every
            for name in names:
                router.report(name, [int(key) for key, _ in tiers[name].items_under("")])
            continue
        advance(dt)
        now += dt
        running[r].remove(job)
        done += 1
        if job[1] >= warmup:
            latency.append(now - job[2])
        if sent < len(traffic.requests):
            dispatch()
    counted = max(1, len(traffic.requests) - warmup)
    return {
        "hit_ratio": hits / max(1, asked),
        "largest_share": max(share.values()) / counted,
        "mean_latency": statistics.mean(latency),
        "over_bound_decisions": over,
    }


def belief_bytes(replicas: int, documents: int, tier: int, epsilon: float) -> int:
    """The memory an affinity policy's beliefs take once every replica reported a full tier."""
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    policy = AffinityPolicy(epsilon)
    for i in range(replicas):
        policy.report(f"r{i}", [f"d{d}" for d in range(i * tier % documents, i * tier % documents + tier)])
        policy.routed(f"r{i}", [f"d{d}" for d in range(tier)])
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del policy
    return used


def run(
    replicas: Sequence[int] = (8, 32),
    documents: int = 10_000,
    topic_size: int = 8,
    k: int = 4,
    zipf: float = 0.9,
    tier_share: float = 0.02,
    requests: int = 40_000,
    warmup: int = 10_000,
    inflight: int = 4,
    report_every: int = 64,
    epsilon: float = EPSILON,
    imbalance: int = 10,
    seed: int = 0,
    cache_policy: str = "value",
    closed_replicas: Sequence[int] = (2, 4),
    progress: Callable[[str], None] = print,
) -> dict[str, Any]:
    tier = max(1, int(tier_share * documents))
    out: dict[str, Any] = {
        "benchmark": "fleet_sim",
        "documents": documents,
        "topic_size": topic_size,
        "k": k,
        "zipf": zipf,
        "tier_documents": tier,
        "requests": requests,
        "warmup": warmup,
        "inflight_per_replica": inflight,
        "report_every": report_every,
        "epsilon": epsilon,
        "imbalance": imbalance,
        "cache_policy": cache_policy,
        "runs": {},
    }
    for kind in TRAFFIC:
        traffic = make_traffic(kind, documents, topic_size, k, zipf, requests, seed)
        for n in replicas:
            row: dict[str, Any] = {"oracle_bound": oracle_bound(traffic, n * tier)}
            for policy in POLICIES:
                row[policy] = simulate(
                    policy, traffic, n, tier, inflight, report_every, warmup, epsilon, imbalance, seed, cache_policy
                )
            ours = row["affinity"]["hit_ratio"]
            row["affinity_over_oracle"] = ours / row["oracle_bound"]
            for other in ("power_of_two", "longest_prefix", "round_robin"):
                row[f"affinity_over_{other}"] = ours / max(1e-9, row[other]["hit_ratio"])
            out["runs"][f"{kind}/{n}"] = row
            progress(
                f"{kind:12s} {n:3d} replicas: oracle {row['oracle_bound']:.3f}, "
                + ", ".join(f"{p} {row[p]['hit_ratio']:.3f}" for p in POLICIES)
            )
    out["closed"] = {}
    for kind in ("independent", "clustered", ONE_TOPIC):
        traffic = make_traffic(kind, CLOSED_DOCUMENTS, topic_size, k, zipf, CLOSED_REQUESTS, seed)
        for n in closed_replicas:
            held = CLOSED_DOCUMENTS // (2 * n)  # the tiers hold half the pool between them
            row = {"oracle_bound": oracle_bound(traffic, n * held), "clients": 2 * n}
            for policy in POLICIES:
                row[policy] = simulate_closed(
                    policy, traffic, n, held, 2 * n, CLOSED_REQUESTS // 2, epsilon, imbalance, seed
                )
            out["closed"][f"{kind}/{n}"] = row
            progress(
                f"closed {kind:12s} {n:2d} replicas: oracle {row['oracle_bound']:.3f}, "
                + ", ".join(
                    f"{p} {row[p]['hit_ratio']:.3f} (busiest {row[p]['largest_share']:.0%}, "
                    f"latency {row[p]['mean_latency']:.1f})"
                    for p in POLICIES
                )
            )
    out["cost"] = {
        str(n): {
            "belief_bytes": belief_bytes(n, documents, tier, epsilon),
            "us_per_decision": statistics.mean(
                out["runs"][f"{kind}/{n}"]["affinity"]["us_per_decision"] for kind in TRAFFIC
            ),
        }
        for n in replicas
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", default="8,32", help="comma-separated replica counts")
    parser.add_argument("--documents", type=int, default=10_000)
    parser.add_argument("--requests", type=int, default=40_000)
    parser.add_argument("--warmup", type=int, default=10_000)
    parser.add_argument("--tier-share", type=float, default=0.02)
    parser.add_argument("--closed-replicas", default="2,4", help="comma-separated replica counts of the closed loop")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.replicas.split(",")]
    closed = [int(x) for x in args.closed_replicas.split(",") if x.strip()]
    if any(n < 1 for n in counts + closed) or args.documents < 8 or not 0 < args.tier_share <= 1:
        parser.error("replicas >= 1, documents >= 8 and tier-share in (0, 1]")
    if not 0 <= args.warmup < args.requests:
        parser.error("--warmup must be below --requests")
    out = run(
        counts,
        args.documents,
        tier_share=args.tier_share,
        requests=args.requests,
        warmup=args.warmup,
        closed_replicas=closed,
    )
    for n, cost in out["cost"].items():
        print(f"{n} replicas: {cost['us_per_decision']:.0f} us a decision, beliefs {cost['belief_bytes'] / 1e6:.1f} MB")
    write_report(out, args.json, "fleet_sim")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
