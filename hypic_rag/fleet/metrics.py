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
                    if family.type in SUMMED and family.name not in UNSUMMED and not sample.name.endswith("_created"):
                        at = (sample.name, tuple(sorted(sample.labels.items())))
                        total[at] = total.get(at, 0.0) + sample.value
        for name, merged in families.items():
            for (sample, labels), value in sums[name].items():
                merged.add_sample(sample, dict(labels), value)
            yield merged


def render(texts: Mapping[str, str], own: CollectorRegistry | None = None) -> bytes:
    """``texts``: each replica's exposition by replica id; ``own``: the ingress's registry, written first."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Replicas(texts))
    head = generate_latest(own) if own is not None else b""
    return head + generate_latest(registry)


def texts_of(reports: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    return {rid: report["metrics"] for rid, report in reports.items() if isinstance(report.get("metrics"), str)}
