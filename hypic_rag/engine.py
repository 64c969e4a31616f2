"""The engine: loads a checkpoint and serves prompts made of segments.

A request goes load → plan → look up → fill misses → assemble → query → decode; each step lives in
its own module (``plan``, ``cache``, ``entries``, ``assembly``, ``decoding``) and the engine only
orchestrates them. The math is in ``hypic_rag.model`` and ``hypic_rag.kernels``.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch

from .assembly import assemble, assemble_fused, fresh_tokens, run_in_context
from .batch import run_batch, started
from .cache import (
    CachedSegment,
    DiskCacheTier,
    PrefixStore,
    RemainderEntry,
    SegmentEntry,
    SegmentStore,
    checkpoint_fingerprint,
    default_cache_dir,
    module_fingerprint,
    segment_key,
)
from .cache.entry import entry_dtype as entry_dtype_of
from .cache.keys import entry_fingerprint
from .cache.lru import ByteLRU
from .cache.remote import RedisTier, check_url
from .cache.validate import EntryLayout
from .chat.caller_text import literal_pieces
from .chat.conversation import ChatSetup, thinking_opened
from .chat.formats.base import NONE, ChatFormat
from .chat.grammar import (
    CALL_FORMATS,
    AnswerShape,
    answer_grammar,
    check_tools,
    no_call_bans,
    schema_as_call,
    tool_signatures,
)
from .chat.segmentation import RenderedPrompt, segment_prompt
from .chat.template import ChatTemplate
from .chat.tool_calls import THINK_CLOSE, chosen_tool, forced_call_prefix, parse_output
from .decoding import Decoder, Generation, Piece, Prefilling, TokenCallback
from .deviation import (
    boundary_deviation,
    deviation_tokens,
    isolated_through,
    probe_layer,
    reading_shares,
    reading_tokens,
    token_deviation,
)
from .entries import prefill_isolated
from .generation_config import GenerationDefaults, eos_token_ids, read_generation_defaults
from .grammar import SPACED, GrammarMask, GrammarTokenizer, json_lark, response_lark
from .hub import resolve_checkpoint
from .inputs import as_list
from .kernels.indices import int64
from .logits import Banned, Penalties, Picker, Sampler
from .model import HybridModel, RequestState, load_model
from .model.loading import default_model_path, resolve_dtype
from .options import ADAPTIVE, AUTO, BLEND, MODES, RequestOptions, check_mode, check_seam
from .outputs import GenerationOutput, RequestStats
from .plan import (
    VARIANTS,
    Prompt,
    RequestPlan,
    SegmentPlan,
    choose_widths,
    plan_request,
    recomputes_every_segment,
    with_widths,
)
from .scheduler import MAX_ACTIVE, MAX_NUM_BATCHED_TOKENS
from .segments import Segment, as_query, check_unicode
from .tokenizer import load_tokenizer

COLD_POLICIES = ("parallel", "exact")

__all__ = [
    "COLD_POLICIES",
    "MODES",
    "Engine",
    "GenerationOutput",
    "Prompt",
    "RequestOptions",
    "default_model_path",
    "resolve_dtype",
]


@dataclass
class Prefilled:
    """A prompt run through the model: next-token logits ``[V]``, the request state after it, its
    stats, and the misses whose entries are made once the first token is out (``deferred``: the exact
    cold policy), each with what the cache had of it."""

    logits: torch.Tensor
    state: RequestState
    stats: RequestStats
    deferred: list[tuple[SegmentPlan, CachedSegment | None]]


def _usable_device(device: str | torch.device) -> torch.device:
    """``device`` parsed, and present on this machine."""
    try:
        out = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device {device!r} is not a torch device: {exc}") from None
    if out.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: this torch build or machine has no CUDA device")
    if out.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device {device!r}: MPS is not available here")
    return out


CACHE_AHEAD_CHUNK = 64  # segments filled, then stored, at a time by ``Engine.cache_segments``


def _whole(overrides: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """``overrides`` of a method that runs its prompt whole, which ``prefill_chunk`` (a keyword of ``start`` and
    ``start_chat``, whose ``Prefilling`` a scheduler advances) cannot reach."""
    if "prefill_chunk" in overrides:
        raise ValueError(f"prefill_chunk is taken by start and start_chat, not by {where}: it runs the prompt whole")
    return overrides


def _json_format(response_format: Mapping[str, Any] | None) -> bool:
    """Whether ``response_format`` asks for JSON, whose answer the grammar steers to close near its budget."""
    return response_format is not None and response_format["type"] in ("json_object", "json_schema")


def _refused(where: str, exc: ValueError) -> ValueError:
    """The grammar compiler's refusal as a ``ValueError`` that begins with the request field ``where``."""
    return ValueError(f"{where}: the grammar cannot hold it: {exc}")


def _compile(tokenizer: GrammarTokenizer, lark: str, where: str) -> None:
    """``tokenizer.matcher(lark)``, its refusal ``_refused``."""
    try:
        tokenizer.matcher(lark)
    except ValueError as exc:
        raise _refused(where, exc) from None


def _chunk(tokens: int | None) -> int | None:
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise ValueError(f"prefill_chunk must be a positive number of tokens, got {tokens!r}")
    return tokens


def _missing(seg: SegmentPlan, found: CachedSegment | None) -> bool:
    """A cacheable segment without its entry, or without the remainder its plan composes."""
    return seg.key is not None and (found is None or (seg.remainder > 0 and found.remainder is None))


T = TypeVar("T")


