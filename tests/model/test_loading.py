"""Checkpoint spellings the loader accepts, and the errors for those it must refuse."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hypic_rag.model import load_model
from hypic_rag.testing.parity import assert_matches_transformers, load_reference, well_conditioned_ids


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _edit_weights(path: Path, edit) -> None:
    file = path / "model.safetensors"
    tensors = load_file(file)
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, file, metadata={"format": "pt"})


def _logits(model, vocab: int) -> torch.Tensor:
    ids = torch.randint(0, vocab, (1, 70), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        return model(ids)


def test_missing_weight_is_named(checkpoint, tmp_path):
    path = _copy(checkpoint("qwen3_5_text"), tmp_path / "ck")
    _edit_weights(path, lambda t: t.pop("model.layers.2.linear_attn.A_log"))
    with pytest.raises(ValueError, match=r"missing weights: model\.layers\.2\.linear_attn\.A_log"):
        load_model(path)


def test_misshaped_weight_is_named(checkpoint, tmp_path):
    path = _copy(checkpoint("qwen3_5_text"), tmp_path / "ck")
    name = "model.layers.1.self_attn.k_proj.weight"
    _edit_weights(path, lambda t: t.__setitem__(name, t[name][:-1]))
    with pytest.raises(ValueError, match=rf"{name} has shape \(31, 64\), expected \(32, 64\)"):
        load_model(path)


def test_misshaped_fused_qwen3_next_projection_is_named(checkpoint, tmp_path):
    path = _copy(checkpoint("qwen3_next"), tmp_path / "ck")
    name = "model.layers.0.linear_attn.in_proj_qkvz.weight"
    _edit_weights(path, lambda t: t.__setitem__(name, t[name][:-2]))
    with pytest.raises(ValueError, match=rf"{name} has shape"):
        load_model(path)


def test_unexpected_weight_is_named(checkpoint, tmp_path):
    path = _copy(checkpoint("qwen3_5_text"), tmp_path / "ck")
    _edit_weights(path, lambda t: t.__setitem__("model.layers.9.mlp.up_proj.weight", torch.zeros(2, 2)))
    with pytest.raises(ValueError, match=r"does not use: model\.layers\.9\.mlp\.up_proj\.weight"):
        load_model(path)


def test_directory_without_weights(checkpoint, tmp_path):
    path = _copy(checkpoint("qwen3_5_text"), tmp_path / "ck")
    (path / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no \\*.safetensors"):
        load_model(path)


def test_multimodal_qwen3_5_checkpoint_loads_its_text_model(checkpoint, tmp_path):
    """``model_type: qwen3_5`` nests the text config and prefixes weights with ``model.language_model.``;
    vision and MTP weights are skipped."""
    src = checkpoint("qwen3_5_text")
    path = _copy(src, tmp_path / "vl")
    text = json.loads((src / "config.json").read_text())
    (path / "config.json").write_text(
        json.dumps({"model_type": "qwen3_5", "tie_word_embeddings": True, "text_config": text})
    )

    def nest(t: dict[str, torch.Tensor]) -> None:
        for name in list(t):
            if name.startswith("model."):
                t["model.language_model." + name[len("model.") :]] = t.pop(name)
        t["model.visual.patch_embed.proj.weight"] = torch.zeros(4, 4)
        t["mtp.fc.weight"] = torch.zeros(4, 4)

    _edit_weights(path, nest)
    vocab = text["vocab_size"]
    assert torch.equal(_logits(load_model(path), vocab), _logits(load_model(src), vocab))


def test_sharded_checkpoint_matches_transformers(checkpoint, tmp_path):
    reference = load_reference(checkpoint("qwen3_next_moe"))
    reference.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    ours = load_model(tmp_path / "sharded")
    ids = well_conditioned_ids(ours, (1, 50), seed=2)
    assert_matches_transformers(ours, tmp_path / "sharded", ids)


def test_tied_embeddings_share_one_tensor(checkpoint):
    model = load_model(checkpoint("qwen3_5_text"))
    assert model.config.tie_word_embeddings
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def test_bfloat16_is_as_close_to_fp32_as_transformers_bfloat16(checkpoint):
    """bf16 rounding on a random model moves logits by O(1); ours must not drift more than
    transformers' own bf16 forward does."""
    from transformers import AutoModelForCausalLM

    path = checkpoint("qwen3_5_text")
    ours = load_model(path, dtype=torch.bfloat16)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    exact = _logits(load_model(path), ours.config.vocab_size)
    ids = torch.randint(0, ours.config.vocab_size, (1, 70), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        low = ours(ids)
        ref = theirs(ids).logits
    assert low.dtype == torch.bfloat16
    assert (low.float() - exact).abs().mean() <= 1.25 * (ref.float() - exact).abs().mean()


@pytest.mark.parametrize(
    "kind,names",
    [
        ("nemotron_h_moe", ("mixer.gate.weight", "mixer.gate.e_score_correction_bias")),
        ("kimi_linear", ("mlp.gate.weight", "mlp.gate.e_score_correction_bias", "forget_gate.dt_bias")),
        ("bailing_moe_linear", ("mlp.gate.weight", "mlp.gate.e_score_correction_bias")),
    ],
)
def test_routers_stay_fp32_in_a_bf16_model(checkpoint, kind, names):
    """As transformers keeps them: a router bias rounded to bf16 picks other experts for a few % of tokens."""
    model = load_model(checkpoint(kind), dtype=torch.bfloat16)
    params = dict(model.named_parameters())
    kept = [n for n in params if n.endswith(names)]
    assert kept and all(params[n].dtype == torch.float32 for n in kept)
    assert model.lm_head.weight.dtype == torch.bfloat16
    with torch.inference_mode():
        assert torch.isfinite(model(torch.tensor([[3, 4, 5, 6]])).float()).all()
