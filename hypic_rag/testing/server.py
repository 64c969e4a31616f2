"""A server for tests and benchmarks on a free loopback port: ``create_app``'s app under uvicorn in a thread, or
``hypic-rag serve`` itself in a process."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on at this moment (for a server this process does not bind itself)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", timeout_s: float = 30.0) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL (``http://127.0.0.1:PORT``)."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.02)
    try:
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()


@contextmanager
def serve_in_process(
    args: Sequence[str] = (), env: Mapping[str, str] | None = None, timeout_s: float = 300.0
) -> Iterator[str]:
    """``hypic-rag serve ARGS`` in a process of its own on a free loopback port until the block ends (stopped by
    its pid); yields its base URL once ``/health`` answers."""
    import httpx

    port = free_port()
    command = [sys.executable, "-m", "hypic_rag.cli", "serve", "--port", str(port), "--log-level", "warning", *args]
    # its output goes to a file, read if it dies: a pipe nobody drains would stall a server that logs enough
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                log.seek(0)
                raise RuntimeError(f"the server exited: {log.read()}")
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the server did not come up in {timeout_s:g} s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def kill_group(proc: subprocess.Popen) -> None:
    """Kill what is left of the process group ``proc`` leads (started with ``start_new_session=True``: a server
    and whatever it started), then reap ``proc``."""
    import os
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
