"""Entries in the persistent tiers sealed with a keyed MAC (HMAC-SHA256) under a secret the deployment sets.

An entry's checksum says its bytes were not damaged; anyone who can write the Redis or the disk folder can also
recompute it, and so put one document's state under another's key. The seal says a holder of the secret wrote the
bytes: one who can write the tier but does not hold the secret can only make entries that are refused (and counted
as ``corrupt``). The standard library's ``hmac`` does the work; this module only fixes the layout and the rules.
"""

from __future__ import annotations

import hashlib
import hmac

from .entry import CorruptEntry

MAGIC = b"HYPICSEAL1"
MAC_BYTES = 32
MIN_SECRET_BYTES = 16


def secret_bytes(secret: str | bytes) -> bytes:
    """The secret as bytes, or a ``ValueError`` for one too short to be a key."""
    raw = secret.encode() if isinstance(secret, str) else secret
    if not isinstance(raw, bytes) or len(raw) < MIN_SECRET_BYTES:
        raise ValueError(
            f"cache_secret must be at least {MIN_SECRET_BYTES} bytes (a random string: openssl rand -hex 32)"
        )
    return raw


def secret_id(secret: bytes) -> str:
    """A name for the secret that reveals nothing of it: part of the cache fingerprint, so replicas sealing under
    different secrets (or none) never look up each other's keys."""
    return hashlib.sha256(b"hypic-cache-secret\0" + secret).hexdigest()[:16]


def seal(data: bytes, secret: bytes) -> bytes:
    return MAGIC + hmac.digest(secret, data, "sha256") + data


def unseal(data: bytes, secret: bytes) -> bytes:
    """The entry bytes a seal covers, or ``CorruptEntry`` when the seal is missing or was not made with ``secret``."""
    head = len(MAGIC) + MAC_BYTES
    if len(data) < head or not data.startswith(MAGIC):
        raise CorruptEntry("the entry is not sealed: written without the cache secret")
    if not hmac.compare_digest(data[len(MAGIC) : head], hmac.digest(secret, data[head:], "sha256")):
        raise CorruptEntry("the entry's seal is not the cache secret's")
    return data[head:]
