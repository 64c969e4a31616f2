"""How far each boundary of a composed request is from its in-context self: what ``seam="auto"`` and the
fidelity guard read (docs/design.md §4).

A probe runs the request's fused forward, with a ``PROBE_WIDTH``-token seam at every boundary, through the first
attention layer only, on a throwaway state, and compares the seam tokens' in-context keys and values there with
the ones their cache entry holds (computed with the segment alone), and measures how much attention the query
pays each segment there. The probe jumps over every cached segment with its whole operator (variant A), so it
needs no remainder entries; it places keys and jumps only in the layers it runs. The query runs only for the
``mass`` signals: ``auto`` and the guard read the seams alone, which no later token changes (causal), so their
probe leaves it out (``query=False``).

``auto`` also reads where the answer reads (``reading_shares``): a second probe composes every cached
segment whole (no seam), runs the query and the segments too short to cache through every layer, and takes
the share of attention the prompt's last token pays each segment at the last attention layer. A cached
segment's error is spread through its tokens, and the ones the answer reads carry it there: ``auto`` drops the
seams of segments barely read and recomputes the most read segments whole (``plan.allocate_seams``).

The CacheBlend-style baseline (``seam="blend"``) reads every cached token's distance instead: its probe,
``token_deviation``, runs the whole prompt (the query aside) in context through the first attention layer, as
CacheBlend recomputes its first layer in full, and compares each token's value there with its cached one.

``auto`` and the guard read the per-token value distances (``Deviation.profiles``): where a boundary's first
tokens settle is the seam it needs (``plan.settled_width``). The per-boundary summaries below are the
candidates ``eval/bench/deviation.py`` ranks requests by (none ranked them well on every family):

- ``v``: mean relative L2 distance of the seam tokens' values from the cached ones;
- ``k``: the same for keys, the cached ones rotated to where the segment now sits;
- ``v_last``, ``k_last``: the distance at the probe's last token only (how unsettled the boundary still is);
- ``mass``: the share of attention the query's tokens pay the segment there; ``mass_v``: ``mass`` times ``v``;
- ``deep_*``: the same at the last attention layer, from a probe through it (``deep=True``: nearly the whole
  stack, so several times the cost).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from .assembly import FusedInputs, fresh_tokens, fused_inputs
from .cache.entry import AttentionEntry, CachedSegment, LinearEntry, SegmentEntry
from .kernels.algebra import rerotate
from .kernels.indices import int64
from .kernels.rope import apply_rope, rope_cos_sin
from .model import HybridModel, RequestState, TransitionCapture
from .plan import RequestPlan, with_widths

FIRST_SIGNALS = ("v", "k", "v_last", "k_last")
# deep_: at the last attention layer
SIGNALS = (*FIRST_SIGNALS, "mass", "mass_v", *(f"deep_{s}" for s in (*FIRST_SIGNALS, "mass")))
SIGNAL = "v_last"  # ``Deviation.signal``'s default
PROBE_WIDTH = 8


@dataclass(frozen=True)
class Deviation:
    """Per boundary (segment index), each signal's value; ``probe_tokens`` went through the probed layers."""

    per_boundary: dict[int, dict[str, float]]
    probe_tokens: int
    probe_layers: int
    # per boundary, the value distance of each probed token at the first attention layer (``auto`` reads it)
    profiles: dict[int, list[float]] = field(default_factory=dict)

    def signal(self, name: str | None = None) -> dict[int, float]:
        """Each boundary's value of signal ``name`` (default ``SIGNAL``)."""
        return {i: sig[name or SIGNAL] for i, sig in self.per_boundary.items()}


def probe_layer(model: HybridModel) -> int | None:
    """The last layer a (shallow) probe runs: the first attention layer; None for a model without one."""
    layers = model.new_state().attention_layer_ids
    return layers[0] if layers else None


@torch.inference_mode()
def isolated_through(model: HybridModel, ids: Sequence[int], through_layer: int) -> CachedSegment:
    """A cold segment prefilled alone through ``through_layer`` only: as much of its cache entry as a probe
    reads (operators of the linear layers and keys of the attention layers up to there). The guard probes a
    cold segment with it and fills the whole entry once, with the remainder of the width it then chooses;
    unbatched and kept dense (its cost is a probe's, and it is never stored)."""
    state = model.new_state()
    capture = TransitionCapture(int64([len(ids)], model.device))
    model.hidden_states(int64(ids, model.device)[None], state, capture=capture, through_layer=through_layer)
    entry = SegmentEntry(tuple(ids))
    for layer in (i for i in state.linear_layer_ids if i <= through_layer):
        lin = state.linear(layer)
        entry.linear[layer] = LinearEntry(lin.recurrent[0], capture.operators[layer].p[0], lin.conv[0])
    for layer in (i for i in state.attention_layer_ids if i <= through_layer):
        kv = state.attention(layer)
        entry.attention[layer] = AttentionEntry(kv.keys[0], kv.values[0])
    return CachedSegment(entry)


def _relative(fresh: torch.Tensor, cached: torch.Tensor) -> torch.Tensor:
    """Per token (dim 1 of ``[H, T, D]``), ``|fresh - cached| / |cached|``."""
    diff = (fresh.float() - cached.float()).pow(2).sum(dim=(0, 2)).sqrt()
    return diff / cached.float().pow(2).sum(dim=(0, 2)).sqrt().clamp_min(1e-12)


@torch.inference_mode()
def boundary_deviation(
    model: HybridModel,
    plan: RequestPlan,
    cached: Sequence[CachedSegment | None],
    width: int = PROBE_WIDTH,
    deep: bool = False,
    query: bool = True,
) -> Deviation:
    """The signals of every boundary of ``plan`` whose segment ``cached`` holds, from a probe with a
    ``width``-token seam there; ``deep`` probes through the last attention layer too; without the ``query``
    the ``mass`` signals are left out (0)."""
    state = model.new_state()
    layers = state.attention_layer_ids
    probe = _boundary_probe(model, plan, cached, width, query)
    if probe is None:
        return Deviation({}, 0, 0)
    bounds = [i for i in plan.boundaries if cached[i] is not None]
    layer, last = layers[0], layers[-1] if deep else layers[0]
    query = query and bool(plan.query)  # no query, nothing reads: the mass signals are 0
    inputs = fused_inputs(model, state, probe, cached, through_layer=last)
    state.queries = {} if query else None
    model.hidden_states(inputs.ids, state, inputs.positions, jumps=inputs.jumps, through_layer=last)
    lengths = [len(seg.ids) for seg in plan.segments]
    q = len(plan.query)
    mass = _query_mass(model, state, layer, q, q, inputs, lengths) if query else [0.0] * len(lengths)
    deep_mass = _query_mass(model, state, last, q, q, inputs, lengths) if deep and query else mass
    out: dict[int, dict[str, float]] = {}
    profiles: dict[int, list[float]] = {}
    for i in bounds:
        seam = inputs.seams.get(i)
        if not seam:
            continue
        found, offset = cached[i], inputs.offsets[i]
        assert found is not None
        fresh = [inputs.placed + j for j in seam]
        out[i], profiles[i] = _signals(model, state, layer, found, fresh, offset)
        out[i]["mass"] = mass[i]
        out[i]["mass_v"] = mass[i] * out[i]["v"]
        if deep:
            deeper = _signals(model, state, last, found, fresh, offset)[0]
            out[i].update({f"deep_{k}": v for k, v in deeper.items()})
            out[i]["deep_mass"] = deep_mass[i]
    return Deviation(out, inputs.ids.shape[1], last + 1, profiles)


@dataclass(frozen=True)
class Reading:
    """Per segment index, the share of attention the prompt's last token pays that segment at the last
    attention layer; ``probe_tokens`` went through every layer."""

    shares: dict[int, float]
    probe_tokens: int


@torch.inference_mode()
def reading_shares(model: HybridModel, plan: RequestPlan, cached: Sequence[CachedSegment | None]) -> Reading:
    """How much the answer reads each segment: the share of attention the prompt's last token pays its tokens
    at the last attention layer (mean over heads), from the forward that composes every segment ``cached``
    holds whole (no seam) and runs the others and the query in context. ``auto`` spends its budget where the
    answer reads: a cached segment's error is spread through its tokens, and only the ones read carry it to
    the answer. Entries must reach every layer (the engine fills a cold segment first)."""
    state = model.new_state()
    layers = state.attention_layer_ids
    probe = _reading_probe(model, plan, cached)
    if probe is None:
        return Reading({}, 0)
    inputs = fused_inputs(model, state, probe, cached)
    state.queries = {}
    model.hidden_states(inputs.ids, state, inputs.positions, jumps=inputs.jumps)
    lengths = [len(seg.ids) for seg in plan.segments]
    shares = _query_mass(model, state, layers[-1], len(plan.query), 1, inputs, lengths)
    return Reading(dict(enumerate(shares)), inputs.ids.shape[1])


def _boundary_probe(
    model: HybridModel, plan: RequestPlan, cached: Sequence[CachedSegment | None], width: int, query: bool
) -> RequestPlan | None:
    """The plan ``boundary_deviation`` runs: a ``width``-token seam at each boundary ``cached`` holds; None when
    there is nothing to probe."""
    bounds = [i for i in plan.boundaries if cached[i] is not None]
    if probe_layer(model) is None or not bounds or width < 1:
        return None
    query = query and bool(plan.query)
    return with_widths(replace(plan, variant="A", query=plan.query if query else ()), {i: width for i in bounds})


