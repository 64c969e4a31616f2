"""Log-decays exponentiated on the fast path: equal to ``exp`` where it matters, exact zeros where masked,
and the chunked scans still equal their recurrences when heads forget fast."""

from __future__ import annotations

import pytest
import torch

from hypic_rag.kernels.decay import FLOOR, decay_exp, masked_decay_exp
from hypic_rag.kernels.delta_rule import chunk_gated_delta_rule, l2norm, recurrent_gated_delta_rule
from hypic_rag.kernels.kda import kda_recurrent, kda_scan_reference
from hypic_rag.kernels.ssd import ssd_recurrent, ssd_scan


def test_decay_exp_is_exp_above_the_floor_and_tiny_below():
    x = torch.tensor([0.0, -1.0, -50.0, FLOOR, -95.0, -1e4, float("-inf")])
    got = decay_exp(x)
    assert torch.equal(got[:4], x[:4].exp())
    assert (got[4:] == torch.tensor(FLOOR).exp()).all() and got[4] < 1e-34


def test_masked_entries_are_exactly_zero_even_when_large():
    x = torch.tensor([[-1.0, 500.0], [-200.0, -3.0]])
    keep = torch.tensor([[True, False], [True, True]])
    got = masked_decay_exp(x, keep)
    assert got[0, 1] == 0.0 and torch.isfinite(got).all()
    assert torch.equal(got[keep][[0, 2]], x[keep][[0, 2]].exp())


def test_the_delta_rule_still_equals_its_recurrence_when_heads_forget_fast():
    """Gates of -4 per token put most of a 64-token chunk's decay matrix under the floor."""
    gen = torch.Generator().manual_seed(0)
    b, h, t, dk, dv = 1, 2, 100, 16, 8
    q = l2norm(torch.randn(b, h, t, dk, generator=gen)) * dk**-0.5
    k = l2norm(torch.randn(b, h, t, dk, generator=gen))
    v, s0 = torch.randn(b, h, t, dv, generator=gen), torch.randn(b, h, dk, dv, generator=gen)
    g = -4.0 * torch.rand(b, h, t, generator=gen) - 2.0
    beta = torch.rand(b, h, t, generator=gen)
    out_c, s_c = chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=64)
    out_r, s_r = recurrent_gated_delta_rule(q, k, v, g, beta, s0)
    assert (out_c - out_r).abs().max() < 1e-5 and (s_c - s_r).abs().max() < 1e-5


@pytest.mark.parametrize("scan", ["kda", "ssd"])
def test_the_other_chunked_scans_too(scan):
    gen = torch.Generator().manual_seed(1)
    n, t, h = 1, 70, 2
    if scan == "kda":
        dk, dv = 8, 8
        q = l2norm(torch.randn(n, t, h, dk, generator=gen)) * dk**-0.5
        k = l2norm(torch.randn(n, t, h, dk, generator=gen))
        v = torch.randn(n, t, h, dv, generator=gen)
        g = -5.0 * torch.rand(n, t, h, dk, generator=gen)
        beta = torch.rand(n, t, h, generator=gen)
        got, want = kda_scan_reference(q, k, v, g, beta), kda_recurrent(q, k, v, g, beta)
    else:
        p, ns = 4, 8
        x = torch.randn(n, t, h, p, generator=gen)
        dt = 3.0 * torch.rand(n, t, h, generator=gen) + 1.0
        a = -torch.full((h,), 3.0)
        bb, c = torch.randn(n, t, h, ns, generator=gen), torch.randn(n, t, h, ns, generator=gen)
        got, want = ssd_scan(x, dt, a, bb, c), ssd_recurrent(x, dt, a, bb, c)
    assert (got[0] - want[0]).abs().max() < 1e-5 and (got[1] - want[1]).abs().max() < 1e-5
