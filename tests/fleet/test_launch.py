"""``hypic-rag serve --replicas`` as a process: SIGTERM stops the fleet as Ctrl-C does, and the process stops every
process of its Ray cluster before it exits (Ray's agents otherwise outlive it for a minute or more, listening)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import httpx
import pytest

from hypic_rag.testing.server import free_port, kill_group

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

# after the driver's exit, for the last of its cluster's processes to be seen gone (they were stopped, not waited for)
REAPED_S = 5.0


def test_sigterm_leaves_no_ray_process_behind(tmp_path):
    import importlib

    import ray  # noqa: F401

    psutil = importlib.import_module("psutil")  # Ray's own copy, importable once ray is

    port = free_port()
    log = (tmp_path / "serve.log").open("w+")
    command = [sys.executable, "-m", "hypic_rag.cli", "serve", "--replicas", "1", "--port", str(port)]
    proc = subprocess.Popen(
        [*command, "--threads-per-replica", "1"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert proc.poll() is None, log.seek(0) or log.read()[-4000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the fleet did not come up"
            time.sleep(0.5)
        cluster = psutil.Process(proc.pid).children(recursive=True)
        assert any("raylet" in p.name() for p in cluster)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        proc.wait(120)
        assert proc.returncode == 0, log.seek(0) or log.read()[-4000:]
        exited = time.monotonic()
        while True:
            left = [p for p in cluster if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
            if not left or time.monotonic() - exited > REAPED_S:
                break
            time.sleep(0.2)
        names = sorted({p.name() for p in left})
        assert not left, f"{len(left)} of Ray's processes outlived the driver: {names}"
        print(f"SIGTERM to every Ray process gone: {time.monotonic() - sent:.1f} s")
    finally:
        kill_group(proc)
        log.close()
