"""The prefill program: a prompt to its first logits and request state, in its mode. ``full`` runs it in context,
``prefix`` restores the longest cached prefix and runs the rest; the composed modes (``pic``, ``hypic``) go plan
→ restore the longest exactly cached prefix → look up → (guard) → fill the misses → assemble the segments after
the prefix → first logits, each step in its own module (``plan``, ``cache``, ``guard``, ``entries``,
``assembly``), orchestrated here. Written as a generator that yields each
``Piece`` (a forward's tokens) before running it, so a scheduler can budget a prompt a piece at a time; ``run``
drains it whole."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import torch

from .assembly import assemble, assemble_fused, fresh_tokens, run_in_context
from .cache import CachedSegment, PrefixStore, RemainderEntry, SegmentEntry, SegmentStore, segment_key
from .cache.prefix import EXACT, Keeping, Kept, composed_namespace
from .decoding import Decoder, Piece
from .entries import prefill_isolated
from .guard import guard
from .kernels.indices import int64
from .model import HybridModel, RequestState
from .model.state import StateMarks
from .options import ADAPTIVE, COMPOSED, RequestOptions, check_mode
from .outputs import RequestStats
from .plan import Prompt, RequestPlan, SegmentPlan, after, plan_request, short_in_context, with_run
from .runs import RUN_KEY, run_segment
from .settings import PrefillSettings


@dataclass
class Prefilled:
    """A prompt run through the model: next-token logits ``[V]``, the request state after it, its
    stats, and the misses whose entries are made once the first token is out (``deferred``: the exact
    cold policy), each with what the cache had of it."""

    logits: torch.Tensor
    state: RequestState
    stats: RequestStats
    deferred: list[Deferred]
    keeping: Keeping | None = None  # the states it keeps once it ends (``PrefillProgram.keep_answer``)


def missing(seg: SegmentPlan, found: CachedSegment | None) -> bool:
    """A cacheable segment without its entry, or without the remainder its plan composes."""
    return seg.key is not None and (found is None or (seg.remainder > 0 and found.remainder is None))


Deferred = tuple[SegmentPlan, CachedSegment | None]


def _stops(prompt: Prompt) -> list[int]:
    """Where ``prefix`` mode keeps a state: each segment's end, and where the generation prompt begins."""
    ends, at = [], 0
    for ids in prompt.segments:
        at += len(ids)
        ends.append(at)
    return [*ends, prompt.header_at] if prompt.header_at is not None else ends


def _covered(prompt: Prompt, at: int) -> int:
    """How many leading segments the first ``at`` tokens cover whole."""
    n, end = 0, 0
    for ids in prompt.segments:
        end += len(ids)
        if end > at:
            break
        n += 1
    return n


T = TypeVar("T")


