"""One HTTP request run through an ASGI app in this process, its response handed out as it is written.

A fleet replica serves ``server.app.create_app``'s app unchanged, so every route, limit and error body is the one
``hypic-rag serve`` gives; the replica only carries the request over Ray. Written here because the ASGI clients
at hand (httpx's ``ASGITransport``, Starlette's test client) buffer a whole response before returning it, and a
streamed answer must leave as it is made. A consumer that stops reading is a client that went away: the app is
told (``http.disconnect``), and cancels the generation at its next token.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

Head = dict[str, Any]  # {"status": int, "headers": [[name, value], ...]}
DRAIN_S = 5.0  # how long a finished or abandoned request's app task may take to wind down before it is cancelled


async def call(
    app: Any, method: str, path: str, query: str, headers: Sequence[tuple[str, str]], body: bytes
) -> AsyncIterator[Head | bytes]:
    """Yield the response's head, then its body in the chunks the app sends."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method.upper(),
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
    }
    sent = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        await sent.put(message)

    async def run() -> None:
        try:
            await app(scope, receive, send)
        finally:
            await sent.put(None)

    task = asyncio.create_task(run())
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                names = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in message.get("headers", [])]
                yield {"status": message["status"], "headers": names}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield bytes(message["body"])
                if not message.get("more_body", False):
                    break
        await task  # an exception the app raised surfaces here
    finally:
        gone.set()
        if not task.done():
            with contextlib.suppress(asyncio.TimeoutError, asyncio.CancelledError, Exception):
                await asyncio.wait_for(asyncio.shield(task), DRAIN_S)
            task.cancel()
