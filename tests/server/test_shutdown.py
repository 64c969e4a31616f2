"""SIGTERM ends ``hypic-rag serve`` within a bounded time even while answers are decoding: open answers get a
grace period, then are cut, and the process exits (a real server process, on loopback)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

import httpx

from hypic_rag.server import GRACE_S
from hypic_rag.testing.server import free_port

LONG = {"type": "regex", "regex": "([a-z]{10} ){1500}"}  # no stop before about 4,000 tokens: many seconds


def test_sigterm_with_answers_decoding_cuts_them_after_the_grace_and_exits():
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "hypic_rag.cli", "serve", "--port", str(port), "--max-active", "2"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)
        started = threading.Event()
        received: list[str] = []

        def stream() -> None:
            body = {
                "model": "hypic-default",
                "messages": [{"role": "user", "content": "Write."}],
                "max_tokens": 4000,
                "stream": True,
                "response_format": LONG,
            }
            try:
                with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
                    for line in response.iter_lines():
                        received.append(line)
                        started.set()
            except httpx.HTTPError:
                pass

        clients = [threading.Thread(target=stream, daemon=True) for _ in range(4)]
        for client in clients:
            client.start()
        assert started.wait(60), "no answer began"
        time.sleep(1.0)
        sent = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=90)  # a bound for a loaded machine; what it shows is below
        took = time.monotonic() - sent
        for client in clients:
            client.join(30)
        # The open answers were given their grace, so they were still decoding, and then cut: none ran to its end,
        # which would take thousands of tokens more.
        assert took >= GRACE_S - 1, f"the server exited {took:.1f} s after SIGTERM"
        assert "data: [DONE]" not in received and not any(client.is_alive() for client in clients)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
