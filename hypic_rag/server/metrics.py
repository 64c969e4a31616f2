"""The server's Prometheus metrics, on a registry of its own (so two servers in one process do not collide)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..engine import Engine

# Seconds: from a millisecond-scale warm hit to a long cold prompt on CPU.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
E2E_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
# A request's deviation estimate (``RequestStats.fidelity_estimate``) and a shadow's KL to full, in nats.
ESTIMATE_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.1, 0.2, 0.5, 1)
KL_BUCKETS = (1e-5, 1e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1, 3)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class _CacheBytes(Collector):
    """Bytes and entries held by each cache tier, and what the memory tier's policy did, read when scraped."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def collect(self) -> Any:
        held = GaugeMetricFamily("hypic_cache_bytes", "Bytes held by each cache tier", labels=["tier"])
        entries = GaugeMetricFamily("hypic_cache_entries", "Entries held by each cache tier", labels=["tier"])
        segments = self.engine.segment_store.stats()
        prefix = self.engine.prefix_store.stats()
        held.add_metric(["memory"], segments["memory_bytes"])
        entries.add_metric(["memory"], segments["memory_entries"])
        held.add_metric(["prefix"], prefix["prefix_bytes"])
        entries.add_metric(["prefix"], prefix["prefix_nodes"])
        for tier in ("disk", "remote"):  # a tier that is down reports {"available": False}
            if "bytes" in segments.get(tier, {}):
                held.add_metric([tier], segments[tier]["bytes"])
                entries.add_metric([tier], segments[tier]["entries"])
        yield held
        yield entries
        up = GaugeMetricFamily(
            "hypic_cache_tier_up", "1 while a persistent cache tier is in use, 0 while it is bypassed", labels=["tier"]
        )
        for tier, reason in self.engine.segment_store.tier_status().items():
            up.add_metric([tier], 0 if reason else 1)
        yield up
        refused = CounterMetricFamily(
            "hypic_cache_admissions_refused", "Entries the memory tier did not admit, by reason", labels=["reason"]
        )
        for reason, n in ({"frequency": 0, "oversize": 0} | segments["refused"]).items():
            refused.add_metric([reason], n)
        disk_refused = CounterMetricFamily(
            "hypic_cache_disk_admissions_refused",
            "Writes a full disk tier refused: segments looked up fewer than twice (the value policy)",
        )
        disk_refused.add_metric([], segments["disk_refused"])
        evicted = CounterMetricFamily("hypic_cache_evictions", "Entries evicted, by reason", labels=["reason"])
        for reason, n in ({"capacity": 0, "corrupt": 0} | segments["evicted"]).items():
            evicted.add_metric([reason], n)
        ratio = GaugeMetricFamily(
            "hypic_cache_hit_ratio", "Share of segment lookups answered by a cache tier, by kind", labels=["kind"]
        )
        for kind, value in segments["hit_ratio_by_kind"].items():
            ratio.add_metric([kind], value)
        lookups = CounterMetricFamily(
            "hypic_segment_lookups",
            "Segment entry lookups, by kind and outcome (hit: some tier had it)",
            labels=["kind", "outcome"],
        )
        for (kind, outcome), n in sorted(self.engine.segment_store.lookups.items()):
            lookups.add_metric([kind, outcome], n)
        yield lookups
        yield refused
        yield disk_refused
        yield evicted
        yield ratio


