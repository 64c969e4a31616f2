"""A run of kept turns composed as one cached segment (docs/design.md §6, "Runs of turns").

When a document is inserted into (or removed from) a warm conversation's history, the turns after it are still
held as a stretch of kept nodes (``cache.prefix.PrefixStore.find_run``), each with the KV the conversation
actually had and, at its end, the linear states. Such a run is composed like any cached segment, with one seam at
its junction, from an entry built here:

- attention layers: its tokens' KV, keys rotated back to positions ``0..L-1`` (the cache's convention), so the
  assembly moves them to where the run now sits;
- linear layers: ``S_end = P S_in + B`` with ``B = S_end_old - P S_old`` would be exact for the tokens' old inputs,
  given the run's in-context operator ``P``; a kept node holds states, not operators, so the run composes with
  ``P = 0``: its linear state after it is the one the conversation had there, which already carries everything
  before the run but the insertion. The insertion reaches the later tokens through attention (their KV is placed
  after it and the junction's seam and the query run over it), not through the linear layers' state.

Written here because no engine composes kept request states at a new position.
"""

from __future__ import annotations

import torch

from .assembly import placed_state
from .cache.entry import AttentionEntry, CachedSegment, LinearEntry, LinearRemainder, RemainderEntry, SegmentEntry
from .cache.prefix import Run
from .kernels.algebra import operator_shape, rerotate
from .model import HybridModel

RUN_KEY = "run:"  # a run's segment key: never looked up or stored, its entry comes from the prefix store


def run_segment(model: HybridModel, run: Run, ids: tuple[int, ...], seam: int) -> CachedSegment:
    """``run`` (whose tokens are ``ids``) as a cached segment, with the remainder after ``seam`` tokens it composes
    under variant B (the same map: its operator is zero)."""
    entry = SegmentEntry(ids)
    forms, mixers = model.operator_forms, model.linear_mixers()
    for layer, state in run.point.linear.items():
        # a state of RoPE-rotated keys (Ring-linear) moved as if the run began at 0; the others are position-free
        b = placed_state(mixers[layer], state.recurrent[0].float(), -run.first, model)
        p = torch.zeros(operator_shape(forms[layer], tuple(b.shape)), device=b.device)
        entry.linear[layer] = LinearEntry(b, p, state.conv[0])
    for layer, kv in run.kv().items():
        keys = kv.keys[0]
        owed = torch.arange(keys.shape[1], device=keys.device) - (kv.positions - kv.shift).to(keys.device)
        if bool(owed.any()) and model.inv_freq.numel():
            keys = rerotate(keys, owed, model.inv_freq)
        entry.attention[layer] = AttentionEntry(keys, kv.values[0])
    remainder = None
    if 0 < seam < len(ids):
        linear = {i: LinearRemainder(e.b, e.p) for i, e in entry.linear.items() if isinstance(e, LinearEntry)}
        remainder = RemainderEntry(ids, seam, dict(linear))
    return CachedSegment(entry, remainder)