def _reading_probe(model: HybridModel, plan: RequestPlan, cached: Sequence[CachedSegment | None]) -> RequestPlan | None:
    """The plan ``reading_shares`` runs: every cached segment composed whole; None without a query to read."""
    if probe_layer(model) is None or not plan.query:
        return None
    bounds = [i for i in plan.boundaries if cached[i] is not None]
    return with_widths(replace(plan, variant="A"), dict.fromkeys(bounds, 0))


def _token_probes(model: HybridModel, plan: RequestPlan, cached: Sequence[CachedSegment | None]) -> bool:
    return probe_layer(model) is not None and any(cached[i] is not None for i in plan.boundaries)


def deviation_tokens(model: HybridModel, plan: RequestPlan, cached: Sequence[CachedSegment | None], blend: bool) -> int:
    """The tokens the guard's deviation probe runs (``token_deviation`` for ``blend``, else ``boundary_deviation``
    without the query), known before it runs: a scheduler's cost of that piece."""
    if blend:
        return sum(len(seg.ids) for seg in plan.segments) if _token_probes(model, plan, cached) else 0
    probe = _boundary_probe(model, plan, cached, PROBE_WIDTH, query=False)
    return fresh_tokens(probe, cached) if probe is not None else 0


def reading_tokens(model: HybridModel, plan: RequestPlan, cached: Sequence[CachedSegment | None]) -> int:
    """The tokens ``reading_shares`` runs, known before it runs."""
    probe = _reading_probe(model, plan, cached)
    return fresh_tokens(probe, cached) if probe is not None else 0


@torch.inference_mode()
def token_deviation(model: HybridModel, plan: RequestPlan, cached: Sequence[CachedSegment | None]) -> Deviation:
    """Every cached token's value distance at the first attention layer, per boundary (``profiles`` over the
    whole segment), from the prompt's segments run in context through that layer."""
    state = model.new_state()
    layers = state.attention_layer_ids
    bounds = [i for i in plan.boundaries if cached[i] is not None]
    if not _token_probes(model, plan, cached):
        return Deviation({}, 0, 0)
    layer = layers[0]
    ids = [t for seg in plan.segments for t in seg.ids]
    model.hidden_states(int64(ids, model.device)[None], state, through_layer=layer)
    out: dict[int, dict[str, float]] = {}
    profiles: dict[int, list[float]] = {}
    offset = 0
    for i, seg in enumerate(plan.segments):
        found, n = cached[i], len(seg.ids)
        if i in bounds and found is not None:
            out[i], profiles[i] = _signals(model, state, layer, found, list(range(offset, offset + n)), offset)
        offset += n
    return Deviation(out, len(ids), layer + 1, profiles)


def _signals(
    model: HybridModel, state: RequestState, layer: int, found: CachedSegment, fresh: list[int], offset: int
) -> tuple[dict[str, float], list[float]]:
    """One attention layer's signals at one boundary: the seam's fresh keys and values (at ``fresh`` in the
    state's KV) against the cached ones, those keys rotated to the segment's ``offset``."""
    kv = state.attention(layer)
    assert kv is not None
    idx = int64(fresh, kv.keys.device)
    fresh_k, fresh_v = kv.keys[0].index_select(1, idx), kv.values[0].index_select(1, idx)
    entry = found.entry.attention[layer]
    w = len(fresh)
    keys = rerotate(entry.keys[None, :, :w], int64([offset] * w, kv.keys.device), model.inv_freq)[0]
    dk, dv = _relative(fresh_k, keys), _relative(fresh_v, entry.values[:, :w])
    signals = {"v": float(dv.mean()), "k": float(dk.mean()), "v_last": float(dv[-1]), "k_last": float(dk[-1])}
    return signals, dv.tolist()


def _query_mass(
    model: HybridModel,
    state: RequestState,
    layer: int,
    query: int,
    reading: int,
    inputs: FusedInputs,
    lengths: list[int],
) -> list[float]:
    """Per segment, the share of attention the query's last ``reading`` tokens (of ``query``) pay its tokens at
    ``layer`` (mean over heads and those tokens): how much of what the answer reads comes from that segment."""
    kv = state.attention(layer)
    assert kv is not None and state.queries is not None
    q, scale = state.queries[layer]
    q = q[0, :, -reading:].float()  # [Hq, Tq, D]
    keys = kv.keys[0].float()
    if bool(kv.shift.any()):
        cos, sin = rope_cos_sin(model.inv_freq, kv.shift)
        keys = apply_rope(keys[None], cos, sin)[0]
    keys = keys.repeat_interleave(q.shape[0] // keys.shape[0], dim=0)
    scores = torch.einsum("htd,hsd->hts", q, keys) * scale
    visible = kv.positions[None, :] <= inputs.positions[-reading:][:, None]
    probs = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1).mean(dim=(0, 1))  # [S]
    per_position = torch.zeros(sum(lengths) + query, device=probs.device).index_add_(0, kv.positions, probs)
    return [float(chunk.sum()) for chunk in per_position[: sum(lengths)].split(lengths)]
