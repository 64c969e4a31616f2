"""The runtime against transformers' own classes on tiny random checkpoints (fp32)."""

from __future__ import annotations

import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.model import load_model
from hypic_rag.testing.parity import (
    assert_matches_transformers,
    load_reference,
    reference_greedy,
    rounding_bound,
    split_prefill_max_diff,
    well_conditioned_ids,
)
from hypic_rag.testing.synthetic import KINDS, build_checkpoint


def _ids(shape: tuple[int, int], vocab: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", KINDS)
def test_full_forward_matches_transformers(checkpoint, kind):
    """Within a few times transformers' own fp32 rounding against float64 on this CPU (the bound's why is in
    ``hypic_rag.testing.parity``), on an input with no routing near-tie."""
    path = checkpoint(kind)
    ours = load_model(path)
    assert_matches_transformers(ours, path, well_conditioned_ids(ours, (2, 512)))


@pytest.mark.parametrize("kind", ["qwen3_next", "qwen3_5_text", "nemotron_h_moe", "granitemoehybrid", "bamba"])
def test_split_prefill_equals_one_shot(checkpoint, kind):
    """Equal up to the fp32 rounding the split re-orders (chunks fall elsewhere), measured on this CPU."""
    model = load_model(checkpoint(kind))
    ids = well_conditioned_ids(model, (2, 500))
    assert split_prefill_max_diff(model, ids, 300) <= rounding_bound(model, ids)


@pytest.mark.parametrize("kind", ["qwen3_next", "nemotron_h"])
def test_token_by_token_decode_equals_prefill(checkpoint, kind):
    """The recurrent step, the carried conv tail and the KV cache, one token at a time."""
    model = load_model(checkpoint(kind))
    ids = _ids((1, 40), model.config.vocab_size)
    with torch.inference_mode():
        whole = model(ids)
        state = model.new_state()
        steps = torch.cat([model(ids[:, i : i + 1], state=state) for i in range(ids.shape[1])], dim=1)
    assert state.seq_len == 40
    assert (steps - whole).abs().max() <= rounding_bound(model, ids)


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_decoding_matches_transformers_generate(checkpoint, kind):
    path = checkpoint(kind)
    engine = Engine.from_pretrained(path)
    engine.eos_token_ids = ()
    prompt = _ids((1, 64), engine.config.vocab_size, seed=3)[0].tolist()
    out = engine.generate([], Segment(token_ids=prompt, kind="query"), mode="full", max_new_tokens=20)
    assert len(out.token_ids) == 20
    assert out.token_ids == reference_greedy(load_reference(path), prompt, 20)


def test_explicit_positions_are_checked(checkpoint):
    model = load_model(checkpoint("qwen3_5_text"))
    ids = torch.tensor([[3, 4]])
    with pytest.raises(ValueError, match="positions must be"):
        model(ids, positions=torch.tensor([0, model.config.max_position_embeddings]))
    with pytest.raises(ValueError, match="positions must be"):
        model(ids, positions=torch.tensor([0]))


@pytest.mark.parametrize("kind", ["qwen3_5_text", "nemotron_h", "granitemoehybrid", "lfm2"])
def test_left_padded_rows_equal_their_own_forward(checkpoint, kind):
    """Padding is an exact identity for the linear state (zero input, no decay, no projection bias reaching
    the conv): a padded row ends where its real tokens alone end, which the isolated prefill of a batch of
    segments relies on. Granite's and LFM2's tiny checkpoints have projection biases."""
    model = load_model(checkpoint(kind))
    ids = _ids((2, 30), model.config.vocab_size)
    pad = torch.ones(2, 30, dtype=torch.bool)
    pad[1, :12] = False
    with torch.inference_mode():
        state = model.new_state()
        batched = model(ids, state=state, pad_mask=pad)
        alone_state = model.new_state()
        alone = model(ids[1:, 12:], state=alone_state)
    assert (batched[1, 12:] - alone[0]).abs().max() <= rounding_bound(model, ids[1:, 12:])
    for i in state.linear_layer_ids:
        for part in ("recurrent", "conv"):  # LFM2's recurrent state is empty: its conv tail is all it carries
            got, want = getattr(state.linear(i), part)[1], getattr(alone_state.linear(i), part)[0]
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "overrides",
    [{"mamba_rms_norm": False}, {"mamba_norm_before_gate": False}, {"attention_bias": True, "mlp_bias": True}],
)
def test_falcon_h1_variants_match_transformers(tmp_path, overrides):
    """Falcon-H1's Mamba read-out without a norm, or gated before it, and its biased projections, with every
    μP multiplier folded into the weights."""
    path = build_checkpoint("falcon_h1", tmp_path, overrides)
    ours = load_model(path)
    assert_matches_transformers(ours, path, _ids((2, 200), ours.config.vocab_size))


@pytest.mark.parametrize(
    "kind,overrides",
    [
        ("nemotron_h_moe", {"moe_latent_size": 24}),  # Nemotron 3's latent expert projections
        ("kimi_linear", {"q_lora_rank": 24}),  # MLA with a compressed query
        ("bailing_hybrid", {"q_lora_rank": 24}),
        ("granitemoehybrid", {"position_embedding_type": "nope"}),  # Granite-4.0-H's own setting
    ],
)
def test_family_variants_match_transformers(tmp_path, kind, overrides):
    path = build_checkpoint(kind, tmp_path, overrides)
    ours = load_model(path)
    assert_matches_transformers(ours, path, well_conditioned_ids(ours, (2, 200)))
