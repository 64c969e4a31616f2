"""What ``serve`` checks before the model loads and reports as it starts, for the single server and the fleet alike:
the port (a busy one is refused before minutes of loading, not after a "serving on" line) and the shared cache
tier (one it cannot reach is named at once, not only in a replica's log)."""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port``, or a ``ValueError`` naming the port when it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise ValueError(f"cannot listen on {host}:{port}: {reason} (is another server there? choose --port)") from None
    return sock


def check_port(host: str, port: int) -> None:
    """``bind``'s refusal, for a server that binds the port itself later (Ray Serve's proxy)."""
    bind(host, port).close()


def tier_warning(url: str, reason: str) -> str:
    return (
        f"hypic-rag: warning: the shared cache tier {url} cannot be reached ({reason}); serving without it, "
        "and trying it again every 30 s (/health says degraded meanwhile)"
    )


def report_tier(url: str | None, check: Callable[[], str | None], sealed: bool = True, out=None) -> None:
    """Check the shared tier at ``url`` once (``check``: its failure, or None); a warning line when it fails, and
    one when its entries are not ``sealed`` (whoever can write it can then change answers)."""
    if url is None:
        return
    if not sealed:
        print(
            f"hypic-rag: warning: the shared cache tier {url} is not sealed: whoever can write to it can change "
            "answers; set --cache-secret (or $HYPIC_CACHE_SECRET) on every replica (docs/cache.md)",
            file=out or sys.stderr,
            flush=True,
        )
    reason = check()
    if reason is not None:
        print(tier_warning(url, reason), file=out or sys.stderr, flush=True)


def check_remote_url(url: str) -> str | None:
    """Whether a Redis tier at ``url`` answers a ping now: its failure, or None (for a process that holds no
    engine, the fleet's launcher)."""
    from ..cache.remote import client

    redis = client(url)
    try:
        redis.ping()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        redis.close()
    return None