def drain(steps: Generator[Piece, int | None, T]) -> T:
    """Run a prefill that pauses before each piece to its end, every piece whole; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as stop:
            return stop.value


class Engine:
    """A hybrid model, its tokenizer, and the prompt-serving logic around them."""

    def __init__(
        self,
        model: HybridModel,
        tokenizer: Any = None,
        *,
        eos_token_ids: Sequence[int] = (),
        cache_dir: str | Path | None = None,
        cache_url: str | None = None,
        name: str = "model",
        fingerprint: str | None = None,
        seam: int | float = 8,
        seam_variant: str = "B",
        cold_policy: str = "parallel",
        min_cached_tokens: int = 12,
        memory_bytes: int = 2 << 30,
        disk_bytes: int | None = None,
        generation_defaults: GenerationDefaults | None = None,
        chat_template: ChatTemplate | None = None,
        fuse_forwards: bool = True,
        flush_denormals: bool = True,
        prefill_pool: Any = None,
        fidelity_budget: float | None = None,
        entry_dtype: str | torch.dtype = "float32",
        cache_policy: str = "value",
    ) -> None:
        """``seam`` tokens (or a fraction of each segment) are recomputed at every boundary in
        ``hypic`` mode; ``seam_variant`` is docs/design.md §4's A or B; ``cold_policy`` is how misses are
        filled: ``parallel`` prefills them in isolation at once, ``exact`` in context (and makes
        their entries after the first token); segments under ``min_cached_tokens`` skip the cache
        and run in context (the default 12 is where composing stopped losing to recomputing in the
        fused forward, on CPU with an 8-token seam). ``generation_defaults``
        are the checkpoint's own sampling settings, for requests that leave theirs unset (``generate``
        keeps its fixed defaults); ``chat_template`` is the checkpoint's own, which ``chat`` and ``render`` use;
        ``fuse_forwards`` runs everything a ``pic``/``hypic`` request recomputes in one forward
        (``False``: a forward per stretch and seam, then the query: the reference path);
        ``memory_bytes`` bounds all the engine's in-memory caches together, ``disk_bytes`` the disk tier (default:
        a tenth of the disk's free space, at most 8 GiB);
        ``flush_denormals`` sets ``torch.set_flush_denormal(True)`` for the process: the delta rule's
        long decays leave subnormal floats in its state, and CPU matmuls on them are many times slower;
        values below 1.2e-38 become 0. ``fidelity_budget`` is the default of the request option of that name (the
        deviation estimate past which a composed request widens its seams or runs exactly; None: no guard).
        ``entry_dtype`` (``"float32"``, ``"bfloat16"``, ``"float16"``) is what cache entries are kept in (states,
        operators, KV; compute stays in the model's dtypes), part of their fingerprint; ``cache_policy`` is the
        memory tier's: ``"value"`` admits a segment that needs room only once it recurs and evicts by prefill saved
        per byte, ``"lru"`` keeps the least recently used out (``cache/lru.py``)."""
        if seam_variant not in VARIANTS:
            raise ValueError(f"unknown seam_variant {seam_variant!r}; expected one of {', '.join(VARIANTS)}")
        if cold_policy not in COLD_POLICIES:
            raise ValueError(f"unknown cold_policy {cold_policy!r}; expected one of {', '.join(COLD_POLICIES)}")
        check_seam(seam)
        disk_budget = 1 if disk_bytes is None else disk_bytes  # None: a share of the free space (cache/space.py)
        for option, value, low in (("min_cached_tokens", min_cached_tokens, 0), ("disk_bytes", disk_budget, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{option} must be an integer >= {low}, got {value!r}")
        for option, value in (("fuse_forwards", fuse_forwards), ("flush_denormals", flush_denormals)):
            if not isinstance(value, bool):
                raise ValueError(f"{option} must be True or False, got {value!r}")
        self.model = model
        self.config = model.config
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.generation_defaults = generation_defaults or GenerationDefaults()
        self.chat_setup = ChatSetup.build(chat_template, tokenizer) if chat_template is not None else None
        if cache_dir is not None and "://" in str(cache_dir):  # Path() would fold it into a folder name
            raise ValueError(f"cache_dir is a folder, not {str(cache_dir)!r}: pass a Redis URL as cache_url")
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self.name = name
        self.seam = seam
        self.seam_variant = seam_variant
        self.cold_policy = cold_policy
        self.min_cached_tokens = min_cached_tokens
        self.fuse_forwards = fuse_forwards
        RequestOptions(fidelity_budget=fidelity_budget)  # checked as a request's would be
        self.fidelity_budget = fidelity_budget
        self.prefill_pool = prefill_pool  # ray_prefill.RayPrefill: cold misses prefilled across Ray actors
        if flush_denormals:
            torch.set_flush_denormal(True)
        self.entry_dtype = entry_dtype_of(entry_dtype)
        self.fingerprint = entry_fingerprint(fingerprint or module_fingerprint(model), self.entry_dtype)
        disk = DiskCacheTier(self.cache_dir, disk_bytes) if self.cache_dir is not None else None
        self.cache_url = cache_url
        remote = RedisTier(check_url(cache_url)) if cache_url is not None else None
        # One budget for every in-memory cache of the engine: segments, remainders and prefix nodes.
        self.memory = ByteLRU(memory_bytes, cache_policy)
        layout = EntryLayout.of(model, self.entry_dtype)
        self.segment_store = SegmentStore(
            self.fingerprint,
            self.memory,
            disk,
            device=model.device,
            layout=layout,
            remote=remote,
            entry_dtype=self.entry_dtype,
            model_dtype=model.dtype,
        )
        self.prefix_store = PrefixStore(self.fingerprint, self.memory)
        self._grammar_tokenizers: dict[tuple[int, ...], GrammarTokenizer] = {}

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
        cache_dir: str | Path | None = None,
        cache_url: str | None = None,
        revision: str | None = None,
        prefill_workers: int = 0,
        pack_head: bool = True,
        pack_weights: bool = True,
        **options: Any,
    ) -> Engine:
        """Load a local Hugging Face checkpoint directory, a hub id ``org/name`` (at ``revision``,
        through the local Hugging Face cache), or, for ``None``, the bundled default model.
        ``pack_head=False``: no packed copy of the LM head, ``pack_weights=False`` none of the decoder's
        projections (``model.linear.Linear``: a copy costs the weight's size again in memory and makes CPU fp32
        decode and prefill faster).

        ``cache_dir`` adds a persistent segment tier there, ``cache_url`` (``redis://host:port/db``) a shared
        one that replicas on several machines use together; ``prefill_workers=N`` prefills cold segments on N
        Ray actors (``ray_prefill.py``; the ``ray`` extra); ``options`` go to ``Engine``."""
        if cache_url is not None:
            check_url(cache_url)
        device = _usable_device(device)
        root = resolve_checkpoint(path, revision)
        is_hub = path is not None and root != Path(path).expanduser()
        model = load_model(root, device=device, dtype=resolve_dtype(dtype))
        model.pack_weights(pack_weights, head=pack_head)
        eos = eos_token_ids(root, model.config.eos_token_ids)
        if "generation_defaults" not in options:
            options["generation_defaults"] = read_generation_defaults(root)
        if "chat_template" not in options:
            options["chat_template"] = ChatTemplate.from_checkpoint(root)
        fingerprint = checkpoint_fingerprint(root, default_cache_dir() / "weight-digests.json") + str(model.dtype)
        if prefill_workers:
            from .ray_prefill import RayPrefill

            options["prefill_pool"] = RayPrefill(root, prefill_workers, model.dtype, fingerprint)
        return cls(
            model,
            load_tokenizer(root),
            eos_token_ids=eos,
            cache_dir=cache_dir,
            cache_url=cache_url,
            name=str(path) if is_hub else root.name,
            fingerprint=fingerprint,
            **options,
        )

    # -- text ---------------------------------------------------------------------------------

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"checkpoint {self.name!r} has no tokenizer files; pass token ids instead of text")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        check_unicode(text, "text")
        return list(self._require_tokenizer().encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._require_tokenizer().decode(list(ids), skip_special_tokens=True)

    def segment_ids(self, segment: Segment) -> list[int]:
        ids = list(segment.token_ids) if segment.token_ids is not None else self.encode(segment.text or "")
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    def _segments_ids(self, segments: Sequence[Segment]) -> list[list[int]]:
        """Each segment's ids, tokenized on its own; none may be empty."""
        if isinstance(segments, Segment) or not all(isinstance(s, Segment) for s in segments):
            raise ValueError("segments must be a list of Segment")
        seg_ids = [self.segment_ids(s) for s in segments]
        empty = [i for i, ids in enumerate(seg_ids) if not ids]
        if empty:
            raise ValueError(f"segment {empty[0]} tokenizes to no tokens")
        return seg_ids

    def build_prompt(self, segments: Sequence[Segment], query: str | Segment) -> Prompt:
        """Tokenize each segment on its own; reject prompts the model cannot take."""
        segments = as_list(segments, "segments", "Segment", Segment)
        seg_ids = self._segments_ids(segments)
        query_ids = self.segment_ids(as_query(query))
        prompt = Prompt(seg_ids, query_ids, tuple(s.cache for s in segments), tuple(s.kind for s in segments))
        n = len(prompt.ids)
        if n == 0:
            raise ValueError("the prompt is empty: give at least one segment or a non-empty query")
        if not query_ids:
            raise ValueError("the query tokenizes to no tokens")
        self._check_context(n)
        return prompt

    def _check_context(self, tokens: int) -> None:
        if tokens > self.config.max_position_embeddings:
            raise ValueError(
                f"prompt of {tokens} tokens is past the model's context of {self.config.max_position_embeddings}"
            )

    # -- one request ------------------------------------------------------------------------------

    def plan(self, prompt: Prompt, mode: str = "hypic", seam: int | float | None = None) -> RequestPlan:
        """How a composed request (``pic`` or ``hypic``) will serve each segment of ``prompt``."""
        check_mode(mode)
        seam = 0 if mode == "pic" else self.seam if seam is None else seam
        return plan_request(
            prompt,
            seam=seam,
            default_seam=self.seam,
            variant=self.seam_variant,
            min_cached_tokens=self.min_cached_tokens,
            key=lambda ids: segment_key(ids, self.fingerprint, self.model.dtype),
        )

    def _prefill(
        self, prompt: Prompt, mode: str, seam: int | float | str | None, options: RequestOptions | None = None
    ) -> Prefilled:
        return drain(self._prefill_chunks(prompt, mode, seam, None, options))

    @torch.inference_mode()
    def _prefill_chunks(
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
        done = yield from self._prefill_mode(prompt, mode, seam, chunk, options or RequestOptions())
        after = self.segment_store.counters
        counted = ("memory_hits", "disk_hits", "remote_hits", "corrupt", "tier_errors")
        done.stats.store_counters = {k: after[k] - before[k] for k in counted}
        return done

    def _prefill_mode(
        self, prompt: Prompt, mode: str, seam: int | float | str | None, chunk: int | None, options: RequestOptions
    ) -> Generator[Piece, int | None, Prefilled]:
        state = self.model.new_state()
        stats = RequestStats.uncached(mode, len(prompt.ids), len(prompt.segments))
        if mode in ("pic", "hypic"):
            plan = self.plan(prompt, mode, seam)
            logits, deferred = yield from self._prefill_composed(plan, state, stats, chunk, options, prompt.kinds)
            if logits is not None:
                return Prefilled(logits, state, stats, deferred)
            state = self.model.new_state()  # the guard chose to compute it exactly, as ``full`` does
            stats.recomputed_tokens, stats.cached_tokens = len(prompt.ids) + stats.filled_tokens, 0
            logits = yield from self._in_context(prompt.ids, state, chunk)
            return Prefilled(logits, state, stats, deferred)
        last: Sequence[int] = prompt.ids  # full: the whole prompt in context
        if mode == "prefix":
            yield from self._prefill_prefix(prompt, state, stats, chunk)
            last = prompt.query
        logits = yield from self._in_context(last, state, chunk)
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
        return self._last_logits(last, state)

    def _last_logits(self, ids: Sequence[int], state: RequestState) -> torch.Tensor:
        """Run ``ids`` after ``state``; the next-token logits ``[V]``."""
        tensor = int64(ids, self.model.device)[None]
        return self.model(tensor, state=state, logits_to_keep=1)[0, -1].float()

    def _prefill_prefix(
        self, prompt: Prompt, state: RequestState, stats: RequestStats, chunk: int | None
    ) -> Generator[Piece, int | None, None]:
        keys = self.prefix_store.chain_keys(prompt.segments)
        depth = self.prefix_store.longest(keys)
        if depth:
            self.prefix_store.restore(keys[:depth], state)
        for key, ids in zip(keys[depth:], prompt.segments[depth:], strict=True):
            start, at = state.seq_len, 0
            while at < len(ids):
                take = len(ids) - at
                if chunk is not None:
                    piece = Piece(min(take, chunk), splittable=True)
                    take = piece.runs((yield piece))
                run_in_context(self.model, state, ids[at : at + take])
                at += take
            self.prefix_store.snapshot(key, state, start)
        stats.hit_segments, stats.miss_segments = depth, len(keys) - depth
        stats.recomputed_tokens = len(prompt.ids) - sum(len(ids) for ids in prompt.segments[:depth])
        stats.cached_tokens = sum(len(ids) for ids in prompt.segments[:depth])

    def _prefill_composed(
        self,
        plan: RequestPlan,
        state: RequestState,
        stats: RequestStats,
        chunk: int | None,
        options: RequestOptions,
        kinds: Sequence[str] | None = None,
    ) -> Generator[Piece, int | None, tuple[torch.Tensor | None, list[tuple[SegmentPlan, CachedSegment | None]]]]:
        """Look up, fill the misses (now, or after the first token under the exact policy), assemble and run
        the query: the next-token logits and the misses whose filling is deferred. An ``auto`` seam or a
        fidelity budget probes the boundaries first (``_guard``); logits None: the guard wants it computed
        exactly, and the misses are still filled after its first token, so the cache learns them."""
        stats.memory_segments = sum(seg.key is not None and seg.key in self.segment_store for seg in plan.segments)
        found = self._lookup(plan, kinds)
        budget = options.fidelity_budget if options.fidelity_budget is not None else self.fidelity_budget
        prefilled: list[int] = []  # misses the guard filled before its probes (auto)
        filled = 0  # tokens run in isolation to make entries; the guard's fills count whatever it chose
        if plan.seam in ADAPTIVE or budget is not None:
            guarded = yield from self._guard(plan, found, stats, options.seam_budget, budget, chunk, prefilled)
            filled = sum(len(plan.segments[i].ids) for i in prefilled)
            if guarded is None:
                stats.filled_tokens = filled
                return None, [(seg, found[i]) for i, seg in enumerate(plan.segments) if _missing(seg, found[i])]
            plan = guarded
        missed = [i for i, seg in enumerate(plan.segments) if _missing(seg, found[i])]
        deferred = [(plan.segments[i], found[i]) for i in missed]
        made_here = set(missed).union(prefilled)  # not held before the request
        hits = sum(f is not None and i not in made_here for i, f in enumerate(found))
        stats.cached_tokens = sum(
            len(seg.ids) - seg.seam
            for i, (seg, f) in enumerate(zip(plan.segments, found, strict=True))
            if f is not None and i not in made_here and not seg.in_context
        )
        if deferred and self.cold_policy == "parallel":
            made = yield from self._fill_steps(deferred, chunk)
            for i, entry in zip(missed, made, strict=True):
                found[i] = entry
            # a segment the guard filled whose remainder it lacked is filled again: both count
            filled += sum(len(seg.ids) for seg, _ in deferred)
            deferred = []
        for i in missed if deferred else ():  # exact policy: the misses run in context
            found[i] = None
        stats.hit_segments, stats.miss_segments = hits, len(plan.segments) - hits
        if chunk is not None:
            yield Piece(fresh_tokens(plan, found))  # the seams, what runs in context and the query, one forward
        if self.fuse_forwards:
            logits, ran = assemble_fused(self.model, state, plan, found)
        else:
            ran = assemble(self.model, state, plan, found) + len(plan.query)
            logits = self._last_logits(plan.query, state)
        stats.recomputed_tokens, stats.filled_tokens = filled + ran, filled
        held = zip(plan.segments, found, strict=True)
        stats.cache_bytes = sum(self.segment_store.held_nbytes(seg.key, f) for seg, f in held if f and seg.key)
        stats.seam, stats.seam_variant, stats.cold_policy = plan.seam, plan.variant, self.cold_policy
        return logits, deferred

    def _guard(
        self,
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
        layer, blend, auto = probe_layer(self.model), plan.seam == BLEND, plan.seam == AUTO
        probed, isolated = yield from self._probe_cold(plan, found, chunk, prefilled)
        if chunk is not None and (cost := deviation_tokens(self.model, plan, probed, blend)):
            yield Piece(cost)
        if blend:
            dev = token_deviation(self.model, plan, probed)
        else:
            dev = boundary_deviation(self.model, plan, probed, query=False)
        bounds = sorted(dev.per_boundary)
        # where the answer reads: only ``auto`` spends by it, and not where its budget recomputes every segment
        lengths = [len(plan.segments[i].ids) for i in bounds]
        whole = recomputes_every_segment(seam_budget, lengths)
        reading = None
        if auto and bounds and not whole:
            if chunk is not None and (cost := reading_tokens(self.model, plan, found)):
                yield Piece(cost)
            reading = reading_shares(self.model, plan, found)
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
        stats.probe_cost = dev.probe_tokens * probed_layers / self.model.config.num_hidden_layers + read_tokens
        stats.seam, stats.seam_variant, stats.cold_policy = plan.seam, plan.variant, self.cold_policy
        if action == "exact":
            return None
        plan = with_widths(plan, dict(zip(bounds, widths, strict=True)))
        self._find_remainders(plan, found)
        stats.seam_widths = [seg.seam for seg in plan.segments]
        return plan

    def _probe_cold(
        self,
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
        layer, blend = probe_layer(self.model), plan.seam == BLEND
        probed, isolated = list(found), 0
        if layer is None or self.cold_policy != "parallel":
            return probed, isolated
        # cold segments the probe reads (boundaries) or jumps over, as a warm request's probe does (not blend's)
        reads = plan.boundaries if blend else range(len(found))
        cold = [i for i in reads if plan.segments[i].key is not None and found[i] is None]
        if plan.seam == AUTO and cold:
            made = yield from self._fill_steps([(plan.segments[i], None) for i in cold], chunk)
            for i, entry in zip(cold, made, strict=True):
                found[i] = probed[i] = entry
            prefilled += cold
            return probed, isolated
        for i in cold:
            if chunk is not None:
                yield Piece(len(plan.segments[i].ids))
            probed[i] = isolated_through(self.model, plan.segments[i].ids, layer)
            isolated += len(plan.segments[i].ids)
        return probed, isolated

    def _find_remainders(self, plan: RequestPlan, found: list[CachedSegment | None]) -> None:
        """``found`` gets the remainder each cached segment of ``plan`` composes at its (new) width."""
        for i, seg in enumerate(plan.segments):
            had = found[i]
            composes = had.remainder.seam if had is not None and had.remainder is not None else 0
            if had is not None and seg.key is not None and composes != seg.remainder:
                found[i] = CachedSegment(had.entry, self._remainder(seg, had.entry))

    def _lookup(self, plan: RequestPlan, kinds: Sequence[str] | None = None) -> list[CachedSegment | None]:
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

    def _fill_steps(
        self, misses: Sequence[tuple[SegmentPlan, CachedSegment | None]], chunk: int | None
    ) -> Generator[Piece, int | None, list[CachedSegment]]:
        """``_fill`` all at once, or under ``chunk`` (continuous batching) one segment a piece."""
        if chunk is None:
            return self._fill(misses)
        made: list[CachedSegment] = []
        for miss in misses:
            yield Piece(len(miss[0].ids))
            made += self._fill([miss])
        return made

    def _fill(self, misses: Sequence[tuple[SegmentPlan, CachedSegment | None]]) -> list[CachedSegment]:
        """Prefill the missed segments in isolation, all at once, and store what the cache lacked: the
        entry, or only the remainder where the entry was there (so no seam width evicts another's)."""
        ids, widths = [list(seg.ids) for seg, _ in misses], [seg.record_remainder for seg, _ in misses]
        pool = self.prefill_pool
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

    @torch.inference_mode()
    def cache_segments(
        self,
        segments: Sequence[Segment],
        seam: int | float | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> int:
        """Compute and store each segment as a ``hypic`` request with this ``seam`` that met it cold would,
        before any request does: a corpus cached when it is indexed makes even the first question about it
        warm, in any order. Only ``hypic`` and ``pic`` read these entries. The number computed (cached or
        too short ones are skipped). Misses are filled ``CACHE_AHEAD_CHUNK`` at a time, each chunk stored
        before the next is computed, so a large corpus never holds more than a chunk of fresh entries;
        ``progress(done, total)`` is called after each."""
        segments = as_list(segments, "segments", "Segment", Segment)
        ids = self._segments_ids(segments)
        plan = self.plan(Prompt(ids, [], tuple(s.cache for s in segments)), "hypic", seam)
        # any of them may follow another in a request, so each needs the remainder a seam leaves (the plan
        # gives the prompt's first none)
        plan = replace(plan, segments=[replace(seg, remainder=seg.record_remainder) for seg in plan.segments])
        misses, seen = [], set()
        for seg, found in zip(plan.segments, self._lookup(plan), strict=True):  # not requests: no hit ratio
            if _missing(seg, found) and seg.key not in seen:
                misses.append((seg, found))
                seen.add(seg.key)
        for start in range(0, len(misses), CACHE_AHEAD_CHUNK):
            self._fill(misses[start : start + CACHE_AHEAD_CHUNK])
            if progress is not None:
                progress(min(start + CACHE_AHEAD_CHUNK, len(misses)), len(misses))
        return len(misses)

    def clear_cache(self) -> None:
        """Forget every cached segment and prefix, on disk too."""
        self.segment_store.clear()
        self.prefix_store.clear()

    # -- public requests --------------------------------------------------------------------------

    def prefill(
        self,
        segments: Sequence[Segment],
        query: str | Segment,
        *,
        mode: str = "hypic",
        seam: int | float | None = None,
    ) -> tuple[torch.Tensor, RequestState]:
        """The next-token logits ``[V]`` and the request state after the prompt, to continue from."""
        check_mode(mode)
        done = self._prefill(self.build_prompt(segments, query), mode, seam)
        self._fill(done.deferred)
        return done.logits, done.state

    def prompt_logits(
        self,
        segments: Sequence[Segment],
        query: str | Segment,
        *,
        mode: str = "hypic",
        seam: int | float | None = None,
    ) -> torch.Tensor:
        """Next-token logits ``[V]`` at the end of the prompt."""
        return self.prefill(segments, query, mode=mode, seam=seam)[0]

    def generate(
        self,
        segments: Sequence[Segment],
        query: str | Segment,
        options: RequestOptions | None = None,
        *,
        on_token: TokenCallback | None = None,
        **overrides: Any,
    ) -> GenerationOutput:
        """Answer a prompt of segments and a query.

        ``options`` (a ``RequestOptions``) and keyword arguments naming its fields (``mode=``,
        ``max_new_tokens=``, ``temperature=``, ``seam=``, ...; the keywords win) set the request; unset sampling
        settings are greedy and 64 tokens, whatever the checkpoint's ``generation_config.json`` says.

        Stops at ``max_new_tokens``, at an EOS or stop id (not included in the output), at a ``stop`` string (the
        text is cut before it), or at the model's context. ``on_token(id, text_delta)`` streams each token as it is
        chosen (``decoding.FLUSH`` ends held-back text).
        """
        return self.start(segments, query, options, on_token=on_token, **_whole(overrides, "generate")).run()

    def start(
        self,
        segments: Sequence[Segment],
        query: str | Segment,
        options: RequestOptions | None = None,
        *,
        on_token: TokenCallback | None = None,
        cancelled: Callable[[], bool] | None = None,
        prefill_chunk: int | None = None,
        **overrides: Any,
    ) -> Generation | Prefilling:
        """``generate`` up to its first token: the rest is decoded by ``step``/``run`` on the result, so
        that a server can interleave requests; ``cancelled()`` is asked before each further token. With
        ``prefill_chunk``, a ``Prefilling`` that runs the prompt a ``Piece`` at a time (in-context tokens at most
        that many a piece; for the composed modes a cold segment, a probe, then the fused forward) and then holds
        the ``Generation``."""
        options = RequestOptions.from_mapping(overrides, base=options)
        chat_only = options.chat_only()
        if chat_only:
            raise ValueError(f"{', '.join(chat_only)} apply to chat requests (Engine.chat), not to segments")
        prompt = self.build_prompt(segments, query)
        grammar = "start: " + response_lark(options.response_format, SPACED) if options.response_format else None
        chunk = _chunk(prefill_chunk)
        closing = _json_format(options.response_format)
        return self._start(
            prompt, options.with_defaults(None), (), on_token, cancelled, grammar=grammar, chunk=chunk, closing=closing
        )

    def check_start(self, options: RequestOptions) -> None:
        """``check_chat`` for ``start``: compile the grammar of the request's ``response_format``, if any, so that
        one the grammar cannot hold is a ``ValueError`` before the request is admitted."""
        if options.response_format is not None:
            lark = "start: " + response_lark(options.response_format, SPACED)
            _compile(self.grammar_tokenizer(), lark, "response_format")

    def _start(
        self,
        prompt: Prompt,
        options: RequestOptions,
        stop_ids: Sequence[int],
        on_token: TokenCallback | None,
        cancelled: Callable[[], bool] | None,
        finalize: Callable[[GenerationOutput], GenerationOutput] | None = None,
        grammar: str | None = None,
        forced_ids: Sequence[int] = (),
        chunk: int | None = None,
        banned: Banned | None = None,
        closing: bool = False,
    ) -> Generation | Prefilling:
        """Prefill ``prompt`` and choose its first token, under ``options`` with their defaults filled; the
        request also stops at ``stop_ids`` (the template's end of turn) and every EOS id. ``grammar`` (Lark,
        ``hypic_rag.grammar``) masks every token chosen; ``forced_ids`` are the tokens of it the prompt already
        ends with (a forced call's opening). With ``chunk``, nothing runs yet: the ``Prefilling`` returned runs
        the prompt a chunk at a time (``_prefill_chunks``)."""
        if options.stop and self.tokenizer is None:
            raise ValueError(f"checkpoint {self.name!r} has no tokenizer files; stop strings need one")
        sampler = Sampler.of(options)
        generator = sampler.generator(self.model.device)
        stops = set(self.eos_token_ids) | set(stop_ids) | set(options.stop_token_ids or ())
        mask = None
        if grammar is not None:  # built before the prompt runs, so that a schema it rejects costs no prefill
            tokenizer = self.grammar_tokenizer(stop_ids)
            budget = options.max_new_tokens if closing else None
            mask = GrammarMask(tokenizer, grammar, also_stop=options.stop_token_ids or (), budget=budget)
            mask.force(forced_ids)
            stops |= set(tokenizer.stop_ids)  # a finished answer may end at any of them
        picker = Picker(
            sampler,
            generator,
            penalties=Penalties.of(options),
            mask=mask,
            prompt_ids=prompt.ids,
            logprobs=(options.top_logprobs or 0) if options.logprobs else None,
            banned=banned,
        )

        detokenize = self.decode if self.tokenizer is not None else None
        assert options.max_new_tokens is not None  # with_defaults filled it
        max_new_tokens = options.max_new_tokens

        def steps() -> Generator[Piece, int | None, Generation]:
            begin = time.perf_counter()
            done = yield from self._prefill_chunks(prompt, options.mode, options.seam, chunk, options)
            first = picker.pick(done.logits)
            ttft = time.perf_counter() - begin
            # the exact policy's misses are filled once the first token is out (``Generation.fill``)
            fill = functools.partial(self._fill, done.deferred) if done.deferred else None
            decoder = Decoder(
                self.model,
                done.state,
                first,
                sampler,
                generator,
                stops=stops,
                max_new_tokens=max_new_tokens,
                on_token=on_token,
                detokenize=detokenize,
                stop_strings=list(options.stop or ()),
                cancelled=cancelled,
                picker=picker,
            )
            filling = sum(len(seg.ids) for seg, _ in done.deferred)
            return Generation(decoder, done.stats, ttft, done.logits, finalize, fill, filling)

        return drain(steps()) if chunk is None else Prefilling(steps())

    def run_together(
        self, runs: Sequence[Generation], *, max_active: int = MAX_ACTIVE, return_exceptions: bool = False
    ) -> list[GenerationOutput]:
        """Decode started requests (``start``, ``start_chat``) to their ends, at most ``max_active`` in one forward
        a step (``decoding.step_together``); each output the one the request gets alone, up to the rounding of a
        batched matmul, in ``runs``' order. A request's failure is its own (``batch.run_batch``)."""
        return run_batch(
            [started(run) for run in runs],
            max_active=max_active,
            max_num_batched_tokens=max(MAX_NUM_BATCHED_TOKENS, max_active),
            return_exceptions=return_exceptions,
        )

    def generate_batch(
        self,
        prompts: Sequence[tuple[Sequence[Segment], str | Segment]],
        options: RequestOptions | None = None,
        *,
        max_active: int = MAX_ACTIVE,
        max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
        return_exceptions: bool = False,
        **overrides: Any,
    ) -> list[GenerationOutput]:
        """``generate`` for each ``(segments, query)`` under the same options, decoded together on one scheduler
        (``batch.run_batch``): prompts run first come first served under the token budget, each finding the
        segments the ones before it cached, and at most ``max_active`` answers decode in one forward a step. A
        request that fails fails alone: its slot holds the exception with ``return_exceptions``, otherwise a
        ``BatchError`` carrying every other output is raised once the batch is done."""
        prompts = as_list(prompts, "prompts", "(segments, query) pairs")
        overrides = _whole(overrides, "generate_batch")
        begins = [functools.partial(self.start, segments, query, options, **overrides) for segments, query in prompts]
        return run_batch(
            begins,
            max_active=max_active,
            max_num_batched_tokens=max_num_batched_tokens,
            return_exceptions=return_exceptions,
        )

    def chat_batch(
        self,
        conversations: Sequence[Sequence[Mapping[str, Any]]],
        options: RequestOptions | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        max_active: int = MAX_ACTIVE,
        max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
        return_exceptions: bool = False,
        **overrides: Any,
    ) -> list[GenerationOutput]:
        """``chat`` for each conversation under the same options and tools, decoded together as
        ``generate_batch`` does (its docstring has the budget and what a failure does)."""
        conversations = as_list(conversations, "conversations", "lists of messages")
        overrides = _whole(overrides, "chat_batch")
        chat = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls, **overrides}
        begins = [functools.partial(self.start_chat, messages, options, **chat) for messages in conversations]
        return run_batch(
            begins,
            max_active=max_active,
            max_num_batched_tokens=max_num_batched_tokens,
            return_exceptions=return_exceptions,
        )

    def grammar_tokenizer(self, stop_ids: Sequence[int] = ()) -> GrammarTokenizer:
        """The tokenizer as the output grammar reads it, with every EOS id and ``stop_ids`` as the ends of a
        finished answer; made once per set of ends (it walks the vocabulary)."""
        ends = tuple(sorted(set(self.eos_token_ids) | set(stop_ids)))
        if ends not in self._grammar_tokenizers:
            tokenizer = self._require_tokenizer()
            self._grammar_tokenizers[ends] = GrammarTokenizer(tokenizer, self.config.vocab_size, ends)
        return self._grammar_tokenizers[ends]

    # -- chat ---------------------------------------------------------------------------------------

    @property
    def chat_format(self) -> ChatFormat:
        """The chat format of the checkpoint's template (``NONE`` without one): what writes a framework's messages
        as its model reads them (``ChatFormat.prepare_messages``), for the integrations, the server and the eval
        harness alike."""
        return self.chat_setup.format if self.chat_setup is not None else NONE

    def _require_chat(self) -> ChatSetup:
        if self.chat_setup is None:
            raise ValueError(f"checkpoint {self.name!r} has no chat template; use generate() with segments")
        self._require_tokenizer()
        return self.chat_setup

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        segmentation: str = "auto",
    ) -> RenderedPrompt:
        """The checkpoint's template applied to ``messages`` (the text transformers' ``apply_chat_template``
        gives), cut into segments (``chat.segmentation``), with the prompt's token ids."""
        return self._render(messages, tools, chat_template_kwargs, segmentation)[0]

    def _render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        chat_template_kwargs: Mapping[str, Any] | None,
        segmentation: str,
    ) -> tuple[RenderedPrompt, Prompt]:
        """The rendered prompt and its tokenized form, tokenized once for both."""
        setup = self._require_chat()
        rendered = segment_prompt(
            setup.template,
            messages,
            tools=tools,
            chat_template_kwargs=chat_template_kwargs,
            segmentation=segmentation,
        )
        segments, query = literal_pieces(self.tokenizer, setup.template, rendered, tools, chat_template_kwargs)
        prompt = self.build_prompt(segments, query)
        return replace(rendered, token_ids=prompt.ids), prompt

    def _force_call(
        self, rendered: RenderedPrompt, prompt: Prompt, force_call: str | None, thinking: bool, structured: bool = False
    ) -> tuple[RenderedPrompt, Prompt, list[int]]:
        """``force_call`` (``"required"`` or a tool's name) ends the prompt with the opening of a call
        (``answer_prefix``), after closing the reasoning block the template opened (``thinking``), which a
        ``structured`` answer (a response format) closes too; also the opening's tokens."""
        opening = forced_call_prefix(self._require_chat().format, force_call)
        close = THINK_CLOSE + "\n\n" if thinking and (opening or structured) else ""
        if not opening and not close:
            return rendered, prompt, []
        # Tokenized on its own, as the model writes it after the prompt: across the boundary BPE would merge
        # it with the generation prompt into tokens the model never produced there.
        opening_ids = self.encode(opening) if opening else []
        prompt = replace(prompt, query=prompt.query + (self.encode(close) if close else []) + opening_ids)
        self._check_context(len(prompt.ids))
        forced = close + opening
        rendered = replace(rendered, text=rendered.text + forced, answer_prefix=forced, token_ids=prompt.ids)
        return rendered, prompt, opening_ids

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RequestOptions | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        on_token: TokenCallback | None = None,
        **overrides: Any,
    ) -> GenerationOutput:
        """Answer OpenAI-style ``messages`` with the checkpoint's own template: its documents, tool schemas
        and turns served as cached segments, stopping at every EOS id and the template's end-of-turn token;
        ``text`` is the answer, with the reasoning and the tool calls (parsed in the template's own format)
        split off.

        ``options`` (a ``RequestOptions``) and keyword arguments naming its fields (``mode=``,
        ``max_new_tokens=``, ``segmentation=``, ``chat_template_kwargs=``, ...; the keywords win) set the
        request; sampling settings left unset are ``generation_config.json``'s, else greedy and 64 tokens.

        ``tool_choice`` is OpenAI's: ``"none"`` renders the prompt without the tools; ``"required"`` and a
        named function (``{"type": "function", "function": {"name": ...}}``) make the answer a call (of that
        function), ``"auto"`` content or calls; either way only offered tools are called, with arguments valid
        under their schemas, as the output grammar (``chat.grammar``) holds every token to the template's call
        format. ``parallel_tool_calls=False`` allows one call per answer. ``response_format`` (an option) holds
        the content to JSON, a JSON schema, a regex or a choice."""
        run = self.start_chat(
            messages,
            options,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            on_token=on_token,
            **_whole(overrides, "chat"),
        )
        return run.run()

    def start_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RequestOptions | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        on_token: TokenCallback | None = None,
        cancelled: Callable[[], bool] | None = None,
        prefill_chunk: int | None = None,
        **overrides: Any,
    ) -> Generation | Prefilling:
        """``chat`` up to its first token (see ``start``, and its ``prefill_chunk``); ``output()`` of the finished
        result is ``chat``'s.
        A forced call opening (``tool_choice``) is not streamed through ``on_token``; it is in the parsed
        output."""
        options = RequestOptions.from_mapping(overrides, base=options).with_defaults(self.generation_defaults)
        setup = self._require_chat()
        shape, choice = self._answer_shape(tools, tool_choice, parallel_tool_calls, options)
        tools = shape.tools
        rendered, prompt = self._render(messages, tools, options.chat_template_kwargs, options.segmentation)
        thinking = thinking_opened(rendered.text)
        structured = shape.response_format is not None
        rendered, prompt, opening_ids = self._force_call(rendered, prompt, shape.choice, thinking, structured)
        forced = rendered.answer_prefix
        # The reasoning the template opened is closed before a forced call or a formatted answer; an answer whose
        # grammar leaves no room for reasoning is parsed without looking for one.
        closed = thinking and bool(forced)
        forced_choice = shape.choice not in (None, "auto", "none")
        free_reasoning = not (closed or structured or forced_choice)
        grammar = None
        if tools or structured or setup.format.name in CALL_FORMATS:
            grammar = self._answer_lark(shape, parallel_tool_calls, thinking and not closed)
        free_reasoning = free_reasoning or grammar is None
        offered = bool(tool_signatures(tools)) and shape.choice != "none"
        banned = None
        if not offered and grammar is None:
            bans = no_call_bans(setup.format, self.grammar_tokenizer(setup.end_of_turn_ids))
            banned = Banned(*bans) if bans is not None and any(bans) else None
        # Call ids hash the prompt too, so a call repeated later in a conversation gets a new id.
        seed_text = hashlib.sha256(rendered.text.encode()).hexdigest()[:16]

        def finalize(out: GenerationOutput) -> GenerationOutput:
            written = forced + (out.text or "")
            if not free_reasoning:
                written = written.removeprefix(THINK_CLOSE + "\n\n") if closed else written
            parsed = parse_output(
                written,
                setup.format,
                tools,
                thinking_open=thinking,
                id_seed=seed_text,
                reasoning=free_reasoning,
                calls=offered,
            )
            content, calls = shape.unwrap(parsed.content, parsed.tool_calls)
            return replace(out, text=content, tool_calls=calls, reasoning=parsed.reasoning)

        ends = setup.end_of_turn_ids
        run = self._start(
            prompt,
            options,
            ends,
            on_token,
            cancelled,
            finalize,
            grammar=grammar,
            forced_ids=opening_ids,
            chunk=_chunk(prefill_chunk),
            banned=banned,
            closing=forced_choice or _json_format(shape.response_format),
        )
        run.thinking_open, run.answer_prefix = thinking, forced
        return run

    def _answer_shape(
        self,
        tools: Sequence[Mapping[str, Any]] | None,
        tool_choice: str | Mapping[str, Any] | None,
        parallel_tool_calls: bool,
        options: RequestOptions,
    ) -> tuple[AnswerShape, str | None]:
        """The request's tools, tool choice and response format checked and as the model is asked for them
        (``schema_as_call``), and the tool choice as asked."""
        setup = self._require_chat()
        tools = as_list(tools, "tools", "tool schemas (dicts)") if tools is not None else None
        check_tools(tools)
        choice = chosen_tool(tool_choice, tools)
        if not isinstance(parallel_tool_calls, bool):
            raise ValueError(f"parallel_tool_calls must be true or false, got {parallel_tool_calls!r}")
        return schema_as_call(setup.format, tools, choice, options.response_format), choice

    def _answer_lark(self, shape: AnswerShape, parallel: bool, thinking: bool) -> str | None:
        """The answer's grammar (``chat.grammar.answer_grammar``), or None when nothing constrains it."""
        setup = self._require_chat()
        return answer_grammar(
            setup.format,
            self.grammar_tokenizer(setup.end_of_turn_ids),
            tools=shape.tools,
            choice=shape.choice,
            parallel=parallel,
            response_format=shape.response_format,
            thinking=thinking,
        )

    def check_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RequestOptions | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = True,
    ) -> None:
        """Compile the grammar ``start_chat`` would hold this request's answer to, so that a schema or pattern it
        cannot hold is a ``ValueError`` naming the field (``response_format`` or ``tools.N.function.parameters``)
        before the request is admitted, and the compiled grammar is kept for ``start_chat``. Runs no model and
        touches no cache, so a server calls it off the engine thread."""
        options = (options or RequestOptions()).with_defaults(self.generation_defaults)
        setup = self._require_chat()
        shape, choice = self._answer_shape(tools, tool_choice, parallel_tool_calls, options)
        if options.response_format is None and not (tools and choice != "none"):
            return  # nothing the request wrote to compile
        rendered = segment_prompt(
            setup.template,
            messages,
            tools=shape.tools,
            chat_template_kwargs=options.chat_template_kwargs,
            segmentation=options.segmentation,
        )
        thinking = thinking_opened(rendered.text)
        closed = bool(forced_call_prefix(setup.format, shape.choice)) or shape.response_format is not None
        lark = self._answer_lark(shape, parallel_tool_calls, thinking and not closed)
        if lark is None:
            return
        tokenizer = self.grammar_tokenizer(setup.end_of_turn_ids)
        try:
            tokenizer.matcher(lark)
        except ValueError as exc:
            # Which field: each piece on its own (only on this failing path, so a good request compiles once).
            if options.response_format is not None:
                _compile(tokenizer, "start: " + response_lark(options.response_format, SPACED), "response_format")
            for i, (_, schema) in enumerate(tool_signatures(tools if choice != "none" else None)):
                _compile(tokenizer, "start: " + json_lark(schema), f"tools.{i}.function.parameters")
            raise _refused("tools" if tools and choice != "none" else "response_format", exc) from None
