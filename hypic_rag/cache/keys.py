"""Cache keys (HYPIC.md §7): a hash of the segment's token ids, the model fingerprint, the dtype and the
entry format; a remainder entry's key adds its seam width. Order and position are deliberately not
part of the key."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from .entry import FORMAT_VERSION

_SAMPLE = 1 << 20  # bytes hashed from each end of every weight file


def checkpoint_fingerprint(path: Path) -> str:
    """Config, tokenizer and weights of a checkpoint directory. Weight files are hashed by size,
    safetensors header and their first and last MiB: a changed model changes these, and hashing
    gigabytes at every start would not pay."""
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        file = path / name
        h.update(name.encode() + (file.read_bytes() if file.is_file() else b"-"))
    for file in sorted(path.glob("*.safetensors")):
        size = file.stat().st_size
        h.update(f"{file.name}:{size}".encode())
        with file.open("rb") as f:
            h.update(f.read(_SAMPLE))
            f.seek(max(0, size - _SAMPLE))
            h.update(f.read(_SAMPLE))
    return h.hexdigest()[:32]


def module_fingerprint(module: torch.nn.Module) -> str:
    """Every parameter's bytes: for models built in memory, which have no files."""
    h = hashlib.sha256()
    for name, p in module.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def segment_key(token_ids: list[int] | tuple[int, ...], fingerprint: str, dtype: torch.dtype) -> str:
    h = hashlib.sha256()
    h.update(f"v{FORMAT_VERSION}|{fingerprint}|{dtype}|".encode())
    h.update(torch.tensor(list(token_ids), dtype=torch.int64).numpy().tobytes())
    return h.hexdigest()


def remainder_key(key: str, seam: int) -> str:
    """The key of a segment's remainder entry after ``seam`` tokens, from the segment's own key."""
    return hashlib.sha256(f"{key}|rest|{seam}".encode()).hexdigest()
