"""Cold segments prefilled on a pool of Ray actors, each holding the model: a request's misses split across them
(``Engine.from_pretrained(prefill_workers=N)``). Not to be confused with ``server.worker``, the thread that runs
the engine for the HTTP server.

The in-process ``parallel`` policy prefills a request's misses as one batch on one process; with
``prefill_workers=N`` they are split over N actors instead, longest first, each to the worker with the fewest
tokens so far (the greedy longest-processing-time rule), and each worker runs ``entries.prefill_isolated`` on
its share. Entries come back as their checksummed bytes (``SegmentEntry.to_bytes``), the same bytes a cache
tier holds, so the caller checks them as it checks any tier's and stores them in its own tiers (a shared Redis
tier included). Ray is the worker pool because users who outgrow one machine expect an existing distributed
runtime; it starts a local cluster on 127.0.0.1 unless the process is already connected to one.

That cluster is asked to stay on loopback (``_node_ip_address="127.0.0.1"``, no dashboard), but Ray does not
obey: measured with Ray 2.60, it replaces a loopback node address by the machine's own (``ray.init`` resolves
``127.0.0.1`` to a "remotely reachable" one), and the GCS, the raylet and every worker listen on all
interfaces (``::``), the autoscaler's monitor on ``0.0.0.0``, the runtime-env agent on the machine's address.
No ``ray.init`` argument changes that, so after starting it the pool lists what listens beyond loopback
(``exposed``) and warns, naming each port.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .cache.entry import CachedSegment, RemainderEntry, SegmentEntry

log = logging.getLogger("hypic_rag.ray_prefill")


def exposed_listeners() -> list[tuple[str, str, int]] | None:
    """``(process, address, port)`` of every TCP socket this process or one it started listens on beyond
    loopback; None when that cannot be seen (no psutil: Ray ships one, importable once ``ray`` is)."""
    try:
        import psutil
    except ImportError:
        return None
    me = psutil.Process()
    ours = {p.pid: p for p in me.children(recursive=True)} | {me.pid: me}
    out = set()
    for conn in psutil.net_connections(kind="tcp"):
        if conn.status != psutil.CONN_LISTEN or conn.pid not in ours:
            continue
        if not ipaddress.ip_address(conn.laddr.ip.split("%")[0]).is_loopback:
            try:
                name = ours[conn.pid].name()
            except psutil.Error:
                name = str(conn.pid)
            out.add((name, conn.laddr.ip, conn.laddr.port))
    return sorted(out)


class PrefillWorker:
    """One actor: the model loaded once, prefilling shares of requests' misses."""

    def __init__(self, checkpoint: str, dtype: str, fingerprint: str, threads: int = 1) -> None:
        from .model import load_model
        from .model.loading import resolve_dtype

        torch.set_num_threads(threads)
        torch.set_flush_denormal(True)
        self.model = load_model(checkpoint, device="cpu", dtype=resolve_dtype(dtype))
        self.fingerprint = fingerprint

    def prefill(self, segments: list[list[int]], remainders: list[int]) -> list[tuple[bytes, bytes | None]]:
        from .entries import prefill_isolated

        fresh = prefill_isolated(self.model, segments, remainders)
        return [(f.entry.to_bytes(self.fingerprint), _bytes(f.remainder, self.fingerprint)) for f in fresh]


def _bytes(remainder: RemainderEntry | None, fingerprint: str) -> bytes | None:
    # a remainder derived from its entry is not sent: the engine derives it again from the entry it stores
    return remainder.to_bytes(fingerprint) if remainder is not None and not remainder.derived else None


def split_longest_first(lengths: Sequence[int], workers: int) -> list[list[int]]:
    """Indices of ``lengths`` per worker: longest first, each to the least loaded worker (by tokens)."""
    shares: list[list[int]] = [[] for _ in range(workers)]
    load = [0] * workers
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        w = min(range(workers), key=lambda w: load[w])
        shares[w].append(i)
        load[w] += lengths[i]
    return [s for s in shares if s]


class RayPrefill:
    """``workers`` Ray actors holding the checkpoint at ``checkpoint``."""

    def __init__(self, checkpoint: str | Path, workers: int, dtype: torch.dtype, fingerprint: str) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ValueError("prefill_workers needs Ray: pip install 'hypic-rag[ray]'") from exc
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"prefill_workers must be an integer >= 1, got {workers!r}")
        started = not ray.is_initialized()
        if started:
            ray.init(
                address="local",
                num_cpus=max(workers, os.cpu_count() or 1),
                include_dashboard=False,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
            )
        deadline = time.monotonic() + 10  # CPUs of actors just killed come back after a moment
        while (free := ray.available_resources().get("CPU", 0)) < workers and time.monotonic() < deadline:
            time.sleep(0.1)
        if free < workers:  # an actor that cannot be placed would wait forever
            raise ValueError(f"prefill_workers={workers} needs {workers} free Ray CPUs; the cluster has {free:g}")
        self.ray = ray
        self.fingerprint = fingerprint
        actor = ray.remote(num_cpus=1)(PrefillWorker)
        self.actors = [
            actor.remote(str(checkpoint), str(dtype).removeprefix("torch."), fingerprint) for _ in range(workers)
        ]
        ray.get([a.__ray_ready__.remote() for a in self.actors])  # loaded before the first request
        # What the cluster we started exposes, whatever we asked of it (a cluster we joined is its owner's).
        self.exposed = exposed_listeners() if started else []
        if self.exposed is None:
            log.warning("prefill_workers: cannot list Ray's ports; Ray's servers may listen on all interfaces")
        elif self.exposed:
            where = [(name, f"[{ip}]" if ":" in ip else ip, port) for name, ip, port in self.exposed]
            ports = ", ".join(f"{name} on {ip}:{port}" for name, ip, port in where)
            log.warning(
                "prefill_workers: Ray listens beyond loopback although it was asked for 127.0.0.1 (node address %s): "
                "%s. Anyone who can reach this machine can reach these ports; firewall them or use a trusted network",
                ", ".join(node["NodeManagerAddress"] for node in ray.nodes()),
                ports,
            )

    def prefill(self, segments: Sequence[Sequence[int]], remainders: Sequence[int]) -> list[CachedSegment]:
        """What ``prefill_isolated`` gives, computed across the actors."""
        shares = split_longest_first([len(s) for s in segments], len(self.actors))
        calls = [
            actor.prefill.remote([list(segments[i]) for i in share], [remainders[i] for i in share])
            for actor, share in zip(self.actors, shares, strict=False)
        ]
        out: list[CachedSegment | None] = [None] * len(segments)
        for share, results in zip(shares, self.ray.get(calls), strict=True):
            for i, (entry, remainder) in zip(share, results, strict=True):
                made = SegmentEntry.from_bytes(entry, self.fingerprint)
                rest = made.derived_remainder(remainders[i])
                if remainder is not None:
                    rest = RemainderEntry.from_bytes(remainder, self.fingerprint)
                out[i] = CachedSegment(made, rest)
        return [f for f in out if f is not None]

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors = []

    def __getstate__(self) -> Any:  # pragma: no cover - an engine is not sent anywhere
        raise TypeError("a RayPrefill pool stays in the process that made it")
