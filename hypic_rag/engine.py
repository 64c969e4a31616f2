"""The engine: loads a checkpoint and serves prompts made of segments.

It orchestrates (plan, look up, prefill cold segments, compose, recompute seams, run the query,
decode) and leaves the math to ``hypic_rag.model`` and ``hypic_rag.kernels``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .assembly import VARIANTS, install_segment, resolve_seam
from .cache import DiskCacheTier, SegmentEntry, SegmentStore, checkpoint_fingerprint, module_fingerprint, segment_key
from .cache.prefix import PrefixCache
from .decoding import Sampler
from .model import HybridCache, HybridModel, load_model
from .prefill import prefill_isolated
from .segments import Segment, as_query
from .tokenizer import eos_token_ids, load_tokenizer

MODES = ("full", "prefix", "pic", "hypic")
COLD_POLICIES = ("parallel", "exact")

TokenCallback = Callable[[int, "str | None"], None]

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def default_model_path() -> Path:
    """The checkpoint bundled inside the package."""
    return Path(__file__).resolve().parent / "assets" / "default_model"


@dataclass
class GenerationOutput:
    text: str | None
    token_ids: list[int]
    ttft_s: float
    stats: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "length"
    prompt_logits: torch.Tensor | None = None  # next-token logits [V] at the end of the prompt


@dataclass
class Prompt:
    """A prompt's token ids, segment by segment; the query comes last."""

    segments: list[list[int]]
    query: list[int]

    @property
    def ids(self) -> list[int]:
        return [i for seg in self.segments for i in seg] + self.query


class Engine:
    """A hybrid model, its tokenizer, and the prompt-serving logic around them."""

    def __init__(
        self,
        model: HybridModel,
        tokenizer: Any = None,
        *,
        eos_token_ids: Sequence[int] = (),
        cache_dir: str | Path | None = None,
        name: str = "model",
        fingerprint: str | None = None,
        seam: int | float = 8,
        seam_variant: str = "B",
        cold_policy: str = "parallel",
        min_cached_tokens: int = 48,
        memory_bytes: int = 2 << 30,
    ) -> None:
        """``seam`` tokens (or a fraction of each segment) are recomputed at every boundary in
        ``hypic`` mode; ``seam_variant`` is HYPIC.md §4's A or B; ``cold_policy`` is how misses are
        filled: ``parallel`` prefills them in isolation at once, ``exact`` in context (and makes
        their entries after the first token); segments under ``min_cached_tokens`` skip the cache
        and run in context (the default 48 is where composing began to beat recomputing, measured
        on CPU with an 8-token seam; see the README)."""
        if seam_variant not in VARIANTS:
            raise ValueError(f"unknown seam_variant {seam_variant!r}; expected one of {', '.join(VARIANTS)}")
        if cold_policy not in COLD_POLICIES:
            raise ValueError(f"unknown cold_policy {cold_policy!r}; expected one of {', '.join(COLD_POLICIES)}")
        resolve_seam(seam, 1)
        self.model = model
        self.config = model.config
        self.tokenizer = tokenizer
        self.eos_token_ids = tuple(eos_token_ids)
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self.name = name
        self.seam = seam
        self.seam_variant = seam_variant
        self.cold_policy = cold_policy
        self.min_cached_tokens = min_cached_tokens
        self.fingerprint = fingerprint or module_fingerprint(model)
        disk = DiskCacheTier(self.cache_dir) if self.cache_dir is not None else None
        self.store = SegmentStore(self.fingerprint, memory_bytes, disk, device=model.device)
        self.prefix_cache = PrefixCache(self.fingerprint, memory_bytes)

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | str = torch.float32,
        cache_dir: str | Path | None = None,
        **options: Any,
    ) -> Engine:
        """Load a local Hugging Face checkpoint directory; ``None`` means the bundled default model.

        ``cache_dir`` adds a persistent segment tier there; ``options`` go to ``Engine``."""
        if path is None:
            path = default_model_path()
            if not (path / "config.json").is_file():
                raise ValueError(
                    f"the bundled default model is missing from this install ({path}); reinstall "
                    "hypic-rag or pass the path of a local Qwen3-Next or Qwen3.5 checkpoint"
                )
        path = Path(path)
        model = load_model(path, device=device, dtype=resolve_dtype(dtype))
        eos = eos_token_ids(path, model.config.eos_token_ids)
        return cls(
            model,
            load_tokenizer(path),
            eos_token_ids=eos,
            cache_dir=cache_dir,
            name=path.name,
            fingerprint=checkpoint_fingerprint(path) + str(model.dtype),
            **options,
        )

    # -- text ---------------------------------------------------------------------------------

    def _require_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ValueError(f"checkpoint {self.name!r} has no tokenizer files; pass token ids instead of text")
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self._require_tokenizer().encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return self._require_tokenizer().decode(list(ids), skip_special_tokens=True)

    def segment_ids(self, segment: Segment) -> list[int]:
        ids = list(segment.token_ids) if segment.token_ids is not None else self.encode(segment.text or "")
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})")
        return ids

    def build_prompt(self, segments: Sequence[Segment], query: str | Segment) -> Prompt:
        """Tokenize each segment on its own; reject prompts the model cannot take."""
        if isinstance(segments, Segment) or not all(isinstance(s, Segment) for s in segments):
            raise ValueError("segments must be a list of Segment")
        q = as_query(query)
        seg_ids = [self.segment_ids(s) for s in segments]
        query_ids = self.segment_ids(q)
        empty = [i for i, ids in enumerate(seg_ids) if not ids]
        if empty:
            raise ValueError(f"segment {empty[0]} tokenizes to no tokens")
        prompt = Prompt(seg_ids, query_ids)
        n = len(prompt.ids)
        if n == 0:
            raise ValueError("the prompt is empty: give at least one segment or a non-empty query")
        if not query_ids:
            raise ValueError("the query tokenizes to no tokens")
        if n > self.config.max_position_embeddings:
            raise ValueError(
                f"prompt of {n} tokens is past the model's context of {self.config.max_position_embeddings}"
            )
        return prompt

    # -- serving ------------------------------------------------------------------------------

    def _check_mode(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")

    def _prefill(
        self, prompt: Prompt, mode: str, seam: int | float | None
    ) -> tuple[torch.Tensor, HybridCache, dict[str, Any], Callable[[], None]]:
        """Run the prompt in ``mode``: the next-token logits ``[V]``, the cache, the request stats, and
        deferred work (entries for misses under the exact policy) to run once the first token is out."""
        cache = self.model.new_cache()
        stats: dict[str, Any] = {
            "mode": mode,
            "prompt_tokens": len(prompt.ids),
            "segments": len(prompt.segments),
            "hit_segments": 0,
            "miss_segments": len(prompt.segments),
            "recomputed_tokens": len(prompt.ids),
            "cache_bytes": 0,
        }
        later: Callable[[], None] = lambda: None  # noqa: E731
        with torch.inference_mode():
            if mode == "full":  # one forward over the whole prompt
                logits = self.model(self._tensor(prompt.ids), cache=cache, logits_to_keep=1)[0, -1]
                return logits.float(), cache, stats, later
            if mode == "prefix":
                self._prefill_prefix(prompt, cache, stats)
            else:
                later = self._prefill_composed(prompt, cache, stats, 0 if mode == "pic" else seam)
            logits = self.model(self._tensor(prompt.query), cache=cache, logits_to_keep=1)[0, -1]
        return logits.float(), cache, stats, later

    def _tensor(self, ids: Sequence[int]) -> torch.Tensor:
        return torch.tensor([list(ids)], dtype=torch.long, device=self.model.device)

    def _run(self, ids: Sequence[int], cache: HybridCache) -> None:
        if ids:
            self.model.hidden_states(self._tensor(ids), cache)

    def _prefill_prefix(self, prompt: Prompt, cache: HybridCache, stats: dict[str, Any]) -> None:
        keys = self.prefix_cache.chain_keys(prompt.segments)
        depth = self.prefix_cache.longest(keys)
        if depth:
            self.prefix_cache.restore(keys[:depth], cache)
        for key, ids in zip(keys[depth:], prompt.segments[depth:], strict=True):
            start = cache.seq_len
            self._run(ids, cache)
            self.prefix_cache.snapshot(key, cache, start)
        stats.update(
            hit_segments=depth,
            miss_segments=len(keys) - depth,
            recomputed_tokens=len(prompt.ids) - sum(len(ids) for ids in prompt.segments[:depth]),
        )

    def _prefill_composed(
        self, prompt: Prompt, cache: HybridCache, stats: dict[str, Any], seam: int | float | None
    ) -> Callable[[], None]:
        seam = self.seam if seam is None else seam
        variant = self.seam_variant
        widths = [resolve_seam(seam, len(ids)) for ids in prompt.segments]
        # Entries serve every mode; under variant B they carry the remainder operator after the seam,
        # for this request's seam or, in pic mode, the engine's default one.
        split_seam = seam if seam else self.seam
        splits = [resolve_seam(split_seam, len(ids)) if variant == "B" else 0 for ids in prompt.segments]
        keys = [segment_key(ids, self.fingerprint, self.model.dtype) for ids in prompt.segments]
        cacheable = [len(ids) >= max(1, self.min_cached_tokens) for ids in prompt.segments]
        entries: list[SegmentEntry | None] = []
        for i, (key, ids) in enumerate(zip(keys, prompt.segments, strict=True)):
            entry = self.store.get(key, tuple(ids)) if cacheable[i] else None
            needs_rest = variant == "B" and 0 < widths[i] < len(ids) and i > 0
            if entry is not None and needs_rest and entry.seam != widths[i]:
                entry = None  # cached with another seam: recompute with this one
            entries.append(entry)
        hits = sum(e is not None for e in entries)
        misses = [i for i, e in enumerate(entries) if e is None and cacheable[i]]
        recomputed = len(prompt.query)
        if misses and self.cold_policy == "parallel":
            for i, entry in zip(misses, self._make_entries(prompt, misses, splits, keys), strict=True):
                entries[i] = entry
                recomputed += len(entry)
        # Segments computed in context (uncached, exact-policy misses, or wholly inside their seam)
        # run as one forward per consecutive stretch, not one per segment.
        stretch: list[int] = []
        for i, (ids, entry) in enumerate(zip(prompt.segments, entries, strict=True)):
            width = widths[i] if i else 0
            if entry is None or width >= len(ids):
                stretch.extend(ids)
                recomputed += len(ids)
                continue
            self._run(stretch, cache)
            stretch = []
            recomputed += install_segment(self.model, cache, entry, width, variant)
        self._run(stretch, cache)
        stats.update(
            hit_segments=hits,
            miss_segments=len(entries) - hits,
            recomputed_tokens=recomputed,
            cache_bytes=sum(e.nbytes for e in entries if e is not None),
            seam=seam,
            seam_variant=variant,
            cold_policy=self.cold_policy,
        )
        if not misses or self.cold_policy == "parallel":
            return lambda: None

        def later() -> None:  # exact policy: the misses' entries, once the first token is out
            self._make_entries(prompt, misses, splits, keys)

        return later

    def _make_entries(
        self, prompt: Prompt, misses: list[int], splits: list[int], keys: list[str]
    ) -> list[SegmentEntry]:
        """Prefill the missed segments in isolation, all at once, and store their entries."""
        fresh = prefill_isolated(self.model, [prompt.segments[i] for i in misses], [splits[i] for i in misses])
        for i, entry in zip(misses, fresh, strict=True):
            self.store.put(keys[i], entry)
        return fresh

    def clear_cache(self) -> None:
        """Forget every cached segment and prefix, on disk too."""
        self.store.clear()
        self.prefix_cache.clear()

    def prefill(
        self,
        segments: Sequence[Segment],
        query: str | Segment,
        *,
        mode: str = "hypic",
        seam: int | float | None = None,
    ) -> tuple[torch.Tensor, HybridCache]:
        """The next-token logits ``[V]`` and the cache positioned after the prompt, to continue from."""
        self._check_mode(mode)
        logits, cache, _, later = self._prefill(self.build_prompt(segments, query), mode, seam)
        later()
        return logits, cache

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
        *,
        mode: str = "hypic",
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        seam: int | float | None = None,
        top_p: float = 1.0,
        seed: int | None = None,
        stop_token_ids: Sequence[int] | None = None,
        on_token: TokenCallback | None = None,
    ) -> GenerationOutput:
        """Answer a prompt of segments and a query.

        Stops at ``max_new_tokens``, at an EOS or stop id (not included in the output), or at the
        model's context. ``on_token(id, text_delta)`` streams each token as it is chosen.
        """
        self._check_mode(mode)
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        sampler = Sampler(temperature=temperature, top_p=top_p, seed=seed)
        prompt = self.build_prompt(segments, query)
        stops = set(self.eos_token_ids) | set(stop_token_ids or ())
        gen = sampler.generator(self.model.device)

        start = time.perf_counter()
        logits, cache, stats, later = self._prefill(prompt, mode, seam)
        token = sampler.pick(logits, gen)
        ttft = time.perf_counter() - start
        later()

        out: list[int] = []
        text_so_far = ""
        finish = "length"
        with torch.inference_mode():
            while True:
                if token in stops:
                    finish = "stop"
                    break
                out.append(token)
                if on_token is not None:
                    delta = None
                    if self.tokenizer is not None:
                        text = self.decode(out)
                        delta, text_so_far = text[len(text_so_far) :], text
                    on_token(token, delta)
                if len(out) >= max_new_tokens:
                    break
                if cache.seq_len >= self.config.max_position_embeddings:
                    finish = "context"
                    break
                step = torch.tensor([[token]], dtype=torch.long, device=self.model.device)
                token = sampler.pick(self.model(step, cache=cache)[0, -1].float(), gen)
        stats["generated_tokens"] = len(out)
        text_out = self.decode(out) if self.tokenizer is not None else None
        return GenerationOutput(text_out, out, ttft, stats, finish, prompt_logits=logits)
