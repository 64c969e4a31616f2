"""The fleet's /metrics: each replica's samples labelled with it, and their sums without the label."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hypic_rag.fleet.metrics import render, texts_of


def replica_text(requests: float, active: float, latencies: list[float]) -> str:
    registry = CollectorRegistry()
    Counter("hypic_requests", "Requests answered.", ["mode"], registry=registry).labels("hypic").inc(requests)
    Gauge("hypic_active", "Requests decoding.", registry=registry).set(active)
    Gauge("process_start_time_seconds", "Start time.", registry=registry).set(1000 + requests)
    histogram = Histogram("hypic_ttft_seconds", "TTFT.", buckets=(0.1, 1.0), registry=registry)
    for value in latencies:
        histogram.observe(value)
    return generate_latest(registry).decode()


def samples(text: bytes) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_replica_samples_are_labelled_and_summed():
    own = CollectorRegistry()
    Counter("hypic_fleet_routed", "Routed requests.", ["reason"], registry=own).labels("affinity").inc(5)
    texts = {"a": replica_text(3, 1, [0.05, 2.0]), "b": replica_text(4, 2, [0.5])}
    got = samples(render(texts, own))
    assert got[("hypic_fleet_routed_total", (("reason", "affinity"),))] == 5
    assert got[("hypic_requests_total", (("mode", "hypic"), ("replica", "a")))] == 3
    assert got[("hypic_requests_total", (("mode", "hypic"), ("replica", "b")))] == 4
    assert got[("hypic_requests_total", (("mode", "hypic"),))] == 7
    assert got[("hypic_active", ())] == 3
    assert got[("hypic_ttft_seconds_bucket", (("le", "0.1"),))] == 1
    assert got[("hypic_ttft_seconds_bucket", (("le", "1.0"),))] == 2
    assert got[("hypic_ttft_seconds_count", ())] == 3
    assert ("process_start_time_seconds", ()) not in got  # a start time does not add up
    assert got[("process_start_time_seconds", (("replica", "b"),))] == 1004
    unlabelled = {name for name, labels in got if "replica" not in dict(labels)}
    assert not any(
        name.endswith("_created") and name.startswith(("hypic_requests", "hypic_ttft")) for name in unlabelled
    )


def test_only_reports_with_metrics_count():
    assert texts_of({"a": {"metrics": "x 1\n"}, "b": {"keys": []}, "c": {"metrics": None}}) == {"a": "x 1\n"}
    assert render({}) == b""


def cache_text(hits: int, misses: int) -> str:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class Cache:
        def collect(self):
            ratio = GaugeMetricFamily("hypic_cache_hit_ratio", "Hit ratio.", labels=["kind"])
            ratio.add_metric(["document"], hits / (hits + misses))
            lookups = CounterMetricFamily("hypic_segment_lookups", "Lookups.", labels=["kind", "outcome"])
            lookups.add_metric(["document", "hit"], hits)
            lookups.add_metric(["document", "miss"], misses)
            yield ratio
            yield lookups

    registry = CollectorRegistry()
    registry.register(Cache())
    return generate_latest(registry).decode()


def test_the_fleets_hit_ratio_is_its_summed_hits_over_its_summed_lookups():
    got = samples(render({"a": cache_text(9, 1), "b": cache_text(1, 9)}))
    assert got[("hypic_cache_hit_ratio", (("kind", "document"), ("replica", "a")))] == 0.9
    assert got[("hypic_cache_hit_ratio", (("kind", "document"), ("replica", "b")))] == 0.1
    assert got[("hypic_segment_lookups_total", (("kind", "document"), ("outcome", "hit")))] == 10
    assert got[("hypic_cache_hit_ratio", (("kind", "document"),))] == 0.5  # 10 of 20, not 0.9 + 0.1
