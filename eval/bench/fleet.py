"""A Ray Serve fleet (``hypic_rag.fleet``) under four routers, on the same streams, beside an oracle's bound.

    python -m hypic_rag.eval.bench.fleet --json bench-fleet.json
    python -m hypic_rag.eval.bench.fleet --traffic clustered --routers affinity,power_of_two   # a part of it

1. **Model and corpus.** A random-weight checkpoint (Qwen3.5-0.8B layer shapes, ``layers`` layers, as
   ``bench.server`` builds it) and ``documents`` documents of ``doc_tokens`` tokens.
2. **Streams** (``fleet_sim.make_traffic``, drawn once and sent alike to every router): *independent* (``k``
   documents by Zipf(``zipf``) over all, random order), *clustered* (a topic of ``topic_size`` by Zipf, then
   ``k`` of its documents in random order), *fixed order* (clustered, one order). ``warmup`` requests, then
   ``requests`` measured, ``clients`` at a time, one-token answers.
3. **Routers.** Each run is a fresh fleet of ``replicas`` replicas (one torch thread each), each memory tier
   ``memory_share`` of the corpus's entry bytes, all on one Redis flushed between runs (the shared tier every
   router falls back on): ``affinity`` (ours, ``fleet/routing.py``), ``prefix`` (Ray's
   ``PrefixCacheAffinityRouter``, its defaults), ``power_of_two`` (Ray Serve's default) and ``round_robin``;
   when named, ``affinity_tight`` (ours, every replica held to the tight bound: ``burst = epsilon``).
4. **Per router:** the memory-tier hit ratio (the replicas' ``memory_segments`` over the documents asked for),
   mean and P90 time to the one-token answer as a client sees it, the busiest replica's share of requests, and
   (ours) why each request went where it did; beside them the oracle's bound (``fleet_sim.oracle_bound``: the
   replicas' tiers holding the most requested documents between them).
5. **Throughput.** The clustered stream with ``decode_tokens``-token answers through a fleet of one replica and
   of ``replicas`` (ours): generated tokens per second of wall time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from hypic_rag.fleet.routing import EPSILON

from .common import write_report
from .fleet_sim import TRAFFIC, make_traffic, oracle_bound
from .server import MODEL, Corpus, build_checkpoint
from .slo import Traffic, percentile

ROUTERS = ("affinity", "prefix", "power_of_two", "round_robin")
# Not run unless named: ours with every replica held to the tight bound (``routing.AffinityPolicy``'s burst).
VARIANTS = {"affinity_tight": {"policy": "affinity", "burst": EPSILON}}


def entry_bytes(checkpoint: Path, corpus: Corpus) -> int:
    """What one document's cache entries take in a memory tier (one chat with it, in process)."""
    from hypic_rag.engine import Engine

    engine = Engine.from_pretrained(str(checkpoint))
    engine.chat(corpus.messages([0]), mode="hypic", max_tokens=1)
    engine.chat(corpus.messages([0]), mode="hypic", max_tokens=1)  # the value policy admits it on its return
    return engine.segment_store.stats()["memory_bytes"]


@contextmanager
def fleet(proxy: str, name: str, checkpoint: Path, replicas: int, log: Callable, **options: Any) -> Iterator[str]:
    """A fleet under ``/name`` of the proxy while the block runs (its own name: Ray's prefix router keeps its
    tree in an actor per application)."""
    from hypic_rag.fleet.deployment import build_app
    from hypic_rag.fleet.launch import deployed

    app = build_app(
        str(checkpoint), replicas=replicas, threads=1, name=MODEL, max_queue=4096, queue_timeout_s=3600, **options
    )
    start = time.perf_counter()
    with deployed(app, name=name, route_prefix=f"/{name}"):
        log(f"  {name}: {replicas} replica(s) up in {time.perf_counter() - start:.1f} s")
        yield f"{proxy}/{name}"


