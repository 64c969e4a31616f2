"""The Mamba2 mixer's cached state: one number per head for its operator, checked, stored and reused."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from hypic_rag import Engine, Segment
from hypic_rag.cache.entry import CorruptEntry, LinearEntry
from hypic_rag.cache.validate import EntryLayout
from hypic_rag.entries import prefill_isolated
from hypic_rag.kernels.algebra import SCALAR
from hypic_rag.model import load_model
from hypic_rag.model.mixers.mamba2 import Mamba2Mixer
from hypic_rag.testing.parity import assert_matches_transformers, well_conditioned_ids
from hypic_rag.testing.synthetic import build_checkpoint

# The time_step_min Mamba2 configs carry (an initialisation bound; Nemotron-H clamped dt there before
# transformers 5.25, Zamba2 still does).
TIME_STEP_MIN = 1e-3


def _segments(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [Segment(token_ids=torch.randint(3, 320, (n,), generator=gen).tolist()) for n in lengths]


def test_entries_store_a_scalar_operator_per_head(checkpoint):
    model = load_model(checkpoint("nemotron_h"))
    made = prefill_isolated(model, [list(range(3, 43))], [8])[0]
    heads = model.config.mamba_num_heads
    assert model.operator_forms == {0: SCALAR, 3: SCALAR}
    for i, lin in made.entry.linear.items():
        assert lin.p.shape == (heads,) and lin.b.shape == (heads, 8, 16)
        assert made.remainder.linear[i].p.shape == (heads,)
        assert bool(((lin.p > 0) & (lin.p <= 1)).all())  # exp(a * sum dt), a < 0
    layout = EntryLayout.of(model)
    layout.check(made.entry)
    layout.check(made.remainder)


def test_a_dense_operator_is_not_accepted_for_a_mamba2_layer(checkpoint):
    model = load_model(checkpoint("nemotron_h"))
    made = prefill_isolated(model, [list(range(3, 30))], [0])[0]
    lin = made.entry.linear[0]
    heads = lin.p.shape[0]
    made.entry.linear[0] = LinearEntry(lin.b, torch.eye(8).expand(heads, 8, 8).clone(), lin.conv_tail)
    with pytest.raises(CorruptEntry, match=r"linear.0.p has shape"):
        EntryLayout.of(model).check(made.entry)


def test_a_disk_round_trip_serves_a_reordered_prompt(checkpoint, tmp_path):
    """Entries written by one engine are read back from disk by another and hit, with the logits the
    first engine gives."""
    path = checkpoint("nemotron_h")
    segs = _segments([30, 41, 26])
    q = Segment(token_ids=[5, 6, 7, 8], kind="query")
    first = Engine.from_pretrained(path, cache_dir=tmp_path, min_cached_tokens=1)
    first.generate(segs[::-1], q, max_new_tokens=1)
    want = first.prompt_logits(segs, q)
    second = Engine.from_pretrained(path, cache_dir=tmp_path, min_cached_tokens=1)
    out = second.generate(segs, q, max_new_tokens=1)
    assert out.stats["hit_segments"] == 3 and out.stats["memory_hits"] == 0 and out.stats["disk_hits"] >= 3
    assert (out.prompt_logits - want).abs().max() < 1e-5


class _SoftplusRecorder(TorchFunctionMode):
    """Every softplus output: a Mamba2 mixer's dt before its clamp."""

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[torch.Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if getattr(func, "__name__", "") == "softplus":
            self.outputs.append(out.detach().flatten())
        return out


@pytest.mark.parametrize(
    "kind,overrides",
    [
        ("nemotron_h", {}),  # time_step_limit (0, inf): dt below time_step_min is kept
        ("nemotron_h", {"time_step_limit": (5e-4, 0.05)}),
        ("granitemoehybrid", {}),
        ("granitemoehybrid", {"time_step_limit": (5e-4, 0.05)}),
        ("bamba", {}),
        ("falcon_h1", {}),
        ("falcon_h1", {"time_step_limit": (5e-4, 0.05)}),
        ("zamba2", {}),  # clamped at time_step_min
        ("zamba2", {"time_step_min": 5e-4}),
    ],
)
def test_dt_below_time_step_min_matches_transformers(tmp_path, kind, overrides):
    """Each Mamba2 family clamps dt as its transformers class does, on a checkpoint where half the heads'
    dt falls below time_step_min (which a clamp at time_step_min would change)."""
    path = build_checkpoint(kind, tmp_path, overrides, small_dt=True)
    ours = load_model(path)
    ids = well_conditioned_ids(ours, (2, 512))
    with _SoftplusRecorder() as seen, torch.inference_mode():
        ours(ids)
    dt = torch.cat(seen.outputs)
    assert len(seen.outputs) == sum(isinstance(m, Mamba2Mixer) for m in ours.modules())
    assert float((dt < TIME_STEP_MIN).float().mean()) > 0.2  # the case this test is for
    assert_matches_transformers(ours, path, ids)
