"""The model fingerprint covers every weight byte: a fine-tune that changes one weight never reads its base
model's entries, even from one shared folder."""

from __future__ import annotations

import shutil

from safetensors.torch import load_file, save_file

from hypic_rag import Engine
from hypic_rag.cache.keys import checkpoint_fingerprint, file_digest
from hypic_rag.model.loading import default_model_path

from .conftest import QUESTION, same, segments


def _fine_tune(tmp_path):
    """The bundled model with one conv weight scaled by 1.5: same sizes, same first and last MiB."""
    out = tmp_path / "tuned"
    shutil.copytree(default_model_path(), out)
    (weights,) = out.glob("*.safetensors")
    tensors = load_file(weights)
    name = next(n for n in sorted(tensors) if "conv1d" in n)
    tensors[name] = tensors[name] * 1.5
    save_file(tensors, weights, metadata={"format": "pt"})
    return out, name


def test_a_one_weight_fine_tune_gets_its_own_fingerprint_and_entries(tmp_path):
    tuned, _ = _fine_tune(tmp_path)
    assert checkpoint_fingerprint(tuned) != checkpoint_fingerprint(default_model_path())
    folder = tmp_path / "shared"
    Engine.from_pretrained(cache_dir=folder, min_cached_tokens=1).generate(segments(), QUESTION, max_new_tokens=1)
    reader = Engine.from_pretrained(tuned, cache_dir=folder, min_cached_tokens=1)
    out = reader.generate(segments(), QUESTION, max_new_tokens=1)
    assert out.stats["disk_hits"] == 0 and out.stats["hit_segments"] == 0
    bare = Engine.from_pretrained(tuned, min_cached_tokens=1)
    assert same(out.prompt_logits, bare.prompt_logits(segments(), QUESTION))


def test_digests_are_remembered_by_size_inode_and_mtime(tmp_path, monkeypatch):
    file = tmp_path / "w.safetensors"
    file.write_bytes(b"a" * 1000)
    memo = tmp_path / "memo.json"
    first = file_digest(file, memo)
    import hypic_rag.cache.keys as keys

    class Boom:
        def __init__(self, *a, **k):
            raise AssertionError("hashed again")

    monkeypatch.setattr(keys.blake3, "blake3", Boom)
    assert file_digest(file, memo) == first  # from the memo
    monkeypatch.undo()
    file.write_bytes(b"b" * 1000)  # same size, new content and mtime: hashed again
    assert file_digest(file, memo) != first
    memo.write_text("{not json")
    assert file_digest(file, memo) == file_digest(file)  # a broken memo is only a slower start