class ServerMetrics:
    def __init__(self, engine: Engine, queue_depth: Any, active: Any) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        ProcessCollector(registry=r)  # process_cpu_seconds_total and memory: what serving costs the host
        self.requests = Counter("hypic_requests", "HTTP requests by route and status", ["route", "status"], registry=r)
        self.ttft = Histogram(
            "hypic_ttft_seconds",
            "Arrival to first token, queueing included",
            ["mode"],
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "hypic_request_seconds", "Arrival to the last token", ["mode"], buckets=E2E_BUCKETS, registry=r
        )
        self.queue_time = Histogram(
            "hypic_queue_seconds", "Arrival to admission into the running batch", buckets=QUEUE_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            "hypic_tpot_seconds",
            "Time per output token after the first",
            ["mode"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "hypic_batch_size", "Requests decoded in one engine step", buckets=BATCH_BUCKETS, registry=r
        )
        self.step_tokens = Histogram(
            "hypic_step_tokens",
            "Tokens one engine step ran: a decode token per request and the prompts admitted",
            buckets=STEP_TOKEN_BUCKETS,
            registry=r,
        )
        self.hits = Counter("hypic_segment_hits", "Segments served from the cache", ["mode"], registry=r)
        self.misses = Counter("hypic_segment_misses", "Segments not found in the cache", ["mode"], registry=r)
        self.recomputed = Counter(
            "hypic_recomputed_tokens", "Prompt tokens run through the model", ["mode"], registry=r
        )
        self.prompt_tokens = Counter("hypic_prompt_tokens", "Prompt tokens", ["mode"], registry=r)
        self.cached_tokens = Counter("hypic_cached_tokens", "Prompt tokens served from the cache", ["mode"], registry=r)
        self.tier_hits = Counter("hypic_tier_hits", "Entries found in each cache tier", ["tier"], registry=r)
        self.faults = Counter(
            "hypic_cache_faults", "Cache faults: corrupt entries dropped, tier failures bypassed", ["kind"], registry=r
        )
        self.finished = Counter("hypic_finished_requests", "Answers by how they ended", ["reason"], registry=r)
        self.generated = Counter("hypic_generated_tokens", "Tokens generated", ["mode"], registry=r)
        self.estimate = Histogram(
            "hypic_fidelity_estimate",
            "Deviation estimate of requests that probed their boundaries (seam auto or a fidelity budget)",
            ["mode"],
            buckets=ESTIMATE_BUCKETS,
            registry=r,
        )
        self.actions = Counter(
            "hypic_fidelity_actions", "What the fidelity guard did: none, widened, exact", ["action"], registry=r
        )
        self.shadow_kl = Histogram(
            "hypic_shadow_kl",
            "KL(full || served) of the next-token distribution, on requests shadowed in full",
            ["mode"],
            buckets=KL_BUCKETS,
            registry=r,
        )
        depth = Gauge("hypic_queue_depth", "Requests waiting for the engine", registry=r)
        depth.set_function(queue_depth)
        running = Gauge("hypic_active_requests", "Requests admitted and decoding", registry=r)
        running.set_function(active)
        r.register(_CacheBytes(engine))

    def step(self, running: int, tokens: int) -> None:
        """One engine step: the requests it decoded and the tokens it ran."""
        self.batch_size.observe(running)
        self.step_tokens.observe(tokens)

    def record(
        self, mode: str, stats: dict[str, Any], ttft_s: float, e2e_s: float, reason: str, queue_s: float = 0.0
    ) -> None:
        self.finished.labels(reason).inc()
        self.queue_time.observe(queue_s)
        generated = stats.get("generated_tokens", 0)
        if generated > 1:
            self.tpot.labels(mode).observe((e2e_s - ttft_s) / (generated - 1))
        for tier in ("memory", "disk", "remote"):
            self.tier_hits.labels(tier).inc(stats.get(f"{tier}_hits", 0))
        self.faults.labels("corrupt").inc(stats.get("corrupt", 0))
        self.faults.labels("tier_error").inc(stats.get("tier_errors", 0))
        self.ttft.labels(mode).observe(ttft_s)
        self.e2e.labels(mode).observe(e2e_s)
        self.hits.labels(mode).inc(stats.get("hit_segments", 0))
        self.misses.labels(mode).inc(stats.get("miss_segments", 0))
        self.recomputed.labels(mode).inc(stats.get("recomputed_tokens", 0))
        self.prompt_tokens.labels(mode).inc(stats.get("prompt_tokens", 0))
        self.cached_tokens.labels(mode).inc(stats.get("cached_tokens", 0))
        self.generated.labels(mode).inc(stats.get("generated_tokens", 0))
        if stats.get("fidelity_estimate") is not None:
            self.estimate.labels(mode).observe(stats["fidelity_estimate"])
            self.actions.labels(stats.get("fidelity_action", "none")).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
