"""What a local Ray cluster the engine starts listens on. It is asked to stay on loopback (node address
127.0.0.1, no dashboard); Ray does not keep to it, so whatever of its listens beyond loopback is measured here
with ``ss`` and must be exactly what the pool reports and warns about: the docs' and the warning's claim is
checked, not assumed."""

from __future__ import annotations

import ipaddress
import re
import shutil
import subprocess

import pytest

from hypic_rag import Engine

pytest.importorskip("ray")
pytestmark = pytest.mark.ray


def _listening() -> set[tuple[int, str, int]]:
    """``(pid, address, port)`` of every listening TCP socket, from ``ss``."""
    out = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout
    rows = set()
    for line in out.splitlines():
        fields = line.split()
        address, _, port = fields[3].rpartition(":")
        for pid in re.findall(r"pid=(\d+)", line):
            rows.add((int(pid), address.strip("[]").split("%")[0], int(port)))
    return rows


def _beyond_loopback(address: str) -> bool:
    return address == "*" or not ipaddress.ip_address(address).is_loopback


@pytest.fixture(scope="module")
def pool(caplog_module):
    import ray

    if ray.is_initialized():
        ray.shutdown()
    engine = Engine.from_pretrained(prefill_workers=1, min_cached_tokens=1)
    yield engine.prefill_pool
    engine.prefill_pool.close()
    ray.shutdown()


@pytest.fixture(scope="module")
def caplog_module():
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("hypic_rag.ray_prefill")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


@pytest.mark.skipif(shutil.which("ss") is None, reason="needs ss (iproute2)")
def test_what_ray_exposes_is_reported_and_warned_about(pool, caplog_module):
    import psutil  # Ray's own copy, importable once ray is
    import ray

    assert len(ray.nodes()) == 1  # a cluster of its own, started by the engine
    ours = {p.pid for p in psutil.Process().children(recursive=True)} | {psutil.Process().pid}
    measured = {(addr, port) for pid, addr, port in _listening() if pid in ours and _beyond_loopback(addr)}
    reported = {(addr.split("%")[0], port) for _, addr, port in pool.exposed}
    assert reported == {("::" if a == "*" else a, p) for a, p in measured}
    assert all(port != 8265 for _, port in measured)  # no dashboard
    warned = [r.getMessage() for r in caplog_module if "beyond loopback" in r.getMessage()]
    if measured:
        assert len(warned) == 1 and all(f":{port}" in warned[0] for _, port in measured)
        assert ray.nodes()[0]["NodeManagerAddress"] in warned[0]
    else:
        assert not warned
