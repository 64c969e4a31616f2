"""Growing a checkpoint: the grown model computes what the old one did, and training reaches its new parts."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from hypic_rag import Engine
from hypic_rag.model.loading import default_model_path
from hypic_rag.testing.parity import assert_matches_transformers
from hypic_rag.training.grow import grow
from hypic_rag.training.train import model_config

L, F = "linear_attention", "full_attention"


def _config(old, hidden: int, layers: list[str], conv_kernel: int = 4) -> Qwen3_5TextConfig:
    return Qwen3_5TextConfig(
        **model_config(old.config.vocab_size, hidden, layers, old.config.head_dim, conv_kernel),
        eos_token_id=old.config.eos_token_id,
        pad_token_id=old.config.pad_token_id,
    )


@pytest.fixture(scope="module")
def old():
    """A model of the first bundled checkpoint's shape (hidden 128; linear, full, linear, full) with every
    weight random, its norms' too, so growth is checked whatever the bundled model has grown to."""
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(**model_config(2048, 128, [L, F, L, F]), eos_token_id=1, pad_token_id=0)
    model = Qwen3_5ForCausalLM(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0, 0.3)
        model.model.embed_tokens.weight.mul_(12)  # logits as large as a trained model's (tied head)
    return model.eval()


def _match_norm_eps(model, old_hidden: int) -> None:
    """Zero dimensions dilute a hidden-size norm's mean square by old/new; its epsilon, by the same factor,
    is the only thing the weights cannot carry, so the exact check scales it too."""
    new_hidden = model.config.hidden_size
    for module in model.modules():
        if type(module).__name__ == "Qwen3_5RMSNorm" and module.weight.shape == (new_hidden,):
            module.eps = module.eps * old_hidden / new_hidden


@pytest.mark.parametrize(("hidden", "conv_kernel"), [(128, 4), (192, 4), (128, 8), (192, 6)])
def test_a_grown_model_computes_what_the_old_one_did(old, hidden, conv_kernel):
    layers = [L, L, L, F, L, L, L, F]
    grown = grow(old, _config(old, hidden, layers, conv_kernel), seed=0).eval()
    assert grown.config.hidden_size == hidden and list(grown.config.layer_types) == layers
    assert grown.config.linear_conv_kernel_dim == conv_kernel
    ids = torch.randint(0, old.config.vocab_size, (2, 200), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = old(ids).logits
        assert (grown(ids).logits - want).abs().max() < 2e-2  # only the norms' epsilon differs
        _match_norm_eps(grown, old.config.hidden_size)
        assert (grown(ids).logits - want).abs().max() < 2e-4


def test_every_new_part_learns(old):
    """Zero output projections get gradients at once; what they read, from the next step on (no part is
    stuck at a symmetric zero)."""
    grown = grow(old, _config(old, 192, [L, L, L, F, L, L, L, F], conv_kernel=8), seed=0)
    ids = torch.randint(0, old.config.vocab_size, (1, 64), generator=torch.Generator().manual_seed(2))
    opt = torch.optim.SGD(grown.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        grown(ids, labels=ids).loss.backward()
        opt.step()
    dead = [n for n, p in grown.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not dead, dead
    taps = grown.model.layers[0].linear_attn.conv1d.weight[:, :, :4]
    assert taps.abs().sum() > 0  # the conv's new, older taps left zero


@pytest.mark.parametrize("conv_kernel", [4, 8])
def test_growth_is_seeded_and_serves_in_both_runtimes(old, tmp_path, conv_kernel):
    cfg = _config(old, 192, [L, F, L, L, L, F], conv_kernel)
    a, b = grow(old, cfg, seed=3), grow(old, cfg, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    a.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "generation_config.json", "chat_template.jinja"):
        (tmp_path / name).write_bytes((default_model_path() / name).read_bytes())
    engine = Engine.from_pretrained(tmp_path)
    ids = torch.randint(0, engine.config.vocab_size, (1, 40), generator=torch.Generator().manual_seed(0))
    assert_matches_transformers(engine.model, tmp_path, ids)


@pytest.mark.parametrize(
    ("hidden", "layers", "message"),
    [
        (96, [L, F, L, F], "narrower"),
        (192, [F, L, L, F], "subsequence"),
        (160, [L, F, L, F], "in ratio"),  # 5 heads over 2 kv heads
    ],
)
def test_growth_that_cannot_keep_the_function_is_refused(old, hidden, layers, message):
    with pytest.raises(ValueError, match=message):
        grow(old, _config(old, hidden, layers), seed=0)


def test_a_conv_is_never_shortened(old):
    with pytest.raises(ValueError, match="shorten the conv from 4 to 3"):
        grow(old, _config(old, 128, [L, F, L, F], conv_kernel=3), seed=0)