def _post(client: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> tuple[float, dict[str, Any]]:
    body = {"model": MODEL, "messages": messages, "max_tokens": max_tokens, "hypic": {"mode": "hypic"}}
    start = time.perf_counter()
    response = client.post(url + "/v1/chat/completions", json=body, timeout=600)
    if response.status_code != 200:
        raise RuntimeError(f"{response.status_code}: {response.text}")
    answer = response.json()
    answer["replica"] = response.headers.get("x-hypic-replica", "")
    return time.perf_counter() - start, answer


def send(url: str, bodies: Sequence[list[dict]], clients: int, max_tokens: int) -> tuple[list[tuple], float]:
    """Every body, ``clients`` at a time, in stream order; each answer's (seconds, JSON) and the wall time."""
    with httpx.Client(limits=httpx.Limits(max_connections=clients)) as client, ThreadPoolExecutor(clients) as pool:
        start = time.perf_counter()
        out = list(pool.map(lambda b: _post(client, url, b, max_tokens), bodies))
        return out, time.perf_counter() - start


def routing_run(url: str, bodies: list, warmup: int, clients: int, k: int) -> dict[str, Any]:
    send(url, bodies[:warmup], clients, 1)
    answers, wall = send(url, bodies[warmup:], clients, 1)
    hits = sum(a["hypic"]["memory_segments"] for _, a in answers)  # of the request's cached pieces: its documents
    asked = k * len(answers)  # ``segments`` counts the template's pieces and the query too
    served: dict[str, int] = {}
    for _, a in answers:
        served[a["replica"]] = served.get(a["replica"], 0) + 1
    seconds = [t for t, _ in answers]
    return {
        "memory_hit_ratio": hits / max(1, asked),
        "memory_hits": hits,
        "remote_hits": sum(a["hypic"].get("remote_hits", 0) for _, a in answers),
        "documents": asked,
        "mean_ttft_s": statistics.mean(seconds),
        "p90_ttft_s": percentile(seconds, 90),
        "largest_share": max(served.values()) / len(answers),
        "answered_by": served,
        "wall_s": wall,
    }


def decisions(url: str) -> dict[str, float]:
    """Why the ingress's router sent each request where it did (its ``hypic_fleet_routed`` series, summed over
    replicas; empty under Ray's own routers, which do not say)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=60).text):
        if family.name == "hypic_fleet_routed":
            for sample in family.samples:
                out[sample.labels["reason"]] = out.get(sample.labels["reason"], 0) + sample.value
    return out


def throughput_run(url: str, bodies: list, clients: int, decode_tokens: int) -> dict[str, Any]:
    send(url, bodies[: clients * 2], clients, decode_tokens)  # warm the code paths
    answers, wall = send(url, bodies, clients, decode_tokens)
    tokens = sum(a["usage"]["completion_tokens"] for _, a in answers)
    return {"tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall}


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> dict[str, Any]:
    import redis as redis_py

    from hypic_rag.fleet.launch import serve_proxy
    from hypic_rag.testing.redis import RedisServer
    from hypic_rag.testing.server import free_port

    shape = Traffic(args.documents, args.k, args.zipf, args.doc_tokens, args.query_tokens)
    n = args.warmup + args.requests
    kinds = sorted(set(args.traffic) | {"clustered"}, key=TRAFFIC.index)  # the throughput run's stream too
    streams = {
        kind: make_traffic(kind, args.documents, args.topic_size, args.k, args.zipf, n, args.seed) for kind in kinds
    }
    report: dict[str, Any] = {"benchmark": "fleet", "args": {k: str(v) for k, v in vars(args).items()}}
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = build_checkpoint(Path(tmp) / "model", args.layers, seed=args.seed)
        corpus = Corpus.of(checkpoint, shape, args.seed)
        per_doc = entry_bytes(checkpoint, corpus)
        memory = int(args.memory_share * args.documents * per_doc)
        tier_documents = int(args.memory_share * args.documents)
        report.update(entry_bytes_per_document=per_doc, memory_bytes=memory, tier_documents=tier_documents)
        log(f"one document's entries: {per_doc} B; each replica's memory tier: {memory} B ({args.memory_share:.0%})")
        with (
            RedisServer(Path(tmp) / "redis", maxmemory="2gb") as redis,
            serve_proxy(port=free_port(), cpus=max(4, args.replicas + 2)) as proxy,
        ):
            flush = redis_py.Redis.from_url(redis.url).flushall
            common = {"memory_bytes": memory, "cache_url": redis.url}
            report["routing"] = {}
            for kind in args.traffic:
                traffic = streams[kind]
                bodies = [corpus.messages(docs) for docs in traffic.requests]
                row: dict[str, Any] = {"oracle_bound": oracle_bound(traffic, args.replicas * tier_documents)}
                for router in args.routers:
                    flush()
                    name = f"{kind.replace('_', '-')}-{router.replace('_', '-')}"
                    how = VARIANTS.get(router, {"policy": router})
                    with fleet(proxy, name, checkpoint, args.replicas, log, **how, **common) as url:
                        row[router] = routing_run(url, bodies, args.warmup, args.clients, args.k)
                        row[router]["decisions"] = decisions(url)
                    log(
                        f"  {kind} {router}: memory hit ratio {row[router]['memory_hit_ratio']:.3f} "
                        f"(oracle {row['oracle_bound']:.3f}), mean TTFT {row[router]['mean_ttft_s'] * 1e3:.0f} ms, "
                        f"busiest replica {row[router]['largest_share']:.0%}"
                    )
                if "affinity" not in row:
                    report["routing"][kind] = row
                    continue
                ours = row["affinity"]
                row["affinity_over_oracle"] = ours["memory_hit_ratio"] / row["oracle_bound"]
                for other in [r for r in args.routers if r != "affinity"]:
                    row[f"affinity_over_{other}"] = {
                        "memory_hit_ratio": ours["memory_hit_ratio"] / max(1e-9, row[other]["memory_hit_ratio"]),
                        "mean_ttft": row[other]["mean_ttft_s"] / ours["mean_ttft_s"],
                    }
                report["routing"][kind] = row
            if args.throughput_requests:
                sample = [corpus.messages(d) for d in streams["clustered"].requests[: args.throughput_requests]]
                runs = {}
                for replicas in (1, args.replicas):
                    flush()
                    with fleet(proxy, f"throughput-{replicas}", checkpoint, replicas, log, **common) as url:
                        runs[replicas] = throughput_run(url, sample, args.clients, args.decode_tokens)
                    log(f"  {replicas} replica(s): {runs[replicas]['tokens_per_s']:.1f} tokens/s")
                report["throughput"] = {
                    "runs": {str(k): v for k, v in runs.items()},
                    "ratio": runs[args.replicas]["tokens_per_s"] / runs[1]["tokens_per_s"],
                }
                log(f"tokens/s, {args.replicas} replicas over 1: {report['throughput']['ratio']:.2f}x")
    return report


def _choices(allowed: Sequence[str]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
        unknown = [n for n in names if n not in allowed]
        if unknown or not names:
            raise argparse.ArgumentTypeError(f"expected some of {', '.join(allowed)}, got {text!r}")
        return names

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--documents", type=int, default=200)
    p.add_argument("--topic-size", type=int, default=8)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--zipf", type=float, default=0.9)
    p.add_argument("--doc-tokens", type=int, default=128)
    p.add_argument("--query-tokens", type=int, default=16)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--memory-share", type=float, default=0.25)
    p.add_argument("--decode-tokens", type=int, default=16)
    p.add_argument("--throughput-requests", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--routers",
        type=_choices((*ROUTERS, *VARIANTS)),
        default=ROUTERS,
        help="comma-separated, of " + ",".join((*ROUTERS, *VARIANTS)),
    )
    p.add_argument(
        "--traffic", type=_choices(TRAFFIC), default=TRAFFIC, help="comma-separated, of " + ",".join(TRAFFIC)
    )
    p.add_argument("--json", type=Path, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.replicas < 1 or args.clients < 1 or args.layers < 1 or not 0 < args.memory_share <= 1:
        p.error("--replicas, --clients and --layers must be >= 1, --memory-share in (0, 1]")
    if args.documents < args.topic_size or args.k > args.topic_size or args.warmup < 0 or args.requests < 1:
        p.error("--documents >= --topic-size >= --k, --warmup >= 0 and --requests >= 1")
    report = run(args)
    if args.json:
        write_report(report, args.json, "fleet")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
