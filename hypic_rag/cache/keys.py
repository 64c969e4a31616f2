"""Cache keys (docs/design.md §7): a hash of the segment's token ids, the model fingerprint, the dtype and the
entry format; a remainder entry's key adds its seam width. Order and position are deliberately not
part of the key."""

from __future__ import annotations

import hashlib
import json
import os
from array import array
from pathlib import Path

import blake3
import torch

from .entry import FORMAT_VERSION


def file_digest(file: Path, memo: Path | None = None) -> str:
    """blake3 of every byte of ``file`` (memory-mapped, all cores), remembered in ``memo`` (a JSON file) by the
    file's real path, size, inode and modification time, so that a checkpoint is hashed once, not at every
    start. The memo lives in our cache folder, not beside the checkpoint, which may be read-only (a hub
    snapshot, a shared volume); a memo that cannot be read or written is only a slower start."""
    info = file.stat()
    real = str(file.resolve())
    stamp = [info.st_size, info.st_ino, info.st_mtime_ns]
    known: dict = {}
    if memo is not None:
        try:
            known = json.loads(memo.read_text())
        except (OSError, ValueError):
            known = {}
        row = known.get(real) if isinstance(known, dict) else None
        if isinstance(row, dict) and row.get("stamp") == stamp and isinstance(row.get("blake3"), str):
            return row["blake3"]
    digest = blake3.blake3(max_threads=blake3.blake3.AUTO).update_mmap(str(file)).hexdigest()
    if memo is not None:
        known = known if isinstance(known, dict) else {}
        known[real] = {"stamp": stamp, "blake3": digest}
        try:
            memo.parent.mkdir(parents=True, exist_ok=True)
            tmp = memo.with_name(f"{memo.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(known))
            os.replace(tmp, memo)
        except OSError:
            pass
    return digest


def checkpoint_fingerprint(path: Path, memo: Path | None = None) -> str:
    """Config, tokenizer and every byte of every weight file of a checkpoint directory: a fine-tune that
    changes one weight never shares entries with its base model. Weight digests are remembered in ``memo``."""
    h = hashlib.sha256()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        file = path / name
        h.update(name.encode() + (file.read_bytes() if file.is_file() else b"-"))
    for file in sorted(path.glob("*.safetensors")):
        h.update(f"{file.name}:{file_digest(file, memo)}".encode())
    return h.hexdigest()[:32]


def module_fingerprint(module: torch.nn.Module) -> str:
    """Every parameter's bytes: for models built in memory, which have no files."""
    h = hashlib.sha256()
    for name, p in module.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


def entry_fingerprint(fingerprint: str, dtype: torch.dtype) -> str:
    """The fingerprint a store of entries kept in ``dtype`` writes and reads: the model's for float32 (today's
    entries), the model's and the dtype's otherwise, so entries of two dtypes never share a key or decode as
    each other."""
    return fingerprint if dtype == torch.float32 else f"{fingerprint}+{str(dtype).removeprefix('torch.')}"


def segment_key(token_ids: list[int] | tuple[int, ...], fingerprint: str, dtype: torch.dtype) -> str:
    h = hashlib.sha256()
    h.update(f"v{FORMAT_VERSION}|{fingerprint}|{dtype}|".encode())
    h.update(array("q", token_ids).tobytes())  # int64, native order: the bytes torch's int64 tensor held
    return h.hexdigest()


def remainder_key(key: str, seam: int) -> str:
    """The key of a segment's remainder entry after ``seam`` tokens, from the segment's own key."""
    return hashlib.sha256(f"{key}|rest|{seam}".encode()).hexdigest()
