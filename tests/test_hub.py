"""Hub ids resolve through a Hugging Face cache built here, offline: this machine has no network."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from hypic_rag import Engine
from hypic_rag.hub import hub_cache_dir, hub_offline, is_hub_id, resolve_checkpoint
from hypic_rag.testing.synthetic import place_in_hub_cache

COMMIT = "a" * 40
OLD_COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub(checkpoint, tmp_path, monkeypatch) -> Path:
    """``HF_HOME`` with ``org/name`` cached at ``main`` (COMMIT) and tag ``v1`` (OLD_COMMIT), offline."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    place_in_hub_cache(checkpoint("qwen3_5_text"), tmp_path / "hf", "org/name", COMMIT, ("main",))
    old = tmp_path / "old"
    shutil.copytree(checkpoint("qwen3_5_text"), old)
    (old / "generation_config.json").write_text('{"eos_token_id": 1, "temperature": 0.25}')
    place_in_hub_cache(old, tmp_path / "hf", "org/name", OLD_COMMIT, ("v1",))
    return tmp_path / "hf" / "hub" / "models--org--name"


def test_hub_id_loads_the_same_model_as_its_directory(hub, checkpoint):
    local = Engine.from_pretrained(checkpoint("qwen3_5_text"))
    remote = Engine.from_pretrained("org/name")
    assert remote.name == "org/name" and local.name == checkpoint("qwen3_5_text").name
    ids = torch.tensor([[3, 17, 42, 99, 5, 250]])
    torch.testing.assert_close(remote.model(ids), local.model(ids), rtol=0, atol=0)
    assert remote.fingerprint == local.fingerprint  # same files, so cached segments are shared
    assert remote.eos_token_ids == local.eos_token_ids


def test_revisions(hub):
    assert resolve_checkpoint("org/name") == hub / "snapshots" / COMMIT
    assert resolve_checkpoint("org/name", revision="main") == hub / "snapshots" / COMMIT
    assert resolve_checkpoint("org/name", revision=COMMIT) == hub / "snapshots" / COMMIT
    assert resolve_checkpoint("org/name", revision="v1") == hub / "snapshots" / OLD_COMMIT
    old = Engine.from_pretrained("org/name", revision=OLD_COMMIT, dtype="bfloat16")
    assert old.generation_defaults.temperature == 0.25 and old.model.dtype == torch.bfloat16
    assert Engine.from_pretrained("org/name", revision="main").generation_defaults.temperature is None


def test_missing_hub_id_says_what_to_do(hub):
    with pytest.raises(ValueError, match=r"'org/other' is not in the local Hugging Face cache .*HF_HUB_OFFLINE is set"):
        Engine.from_pretrained("org/other")
    with pytest.raises(ValueError, match=r"hf download org/other"):
        resolve_checkpoint("org/other")
    with pytest.raises(ValueError, match=r"at revision 'v2' is not in the local Hugging Face cache"):
        resolve_checkpoint("org/name", revision="v2")
    with pytest.raises(ValueError, match="not in the local Hugging Face cache"):
        resolve_checkpoint("org/name", revision="f" * 40)


def test_env_is_read_at_call_time(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache_dir() == tmp_path / "elsewhere"
    with pytest.raises(ValueError, match="elsewhere"):
        resolve_checkpoint("org/name")
    monkeypatch.setenv("HF_HUB_CACHE", str(hub.parent))
    assert resolve_checkpoint("org/name") == hub / "snapshots" / COMMIT
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.delenv("HF_HOME")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub_cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    for value, offline in (("1", True), ("TRUE", True), ("yes", True), ("On", True), ("0", False), ("", False)):
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
        assert hub_offline() is offline


def test_local_paths_and_bad_ids(checkpoint, tmp_path, monkeypatch, hub):
    local = checkpoint("qwen3_5_text")
    assert resolve_checkpoint(local) == local and resolve_checkpoint(str(local)) == local
    with pytest.raises(ValueError, match="revision applies to hub ids only"):
        Engine.from_pretrained(local, revision="main")
    with pytest.raises(ValueError, match="revision applies to hub ids only"):
        resolve_checkpoint(None, revision="main")
    for bad in (str(tmp_path / "nope"), "no/such/dir", "just-a-name", "org/na--me", "org/"):
        with pytest.raises(ValueError, match=r"does not exist and .* is not a hub id"):
            Engine.from_pretrained(bad)
    with pytest.raises(ValueError, match="does not exist"):
        resolve_checkpoint(tmp_path / "org" / "name")  # a Path is always a local path
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        resolve_checkpoint(str(tmp_path / "file"))
    with pytest.raises(ValueError, match="is not a branch, tag or commit"):
        resolve_checkpoint("org/name", revision="../../etc")
    # A local directory shaped like a hub id wins over the hub, as in transformers.
    shutil.copytree(local, tmp_path / "org" / "name")
    monkeypatch.chdir(tmp_path)
    assert resolve_checkpoint("org/name") == Path("org/name")
    assert Engine.from_pretrained("org/name").name == "name"


def test_hub_id_shape():
    for good in ("Qwen/Qwen3.5-0.8B", "org/name", "a_b/c.d-e"):
        assert is_hub_id(good)
    for bad in ("name", "a/b/c", "/abs/path", "./x", "org/-x", "org/x.", "a--b/c", "o/" + "x" * 96, "org/a b"):
        assert not is_hub_id(bad)
