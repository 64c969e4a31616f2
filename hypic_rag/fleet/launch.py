"""``hypic-rag serve --replicas N``: a local Ray cluster, Ray Serve's HTTP proxy on ``host:port``, the fleet
application on it, until interrupted. On a Ray cluster of your own, ``serve.run(build_app(...))`` instead."""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

APP_NAME = "hypic"
STOP_GRACE_S = 5.0  # after ray.shutdown, how long what is left of the cluster has to exit before it is killed


def start_ray(cpus: int) -> bool:
    """Connect to the Ray cluster this process already has, else start a local one asked to keep to
    loopback; whether it was started here."""
    import ray

    if ray.is_initialized():
        return False
    handler = signal.getsignal(signal.SIGTERM)
    ray.init(
        address="local",
        num_cpus=cpus,
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
    )
    # Ray's core puts a SIGTERM handler of its own in place (it aborts the process, leaving the cluster up); the
    # one this process had goes back, so SIGTERM stops the fleet as Ctrl-C does.
    if handler is not None and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
    return True


def warn_exposed() -> None:
    """Ray listens beyond loopback whatever it is asked (``ray_prefill.py`` says how): name the ports."""
    from ..ray_prefill import exposed_listeners

    where = exposed_listeners()
    if where:
        ports = ", ".join(f"{name} on {ip}:{port}" for name, ip, port in where)
        log.warning(
            "the fleet's Ray cluster listens beyond loopback: %s. Anyone who can reach this machine can reach "
            "these ports; firewall them or use a trusted network",
            ports,
        )


@contextmanager
def serve_proxy(host: str = "127.0.0.1", port: int = 8000, cpus: int | None = None) -> Iterator[str]:
    """Ray Serve's HTTP proxy on ``host:port`` while the block runs, for applications ``deployed`` on it; yields
    its base URL. Ray is started here (``cpus`` logical CPUs; default: the cores) and stopped after, unless this
    process is already connected to a cluster."""
    import ray
    from ray import serve

    started = start_ray(cpus or os.cpu_count() or 1)
    try:
        serve.start(http_options={"host": host, "port": port})
        yield f"http://{host}:{port}"
    finally:
        ours = ray_processes() if started else []
        serve.shutdown()
        if started:
            ray.shutdown()
            stop_processes(ours)


def ray_processes() -> list[Any]:
    """The processes of the Ray cluster this process started (its descendants run from Ray's package or titled
    ``ray::``: raylet, the GCS, agents, workers); none without psutil (Ray ships it)."""
    try:
        import psutil
    except ImportError:
        return []
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if any(part.startswith("ray::") or "ray" in Path(part).parts for part in child.cmdline()):
                found.append(child)
        except psutil.Error:
            continue
    return found


def stop_processes(processes: list[Any], grace_s: float = STOP_GRACE_S) -> None:
    """Ray's agents outlive ``ray.shutdown`` for minutes, listening: what is left of ``processes`` is terminated,
    then killed after ``grace_s``."""
    import psutil

    alive = [p for p in processes if p.is_running()]
    for process in alive:
        try:
            process.terminate()
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(alive, timeout=grace_s)
    for process in left:
        try:
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=grace_s)


@contextmanager
def deployed(app: Any, name: str = APP_NAME, route_prefix: str = "/") -> Iterator[None]:
    """``app`` (``deployment.build_app``) running under ``route_prefix`` of the proxy while the block runs."""
    from ray import serve

    serve.run(app, name=name, route_prefix=route_prefix)
    try:
        yield
    finally:
        serve.delete(name)


def most_replicas(replicas: int, autoscaling: Mapping[str, Any] | None) -> int:
    """The most replicas the fleet may run: ``replicas``, or autoscaling's ceiling."""
    return int(autoscaling["max_replicas"]) if autoscaling else replicas


@contextmanager
def running_fleet(
    model: str | None,
    *,
    replicas: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    autoscaling: Mapping[str, Any] | None = None,
    threads: int | None = None,
    **options: Any,
) -> Iterator[str]:
    """The fleet (``deployment.build_app``) served on ``host:port`` while the block runs; yields its base URL."""
    from .deployment import build_app

    most, cores = most_replicas(replicas, autoscaling), os.cpu_count() or 1
    threads = threads or max(1, cores // most)  # the cores shared among the most replicas there may be
    app = build_app(model, replicas=replicas, autoscaling=autoscaling, threads=threads, **options)
    with serve_proxy(host, port, max(cores, most)) as url, deployed(app):
        yield url


def serve_fleet(
    model: str | None,
    *,
    replicas: int,
    host: str = "127.0.0.1",
    port: int = 8000,
    autoscaling: Mapping[str, Any] | None = None,
    **options: Any,
) -> None:
    """Run the fleet until Ctrl-C, then stop what was started here. A busy port is refused (``ValueError``) before
    Ray starts; a shared tier that cannot be reached is named once (each replica bypasses it until it answers)."""
    from ..cache.remote import redacted
    from ..server.startup import check_port, check_remote_url, report_tier

    check_port(host, port)
    cache_url = options.get("cache_url")
    shown = redacted(cache_url) if cache_url else None
    report_tier(shown, lambda: check_remote_url(cache_url), bool(options.get("cache_secret")))
    most = most_replicas(replicas, autoscaling)
    least = int(autoscaling.get("min_replicas", 1)) if autoscaling else most
    print(f"hypic-rag: starting {most if least == most else f'{least}..{most}'} replicas ...", flush=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)  # SIGTERM stops the fleet as Ctrl-C does
    try:
        with running_fleet(model, replicas=replicas, host=host, port=port, autoscaling=autoscaling, **options) as url:
            warn_exposed()
            print(f"hypic-rag: fleet serving on {url}/v1 (Ctrl-C or SIGTERM stops it)", flush=True)
            while True:
                time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt
