"""The routing policy (``routing.py``) as a Ray Serve request router, in the ingress's process.

Ray Serve gives a router the request's arguments (the ingress passes its segment keys as ``keys``), the running
replicas with the stats each last recorded (``EngineReplica.record_routing_stats``: its memory tier's keys, its
metrics), and calls back when a request was sent and when it finished; the in-flight counts the load bound needs
come from those calls. The router ranks replicas one per rank, so Serve takes the first whose queue has room.
Each router registers itself by deployment, so the ingress can read the replicas' stats for ``/metrics``.
"""

from __future__ import annotations

import importlib
import threading
from collections import Counter
from typing import Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from .routing import BURST, EPSILON, Policy, make_policy

_ROUTERS: dict[str, SegmentAffinityRouter] = {}
_LOCK = threading.Lock()


def routers() -> list[SegmentAffinityRouter]:
    """The routers of this process (one per handle's deployment)."""
    with _LOCK:
        return list(_ROUTERS.values())


class SegmentAffinityRouter(RequestRouter):
    """Routes by ``routing.make_policy(policy)``; ``request_router_kwargs``: ``policy``, ``epsilon``, ``burst``,
    ``seed``."""

    def initialize_state(
        self, policy: str = "affinity", epsilon: float = EPSILON, seed: int = 0, burst: float = BURST, **_: Any
    ) -> None:
        self.policy: Policy = make_policy(policy, epsilon, seed, burst)
        self.inflight: Counter[str] = Counter()
        self.placed: dict[str, str] = {}  # internal request id -> replica, for the completion callback
        self.seen: dict[str, int] = {}  # replica -> the sequence number of the report last read
        self.reports: dict[str, dict[str, Any]] = {}  # replica -> its last routing stats
        self.why: dict[str, str] = {}  # internal request id -> why its replica ranked first
        self.reasons: Counter[tuple[str, str]] = Counter()  # (replica, reason) -> requests routed
        # Ray Serve may hand this class over by value (cloudpickle), with globals of its own: register in the
        # module the ingress imports.
        home = importlib.import_module(__name__)
        with home._LOCK:
            home._ROUTERS[str(self._deployment_id)] = self

    def _read_reports(self, replicas: list[RunningReplica]) -> None:
        for replica in replicas:
            stats = replica.routing_stats or {}
            rid = replica.replica_id.unique_id
            if "seq" in stats and stats["seq"] != self.seen.get(rid):
                self.seen[rid] = stats["seq"]
                self.reports[rid] = stats
                self.policy.report(rid, stats.get("keys", ()))

    def refresh(self) -> None:
        """Read the replicas' latest reports now (routing reads them at each request)."""
        self._read_reports(list(self.curr_replicas.values()))

    async def choose_replicas(
        self, candidate_replicas: list[RunningReplica], pending_request: PendingRequest | None = None
    ) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        self._read_reports(candidate_replicas)
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        keys = (pending_request.kwargs.get("keys") if pending_request is not None else None) or ()
        token = pending_request.metadata.request_id if pending_request is not None else ""
        choice = self.policy.choose(list(by_id), keys, self.inflight, token)
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True  # every replica was ranked: wait before again
            self.why[pending_request.metadata.internal_request_id] = choice.reason
        return [[by_id[r]] for r in choice.ranked]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        rid = replica_id.unique_id
        self.inflight[rid] += 1
        self.placed[pending_request.metadata.internal_request_id] = rid
        self.policy.routed(rid, pending_request.kwargs.get("keys") or ())
        self.reasons[rid, self.why.pop(pending_request.metadata.internal_request_id, "unknown")] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        rid = self.placed.pop(internal_request_id, None)
        if rid is not None and self.inflight[rid] > 0:
            self.inflight[rid] -= 1

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        rid = replica_id.unique_id
        self.policy.forget(rid)
        self.reports.pop(rid, None)
        self.inflight.pop(rid, None)
        super().on_replica_actor_died(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        live = {r.replica_id.unique_id for r in replicas}
        for rid in [r for r in self.reports if r not in live]:
            self.policy.forget(rid)
            self.reports.pop(rid, None)
