"""The fleet's ``/metrics``: each replica's own metrics with a ``replica`` label, their sum without it, and the
ingress's routing counters, in one Prometheus exposition (parsed and written by prometheus_client).

A replica's metrics reach the ingress inside its routing stats (``EngineReplica.record_routing_stats``), so they
are at most one stats period old and a scrape costs the replicas nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

SUMMED = ("counter", "gauge", "histogram", "summary")  # the types whose samples add up across replicas
UNSUMMED = ("process_start_time_seconds",)  # a gauge whose sum means nothing
# A ratio is not summed: the fleet's is recomputed from the counters it is a ratio of, summed (name ->
# (the counter's sample, the label it shares with the ratio, the outcome label's value that counts as a hit)).
RATIOS = {"hypic_cache_hit_ratio": ("hypic_segment_lookups_total", "kind", "hit")}


class _Replicas:
    """A collector over the replicas' last exposition texts."""

    def __init__(self, texts: Mapping[str, str]) -> None:
        self.texts = texts

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        sums: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
        for replica, text in sorted(self.texts.items()):
            for family in text_string_to_metric_families(text):
                merged = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                total = sums.setdefault(family.name, {})
                for sample in family.samples:
                    merged.add_sample(sample.name, {**sample.labels, "replica": replica}, sample.value)
                    summed = family.type in SUMMED and family.name not in UNSUMMED
                    if summed and not sample.name.endswith("_created"):
                        at = (sample.name, tuple(sorted(sample.labels.items())))
                        total[at] = total.get(at, 0.0) + sample.value
        for name, merged in families.items():
            if name in RATIOS:
                for label, value in _ratios(sums, *RATIOS[name]).items():
                    merged.add_sample(name, {RATIOS[name][1]: label}, value)
                yield merged
                continue
            for (sample, labels), value in sums[name].items():
                merged.add_sample(sample, dict(labels), value)
            yield merged


def _ratios(sums: Mapping[str, Mapping[tuple, float]], sample: str, label: str, hit: str) -> dict[str, float]:
    """Per value of ``label``, the summed hits over the summed lookups of the counter ``sample``."""
    hits: dict[str, float] = {}
    total: dict[str, float] = {}
    for family in sums.values():
        for (name, labels), value in family.items():
            if name != sample:
                continue
            named = dict(labels)
            if label in named:
                total[named[label]] = total.get(named[label], 0.0) + value
                if named.get("outcome") == hit:
                    hits[named[label]] = hits.get(named[label], 0.0) + value
    return {k: hits.get(k, 0.0) / n for k, n in total.items() if n}


def render(texts: Mapping[str, str], own: CollectorRegistry | None = None) -> bytes:
    """``texts``: each replica's exposition by replica id; ``own``: the ingress's registry, written first."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Replicas(texts))
    head = generate_latest(own) if own is not None else b""
    return head + generate_latest(registry)


def texts_of(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {rid: report["metrics"] for rid, report in reports.items() if isinstance(report.get("metrics"), str)}
