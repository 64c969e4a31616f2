"""The fidelity guard: a composed request's boundaries probed (``deviation``) before it is assembled, and from what
they read its seams chosen (an ``auto`` seam) or checked against a fidelity budget, which may send the request
to exact compute instead (docs/design.md §8). A generator, as the prefill program it runs in is: with a
``chunk``, each cold segment and each probe's forward is a piece a scheduler budgets."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Protocol

from .cache import CachedSegment
from .decoding import Piece
from .deviation import (
    boundary_deviation,
    deviation_tokens,
    isolated_through,
    probe_layer,
    reading_shares,
    reading_tokens,
    token_deviation,
)
from .model import HybridModel
from .options import AUTO, BLEND
from .outputs import RequestStats
from .plan import RequestPlan, SegmentPlan, choose_widths, recomputes_every_segment, with_widths
from .settings import PrefillSettings


class Program(Protocol):
    """What the guard reads of the prefill program it runs in (``prefill.PrefillProgram``)."""

    model: HybridModel
    settings: PrefillSettings

    def fill_steps(
        self, misses: Sequence[tuple[SegmentPlan, CachedSegment | None]], chunk: int | None
    ) -> Generator[Piece, int | None, list[CachedSegment]]: ...

    def find_remainders(self, plan: RequestPlan, found: list[CachedSegment | None]) -> None: ...


def guard(
    program: Program,
    plan: RequestPlan,
    found: list[CachedSegment | None],
    stats: RequestStats,
    seam_budget: float | None,
    fidelity_budget: float | None,
    chunk: int | None,
    prefilled: list[int],
) -> Generator[Piece, int | None, RequestPlan | None]:
    """Probe the boundaries (``deviation``) and let ``plan.choose_widths`` set an ``auto`` plan's widths and
    check the estimate against ``fidelity_budget``; ``found`` gets the remainders the new plan composes (and
    the entries it filled, whose indices go to ``prefilled``). The plan, or None to compute the request
    exactly. ``pic`` (no seams by definition) is never widened: over the budget it runs exactly. With
    ``chunk``, each cold segment and then each probe's forward is a piece."""
    layer, blend, auto = probe_layer(program.model), plan.seam == BLEND, plan.seam == AUTO
    probed, isolated = yield from probe_cold(program, plan, found, chunk, prefilled)
    if chunk is not None and (cost := deviation_tokens(program.model, plan, probed, blend)):
        yield Piece(cost)
    if blend:
        dev = token_deviation(program.model, plan, probed)
    else:
        dev = boundary_deviation(program.model, plan, probed, query=False)
    bounds = sorted(dev.per_boundary)
    # where the answer reads: only ``auto`` spends by it, and not where its budget recomputes every segment
    lengths = [len(plan.segments[i].ids) for i in bounds]
    whole = recomputes_every_segment(seam_budget, lengths)
    reading = None
    if auto and bounds and not whole:
        if chunk is not None and (cost := reading_tokens(program.model, plan, found)):
            yield Piece(cost)
        reading = reading_shares(program.model, plan, found)
    widths, estimate, action = choose_widths(
        [dev.profiles[i] for i in bounds],
        lengths,
        [plan.segments[i].seam for i in bounds],
        auto=auto,
        blend=blend,
        seam_budget=seam_budget,
        fidelity_budget=fidelity_budget,
        widen=plan.seam != 0,
        reads=[reading.shares[i] for i in bounds] if reading is not None and reading.shares else None,
    )
    read_tokens = reading.probe_tokens if reading is not None else 0
    stats.fidelity_estimate, stats.fidelity_action = estimate, action
    stats.probe_tokens, stats.probe_cold_tokens = dev.probe_tokens + read_tokens, isolated
    probed_layers = dev.probe_layers or (layer + 1 if layer is not None else 0)
    stats.probe_cost = dev.probe_tokens * probed_layers / program.model.config.num_hidden_layers + read_tokens
    stats.seam, stats.seam_variant, stats.cold_policy = plan.seam, plan.variant, program.settings.cold_policy
    if action == "exact":
        return None
    plan = with_widths(plan, dict(zip(bounds, widths, strict=True)))
    program.find_remainders(plan, found)
    stats.seam_widths = [seg.seam for seg in plan.segments]
    return plan


def probe_cold(
    program: Program,
    plan: RequestPlan,
    found: list[CachedSegment | None],
    chunk: int | None,
    prefilled: list[int],
) -> Generator[Piece, int | None, tuple[list[CachedSegment | None], int]]:
    """What the probes read for the cold segments (parallel policy), and the tokens run for it alone. A cold
    segment is probed from its run alone through the probed layers only (``deviation.isolated_through``)
    and filled once afterwards, with the remainder of the width the guard chose. Under ``auto``, whose
    reading probe runs every layer, it is filled first (``found`` and ``prefilled`` get it) and both probes
    read its entry, as a warm request's do: a cold request then chooses a warm one's widths."""
    layer, blend = probe_layer(program.model), plan.seam == BLEND
    probed, isolated = list(found), 0
    if layer is None or program.settings.cold_policy != "parallel":
        return probed, isolated
    # cold segments the probe reads (boundaries) or jumps over, as a warm request's probe does (not blend's)
    reads = plan.boundaries if blend else range(len(found))
    cold = [i for i in reads if plan.segments[i].key is not None and found[i] is None]
    if plan.seam == AUTO and cold:
        made = yield from program.fill_steps([(plan.segments[i], None) for i in cold], chunk)
        for i, entry in zip(cold, made, strict=True):
            found[i] = probed[i] = entry
        prefilled += cold
        return probed, isolated
    for i in cold:
        if chunk is not None:
            yield Piece(len(plan.segments[i].ids))
        probed[i] = isolated_through(program.model, plan.segments[i].ids, layer)
        isolated += len(plan.segments[i].ids)
    return probed, isolated
