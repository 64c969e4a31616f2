"""What both front doors, the single server and the fleet's ingress, do alike before a request reaches an engine:
the API key, checked before a byte of the body is read (so a caller without it costs nothing and holds nothing);
the body, refused at once when its declared length is over the limit, read within a deadline and the limit
otherwise; and its JSON parsed within ``limits``' depth and number rules. One copy, so that the two answer the
same 401, 408, 413 and 400s."""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Mapping, Sequence
from typing import Any

from .limits import BadBody, loads
from .protocol import APIError

KEY_NEEDED = "a valid API key is needed: Authorization: Bearer <key>"


# ``/tokenize`` and ``/detokenize``: outside /v1, where vLLM has them, and work that a key pays for
KEYED_ROOT_ROUTES = ("/tokenize", "/detokenize")


def needs_key(path: str, method: str | None) -> bool:
    """The routes a key guards: ``/v1``'s and the token routes, but for CORS preflights; ``/health``,
    ``/metrics`` and ``/version`` stay open, as vLLM leaves them."""
    return (path.startswith("/v1") or path in KEYED_ROOT_ROUTES) and method != "OPTIONS"


def bearer_matches(authorization: bytes, key: bytes) -> bool:
    """``Authorization: Bearer <key>``, compared in constant time."""
    token = authorization[7:].strip() if authorization[:7].lower() == b"bearer " else b""
    return hmac.compare_digest(token, key)


def key_refused() -> APIError:
    return APIError(401, KEY_NEEDED, code="invalid_api_key")


def declared_length(headers: Mapping[str, str]) -> int | None:
    value = headers.get("content-length")
    return int(value) if value is not None and value.isdigit() else None


def too_large(max_bytes: int) -> APIError:
    return APIError(413, f"the request body is over {max_bytes} bytes", code="request_too_large")


async def read_body(request: Any, max_bytes: int, timeout_s: float) -> bytes:
    """The whole body of a Starlette ``request``: a 413 when its declared length, or what arrives, passes
    ``max_bytes``; a 408 when it has not all arrived ``timeout_s`` after the headers."""
    declared = declared_length(request.headers)
    if declared is not None and declared > max_bytes:
        raise too_large(max_bytes)
    body = bytearray()
    try:
        async with asyncio.timeout(timeout_s):
            async for piece in request.stream():
                body += piece
                if len(body) > max_bytes:
                    raise too_large(max_bytes)
    except TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout") from None
    return bytes(body)


def parse(body: bytes) -> Any:
    """The body's JSON, or the 400 that says why it is not acceptable (not JSON, nested too deep, a number
    that is not finite)."""
    try:
        return loads(body)
    except BadBody as exc:
        raise APIError(400, str(exc), param=exc.param) from None


def cors_headers(origin: str | None, allowed: Sequence[str]) -> dict[str, str]:
    """The CORS headers a simple request's answer carries, as Starlette's ``CORSMiddleware`` writes them for the
    server: for an error the front door answers itself, so that a page of an allowed origin can read it."""
    if origin is None or not allowed:
        return {}
    if "*" in allowed:
        return {"Access-Control-Allow-Origin": "*"}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"} if origin in allowed else {}