def drain(steps: Generator[Piece, int | None, T]) -> T:
    """Run a prefill that pauses before each piece to its end, every piece whole; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


class PrefillProgram:
    """One engine's prefill: its model, its segment and prefix stores, its settings (read at each request, so a
    change between requests holds) and, optionally, a pool that prefills cold segments elsewhere
    (``ray_prefill.RayPrefill``)."""

    def __init__(
        self,
        model: HybridModel,
        settings: PrefillSettings,
        segment_store: SegmentStore,
        prefix_store: PrefixStore,
        fingerprint: str,
        pool: Any = None,
    ) -> None:
        self.model, self.settings, self.fingerprint, self.pool = model, settings, fingerprint, pool
        self.segment_store, self.prefix_store = segment_store, prefix_store

    def plan(self, prompt: Prompt, mode: str = "hypic", seam: int | float | None = None) -> RequestPlan:
        """How a composed request (``pic`` or ``hypic``) will serve each segment of ``prompt``."""
        check_mode(mode)
        seam = 0 if mode == "pic" else self.settings.seam if seam is None else seam
        return plan_request(
            prompt,
            seam=seam,
            default_seam=self.settings.seam,
            variant=self.settings.seam_variant,
            min_cached_tokens=self.settings.min_cached_tokens,
            key=lambda ids: segment_key(ids, self.fingerprint, self.model.dtype),
        )

    def run(
        self, prompt: Prompt, mode: str, seam: int | float | str | None, options: RequestOptions | None = None
    ) -> Prefilled:
        return drain(self.steps(prompt, mode, seam, None, options))

    @torch.inference_mode()
    def steps(
        self,
        prompt: Prompt,
        mode: str,
        seam: int | float | str | None,
        chunk: int | None,
        options: RequestOptions | None = None,
    ) -> Generator[Piece, int | None, Prefilled]:
        """The prompt's prefill, run whole (``chunk`` None) or a piece at a time: before each forward it yields
        the ``Piece`` it is (its tokens) and is sent how many tokens it may run. A prompt run in context
        (``full``, ``prefix``'s uncached segments) goes in chunks of at most ``chunk`` tokens, cut to what it is
        sent; a composed one a cold segment, a probe, then its fused forward at a time."""
        before = dict(self.segment_store.counters)
        done = yield from self._mode(prompt, mode, seam, chunk, options or RequestOptions())
        after = self.segment_store.counters
        counted = ("memory_hits", "disk_hits", "remote_hits", "corrupt", "tier_errors")
        done.stats.store_counters = {k: after[k] - before[k] for k in counted}
        return done

    def _mode(
        self, prompt: Prompt, mode: str, seam: int | float | str | None, chunk: int | None, options: RequestOptions
    ) -> Generator[Piece, int | None, Prefilled]:
        state = self.model.new_state()
        stats = RequestStats.uncached(mode, len(prompt.ids), len(prompt.segments))
        if mode in COMPOSED:
            plan = self.plan(prompt, mode, seam)
            logits, deferred, keeping = yield from self._composed(plan, state, stats, chunk, options, prompt)
            if logits is not None:
                return Prefilled(logits, state, stats, deferred, keeping)
            state = self.model.new_state()  # the guard chose to compute it exactly, as ``full`` does
            stats.recomputed_tokens, stats.cached_tokens = len(prompt.ids) + stats.filled_tokens, 0
            logits = yield from self._in_context(prompt.ids, state, chunk)
            return Prefilled(logits, state, stats, deferred)
        if mode == "prefix":
            logits, keeping = yield from self._prefix(prompt, state, stats, chunk)
            return Prefilled(logits, state, stats, [], keeping)
        logits = yield from self._in_context(prompt.ids, state, chunk)  # full: the whole prompt in context
        return Prefilled(logits, state, stats, [])

    def _in_context(
        self, ids: Sequence[int], state: RequestState, chunk: int | None
    ) -> Generator[Piece, int | None, torch.Tensor]:
        """Run ``ids`` after ``state`` in chunks of at most ``chunk`` tokens, each cut to what it is sent (None:
        whole); the next-token logits."""
        last = list(ids)
        while chunk is not None:
            piece = Piece(min(len(last), chunk), splittable=True)
            take = piece.runs((yield piece))
            if take >= len(last):
                break  # the last chunk: run with the logits below
            run_in_context(self.model, state, last[:take])
            last = last[take:]
        return self.last_logits(last, state)

    def _keeping(
        self,
        ids: Sequence[int],
        at: int,
        stops: Sequence[int],
        state: RequestState,
        chunk: int | None,
        keeping: Keeping,
        namespace: str,
    ) -> Generator[Piece, int | None, torch.Tensor]:
        """Run ``ids[at:]`` in context after ``state`` (which holds ``ids[:at]``), marking the state at each of
        ``stops`` and at the end, to be kept once the request ends; the next-token logits. A forward per chunk,
        which records the states at the stops inside it (a forward per stop would read the weights again)."""
        stops = sorted({stop for stop in stops if at < stop < len(ids)})
        while chunk is not None:
            piece = Piece(min(len(ids) - at, chunk), splittable=True)
            take = piece.runs((yield piece))
            if at + take >= len(ids):
                break  # the last chunk: run with the logits below
            self._marked(ids[: at + take], at, stops, state, keeping, namespace)
            at += take
        logits = self._marked(ids, at, stops, state, keeping, namespace, logits=True)
        self.prefix_store.mark(keeping, ids, state, namespace)
        assert logits is not None
        return logits

    def _marked(
        self,
        ids: Sequence[int],
        at: int,
        stops: Sequence[int],
        state: RequestState,
        keeping: Keeping,
        namespace: str,
        logits: bool = False,
    ) -> torch.Tensor | None:
        """Run ``ids[at:]`` after ``state`` in one forward that marks the state at each of ``stops`` inside it (one
        at ``at``: before it); the next-token logits when asked."""
        if at in stops:
            self.prefix_store.mark(keeping, ids[:at], state, namespace)
        inside = tuple(stop - at for stop in stops if at < stop < len(ids))
        marks = StateMarks(inside) if inside else None
        out = None
        if logits:
            out = self.last_logits(ids[at:], state, marks)
        else:
            self.model.hidden_states(int64(ids[at:], self.model.device)[None], state, marks=marks)
        if marks is not None:
            self.prefix_store.mark_within(keeping, ids, len(ids) - at, marks, state, namespace)
        return out

    def last_logits(self, ids: Sequence[int], state: RequestState, marks: StateMarks | None = None) -> torch.Tensor:
        """Run ``ids`` after ``state`` (recording ``marks``); the next-token logits ``[V]``."""
        tensor = int64(ids, self.model.device)[None]
        return self.model(tensor, state=state, logits_to_keep=1, marks=marks)[0, -1].float()

    def _restore(self, prompt: Prompt, state: RequestState, namespaces: Sequence[str], root_at: int) -> Kept | None:
        """Restore into the empty ``state`` the longest state kept in ``namespaces`` whose tokens begin the prompt,
        leaving at least its last token to run (for its logits); ``root_at``: where its first state will be kept."""
        ids = prompt.ids
        kept = self.prefix_store.find(ids, namespaces, most=len(ids) - 1, root_at=root_at)
        if kept is not None:
            self.prefix_store.restore(kept, state)
        return kept

    def _prefix(
        self, prompt: Prompt, state: RequestState, stats: RequestStats, chunk: int | None
    ) -> Generator[Piece, int | None, tuple[torch.Tensor, Keeping]]:
        """Restore the longest exact state kept, run the rest in context, keeping the state at each segment's end
        and where the generation prompt begins."""
        ids = prompt.ids
        stops = _stops(prompt)
        kept = self._restore(prompt, state, (EXACT,), min(stops, default=len(ids)))
        at = kept.length if kept is not None else 0
        keeping = self.prefix_store.begin(state, kept)
        logits = yield from self._keeping(ids, at, stops, state, chunk, keeping, EXACT)
        stats.hit_segments = _covered(prompt, at)
        stats.miss_segments = len(prompt.segments) - stats.hit_segments
        stats.recomputed_tokens, stats.cached_tokens, stats.prefix_tokens = len(ids) - at, at, at
        return logits, keeping

    def _composed(
        self,
        plan: RequestPlan,
        state: RequestState,
        stats: RequestStats,
        chunk: int | None,
        options: RequestOptions,
        prompt: Prompt,
    ) -> Generator[Piece, int | None, tuple[torch.Tensor | None, list[Deferred], Keeping | None]]:
        """Restore the longest state kept, look up, fill the misses (now, or after the first token under the exact
        policy), assemble and run the query: the next-token logits, the misses whose filling is deferred and the
        last state kept. An ``auto`` seam or a fidelity budget probes the boundaries first (``_guard``); logits None:
        the guard wants it computed exactly, and the misses are still filled after its first token, so the cache
        learns them."""
        budget = options.fidelity_budget if options.fidelity_budget is not None else self.settings.fidelity_budget
        guarded_plan = plan.seam in ADAPTIVE or budget is not None
        namespace = composed_namespace(plan.seam, plan.variant)
        kinds = prompt.kinds
        # The guard probes a plan from the prompt's start, so a guarded request composes every segment.
        keeps = self.settings.keep_states and not guarded_plan
        readable = (EXACT, namespace) if keeps else (EXACT,)
        first = len(prompt.ids) - len(prompt.query) if prompt.segments else prompt.header_at or len(prompt.ids)
        kept = None if guarded_plan else self._restore(prompt, state, readable, first)
        restored = kept.length if kept is not None else 0
        depth = 0
        if restored:  # the segments after the kept state compose onto it; the first of them keeps its seam
            plan, depth = after(plan, restored)
            kinds = kinds[len(prompt.segments) - len(plan.segments) :] if kinds is not None else None
        stats.memory_segments = depth + sum(
            seg.key is not None and seg.key in self.segment_store for seg in plan.segments
        )
        stats.prefix_segments, stats.prefix_tokens = depth, restored
        found = self.lookup(plan, kinds)
        if keeps:
            plan, found, stats.run_tokens = self._runs(prompt.ids, plan, found, restored, readable)
        if restored:
            plan = short_in_context(plan, [f is not None for f in found])
        prefilled: list[int] = []  # misses the guard filled before its probes (auto)
        filled = 0  # tokens run in isolation to make entries; the guard's fills count whatever it chose
        if guarded_plan:
            guarded = yield from guard(self, plan, found, stats, options.seam_budget, budget, chunk, prefilled)
            filled = sum(len(plan.segments[i].ids) for i in prefilled)
            if guarded is None:
                stats.filled_tokens = filled
                return None, [(seg, found[i]) for i, seg in enumerate(plan.segments) if missing(seg, found[i])], None
            plan = guarded
        missed = [i for i, seg in enumerate(plan.segments) if missing(seg, found[i])]
        made_here = set(missed).union(prefilled)  # not held before the request
        hits = depth + sum(f is not None and i not in made_here for i, f in enumerate(found))
        stats.cached_tokens = restored + sum(
            len(seg.ids) - seg.seam
            for i, (seg, f) in enumerate(zip(plan.segments, found, strict=True))
            if f is not None and i not in made_here and not seg.in_context
        )
        # After a restored state (a turn's new messages) the misses run in context, exactly, under either policy:
        # their isolated prefill would run the same tokens and a seam more. Their entries are made after the first
        # token, as the exact policy makes them.
        later = set(missed) if self.settings.cold_policy == "exact" or restored else set()
        now = [i for i in missed if i not in later]
        if now:
            made = yield from self.fill_steps([(plan.segments[i], found[i]) for i in now], chunk)
            for i, entry in zip(now, made, strict=True):
                found[i] = entry
            # a segment the guard filled whose remainder it lacked is filled again: both count
            filled += sum(len(plan.segments[i].ids) for i in now)
        deferred = [(plan.segments[i], found[i]) for i in missed if i in later]
        for i in later:  # they run in context
            found[i] = None
        stats.hit_segments, stats.miss_segments = hits, depth + len(plan.segments) - hits
        keeping = self.prefix_store.begin(state, kept) if keeps else None
        logits, ran = yield from self._assemble(plan, found, state, chunk, prompt, keeping, namespace)
        stats.recomputed_tokens, stats.filled_tokens = filled + ran, filled
        held = [(seg.key, f) for seg, f in zip(plan.segments, found, strict=True) if f and seg.key]
        stats.cache_bytes = sum(self.segment_store.held_nbytes(k, f) for k, f in held if not k.startswith(RUN_KEY))
        stats.seam, stats.seam_variant, stats.cold_policy = plan.seam, plan.variant, self.settings.cold_policy
        return logits, deferred, keeping

    def _runs(
        self,
        ids: Sequence[int],
        plan: RequestPlan,
        found: list[CachedSegment | None],
        at: int,
        namespaces: Sequence[str],
    ) -> tuple[RequestPlan, list[CachedSegment | None], int]:
        """Each stretch of a kept conversation found again after the restored state (``at`` tokens), from one of
        ``plan``'s segments on, composes as one cached segment (``runs``) in place of the segments it covers: the
        turns after a document inserted into (or removed from) the history. The plan, its entries, and the tokens
        the runs give (their seams aside)."""
        query_at = len(ids) - len(plan.query)
        i, offset, reused = 0, at, 0
        while i < len(plan.segments):
            seg = plan.segments[i]
            run = self.prefix_store.find_run(ids, offset, namespaces, query_at)
            # a run replaces a segment the cache holds only where it covers more: an entry has its own operator
            if (
                run is None
                or run.length < max(len(seg.ids), self.settings.min_cached_tokens)
                or (found[i] is not None and run.length <= len(seg.ids))
            ):
                offset, i = offset + len(seg.ids), i + 1
                continue
            plan, last, cut = with_run(plan, i, run.length, RUN_KEY + run.chain[-1][0], opens=offset == 0)
            placed = plan.segments[i]
            entry = run_segment(self.model, run, placed.ids, placed.remainder)
            found = [*found[:i], entry, *([None] if cut else []), *found[last + 1 :]]
            reused += run.length - placed.seam
            offset, i = offset + run.length, i + 1
        return plan, found, reused

    def _assemble(
        self,
        plan: RequestPlan,
        found: list[CachedSegment | None],
        state: RequestState,
        chunk: int | None,
        prompt: Prompt,
        keeping: Keeping | None,
        namespace: str,
    ) -> Generator[Piece, int | None, tuple[torch.Tensor, int]]:
        """Assemble the segments onto ``state`` and run the query: the next-token logits and the tokens that went
        through the model. With ``keeping``, the state is marked where the query begins, where the generation
        prompt begins, and at the end: under ``namespace``, or as exact where nothing was composed; the forward
        records the marks (``StateMarks``). Without (a guarded plan, whose seams were the guard's choice for this
        prompt, or an engine that keeps no states), nothing is marked."""
        if keeping is None:
            if chunk is not None:
                yield Piece(fresh_tokens(plan, found))
            if self.settings.fuse_forwards:
                return assemble_fused(self.model, state, plan, found)
            ran = assemble(self.model, state, plan, found) + len(plan.query)
            return self.last_logits(plan.query, state), ran
        composed = any(f is not None and not seg.in_context for seg, f in zip(plan.segments, found, strict=True))
        base = keeping.base
        if not composed and (base is None or base.namespace == EXACT):
            namespace = EXACT  # run in context after an exact state: as ``prefix`` would have
        ids = prompt.ids
        start = len(ids) - len(plan.query)  # where the query begins
        segments = replace(plan, query=())
        fresh = fresh_tokens(segments, found)
        stops = [prompt.header_at] if prompt.header_at is not None else []
        if plan.segments and fresh and self.settings.fuse_forwards:  # one forward, marked in its query
            if chunk is not None:
                yield Piece(fresh + len(plan.query))
            ran = fresh + len(plan.query)
            at = sorted({stop - start + fresh for stop in [start, *stops] if start <= stop < len(ids)})
            marks = StateMarks(tuple(at))
            logits, _ = assemble_fused(self.model, state, plan, found, marks=marks)
            self.prefix_store.mark_within(keeping, ids, ran, marks, state, namespace)
            self.prefix_store.mark(keeping, ids, state, namespace)
            return logits, ran
        ran = 0
        if plan.segments:
            if chunk is not None and fresh:
                yield Piece(fresh)
            ran = assemble(self.model, state, segments, found)  # unfused, or nothing fresh to fuse
            self.prefix_store.mark(keeping, ids[:start], state, namespace)
        logits = yield from self._keeping(ids, start, stops, state, chunk, keeping, namespace)
        return logits, ran + len(plan.query)

    def keep_answer(self, ids: Sequence[int], keeping: Keeping, decoder: Decoder) -> None:
        """Keep what a finished request marked and its state after its answer (``ids`` its prompt's): the next
        turn of a conversation begins with both."""
        self.prefix_store.keep(keeping, decoder.state, [*ids, *decoder.ids])

    def find_remainders(self, plan: RequestPlan, found: list[CachedSegment | None]) -> None:
        """``found`` gets the remainder each cached segment of ``plan`` composes at its (new) width."""
        for i, seg in enumerate(plan.segments):
            had = found[i]
            composes = had.remainder.seam if had is not None and had.remainder is not None else 0
            if had is not None and seg.key is not None and composes != seg.remainder:
                found[i] = CachedSegment(had.entry, self._remainder(seg, had.entry))

    def lookup(self, plan: RequestPlan, kinds: Sequence[str] | None = None) -> list[CachedSegment | None]:
        """Each cached segment's entry, with the remainder its plan composes when that is cached too."""
        out: list[CachedSegment | None] = []
        store = self.segment_store
        for i, seg in enumerate(plan.segments):
            kind = kinds[i] if kinds is not None else None
            entry = store.get(seg.key, seg.ids, kind) if seg.key is not None else None
            out.append(CachedSegment(entry, self._remainder(seg, entry)) if entry is not None else None)
        return out

    def _remainder(self, seg: SegmentPlan, entry: SegmentEntry) -> RemainderEntry | None:
        """The remainder ``seg``'s plan composes: a view of an entry that keeps its tokens, else the store's."""
        if not seg.remainder:
            return None
        derived = entry.derived_remainder(seg.remainder)
        return derived if derived is not None else self.segment_store.get_remainder(seg.key, seg.ids, seg.remainder)

    def fill_steps(
        self, misses: Sequence[tuple[SegmentPlan, CachedSegment | None]], chunk: int | None
    ) -> Generator[Piece, int | None, list[CachedSegment]]:
        """``_fill`` all at once, or under ``chunk`` (continuous batching) one segment a piece."""
        if chunk is None:
            return self.fill(misses)
        made: list[CachedSegment] = []
        for miss in misses:
            yield Piece(len(miss[0].ids))
            made += self.fill([miss])
        return made

    def fill(self, misses: Sequence[tuple[SegmentPlan, CachedSegment | None]]) -> list[CachedSegment]:
        """Prefill the missed segments in isolation, all at once, and store what the cache lacked: the
        entry, or only the remainder where the entry was there (so no seam width evicts another's)."""
        ids, widths = [list(seg.ids) for seg, _ in misses], [seg.record_remainder for seg, _ in misses]
        pool = self.pool
        fresh = pool.prefill(ids, widths) if pool is not None else prefill_isolated(self.model, ids, widths)
        out = []
        for (seg, had), made in zip(misses, fresh, strict=True):
            entry = had.entry if had else self.segment_store.put(seg.key, made.entry)
            # a remainder derived from the entry as stored (so that cold equals warm), else stored beside it
            remainder = entry.derived_remainder(seg.record_remainder)
            if remainder is None and made.remainder is not None:
                remainder = self.segment_store.put_remainder(seg.key, made.remainder)
            out.append(CachedSegment(entry, remainder if seg.remainder else None))
        return out
