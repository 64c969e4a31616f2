"""The engine: loads a checkpoint and serves prompts made of segments.

A request goes load → plan → look up → fill misses → assemble → query → decode. The engine checks what it is
given, starts the request and hands it on: its prefill is ``prefill.PrefillProgram``'s (with the fidelity guard,
``guard``), its settings ``settings.PrefillSettings``, its decode ``decoding``'s; each step of those lives in its
own module (``plan``, ``cache``, ``entries``, ``assembly``). The math is in ``hypic_rag.model`` and
``hypic_rag.kernels``.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from . import request
from .batch import prepared_begins, run_batch, run_one, started
from .cache import checkpoint_fingerprint, default_cache_dir
from .cache.remote import check_url
from .cache.stores import open_stores
from .chat.conversation import ChatSetup
from .chat.formats.base import NONE, ChatFormat
from .chat.requests import ChatRequests
from .chat.segmentation import RenderedPrompt
from .chat.template import ChatTemplate
from .decoding import Generation, Prefilling, TokenCallback
from .defaults import MAX_ACTIVE, MAX_NUM_BATCHED_TOKENS, WEIGHTS
from .generation_config import GenerationDefaults, eos_token_ids, read_generation_defaults
from .grammar import GrammarTokenizer
from .hub import resolve_checkpoint
from .inputs import as_list
from .model import HybridModel, RequestState, load_model
from .model.linear import native_bf16
from .model.loading import default_model_path, resolve_dtype
from .options import MODES, RequestOptions, check_mode
from .outputs import GenerationOutput
from .plan import Prompt, RequestPlan
from .prefill import PrefillProgram, missing
from .prepare import Prepared, Preparer
from .segments import Segment
from .settings import (
    COLD_POLICIES,
    CacheSettings,
    EngineSettings,
    PrefillSettings,
    Setting,
    check_chunk,
    usable_device,
)
from .tokenizer import load_tokenizer

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


CACHE_AHEAD_CHUNK = 64  # segments filled, then stored, at a time by ``Engine.cache_segments``


def _whole(overrides: Mapping[str, Any], where: str) -> Mapping[str, Any]:
    """``overrides`` of a method that runs its prompt whole, which ``prefill_chunk`` (a keyword of ``start`` and
    ``start_chat``, whose ``Prefilling`` a scheduler advances) cannot reach."""
    if "prefill_chunk" in overrides:
        raise ValueError(f"prefill_chunk is taken by start and start_chat, not by {where}: it runs the prompt whole")
    return overrides


class Engine:
    """A hybrid model, its tokenizer, and the prompt-serving logic around them."""

    seam = Setting()
    seam_variant = Setting()
    cold_policy = Setting()
    min_cached_tokens = Setting()
    fuse_forwards = Setting()
    fidelity_budget = Setting()
    keep_states = Setting()

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
        cache_secret: str | bytes | None = None,
        keep_states: bool = True,
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
        per byte, ``"lru"`` keeps the least recently used out (``cache/lru.py``). ``cache_secret`` (16 bytes or more)
        seals what the disk and shared tiers hold, so that whoever can write them without it cannot make an entry
        this engine uses (``cache/seal.py``); engines with different secrets, or none, share no entries.
        ``keep_states``: a composed request keeps the states it used (where its query and its template's
        generation prompt begin, at its prompt's end and after its answer) in the memory tier, and restores the
        longest one a later prompt begins with: a conversation's next turn runs only what is new (``False``:
        composed requests restore only ``prefix`` mode's exact states, and run their seams and query as one
        forward)."""
        self.settings = EngineSettings(  # every setting checked here, before anything is built
            PrefillSettings(
                seam, seam_variant, cold_policy, min_cached_tokens, fuse_forwards, fidelity_budget, keep_states
            ),
            CacheSettings(cache_dir, cache_url, memory_bytes, disk_bytes, entry_dtype, cache_policy, cache_secret),
            flush_denormals,
        )
        if flush_denormals:
            torch.set_flush_denormal(True)
        self.model, self.config = model, model.config
        # The tokenizer, the template, the EOS ids and the generation defaults are the preparer's (``prepare.py``:
        # what a request is prepared with, off the engine thread); the engine's names for them read its.
        self.preparer = Preparer(
            tokenizer,
            ChatSetup.build(chat_template, tokenizer) if chat_template is not None else None,
            vocab_size=model.config.vocab_size,
            context=model.config.max_position_embeddings,
            eos_token_ids=eos_token_ids,
            generation_defaults=generation_defaults,
            name=name,
        )
        stores = open_stores(self.settings.cache, model, fingerprint)
        self.memory, self.segment_store, self.prefix_store = stores.memory, stores.segments, stores.prefixes
        self.fingerprint = stores.fingerprint
        # ray_prefill.RayPrefill as the pool: cold misses prefilled across Ray actors
        self.prefill_program = PrefillProgram(
            model, self.settings.prefill, self.segment_store, self.prefix_store, self.fingerprint, prefill_pool
        )

    @property
    def name(self) -> str:
        return self.preparer.name

    @property
    def tokenizer(self) -> Any:
        return self.preparer.tokenizer

    @property
    def chat_setup(self) -> ChatSetup | None:
        return self.preparer.chat_setup

    @property
    def generation_defaults(self) -> GenerationDefaults:
        return self.preparer.generation_defaults

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.preparer.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids: Sequence[int]) -> None:
        """Every end the engine stops at, and the grammar's ends with them (a test may clear them)."""
        self.preparer.eos_token_ids = tuple(ids)

    @property
    def cache_dir(self) -> Path | None:
        return self.settings.cache.cache_dir

    @property
    def cache_url(self) -> str | None:
        return self.settings.cache.cache_url

    @property
    def entry_dtype(self) -> torch.dtype:
        return self.settings.cache.entry_dtype

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
        weights: str = "float32",
        **options: Any,
    ) -> Engine:
        """Load a local Hugging Face checkpoint directory, a hub id ``org/name`` (at ``revision``,
        through the local Hugging Face cache), or, for ``None``, the bundled default model.
        ``pack_head=False``: no packed copy of the LM head, ``pack_weights=False`` none of the decoder's
        projections (``model.linear.Linear``: a copy costs the weight's size again in memory and makes CPU fp32
        decode and prefill faster). ``weights="int8"``: decode steps read 8-bit copies of the projections' weights
        (a quarter of the bytes; ``HybridModel.decode_int8``), prompts still the float ones; CPU float32 only.
        ``weights="bfloat16"``: bfloat16 copies (half the bytes; ``HybridModel.decode_bf16``) on a CPU that
        multiplies bfloat16 natively (``linear.native_bf16``); elsewhere float32, with a warning.

        ``cache_dir`` adds a persistent segment tier there, ``cache_url`` (``redis://host:port/db``) a shared
        one that replicas on several machines use together; ``prefill_workers=N`` prefills cold segments on N
        Ray actors (``ray_prefill.py``; the ``ray`` extra); ``options`` go to ``Engine``."""
        if cache_url is not None:
            check_url(cache_url)
        if weights not in WEIGHTS:
            raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
        if weights != "float32" and (str(device) != "cpu" or resolve_dtype(dtype) != torch.float32):
            raise ValueError(
                f"weights={weights!r} decodes on the CPU from a float32 model: give device='cpu', dtype=float32"
            )
        if weights == "bfloat16" and not native_bf16():
            warnings.warn(
                "this CPU has no native bfloat16 products (AVX-512 BF16 or AMX): decoding from the float32 weights",
                stacklevel=2,
            )
            weights = "float32"
        device = usable_device(device)
        root = resolve_checkpoint(path, revision)
        is_hub = path is not None and root != Path(path).expanduser()
        model = load_model(root, device=device, dtype=resolve_dtype(dtype))
        model.pack_weights(pack_weights, head=pack_head)
        model.decode_int8(weights == "int8")
        model.decode_bf16(weights == "bfloat16")
        eos = eos_token_ids(root, model.config.eos_token_ids)
        if "generation_defaults" not in options:
            options["generation_defaults"] = read_generation_defaults(root)
        if "chat_template" not in options:
            options["chat_template"] = ChatTemplate.from_checkpoint(root)
        fingerprint = checkpoint_fingerprint(root, default_cache_dir() / "weight-digests.json") + str(model.dtype)
        # a kept answer's state was decoded from these weights
        fingerprint += {"int8": ":int8-decode", "bfloat16": ":bf16-decode"}.get(weights, "")
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

    @property
    def chats(self) -> ChatRequests:
        """The chat side (``chat/requests.py``) of the engine's preparer."""
        return self.preparer.chats

    @property
    def prefill_pool(self) -> Any:
        """The pool that prefills cold segments elsewhere (``ray_prefill.RayPrefill``), or None."""
        return self.prefill_program.pool

    # -- text ---------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return self.preparer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self.preparer.decode(ids)

    def segment_ids(self, segment: Segment) -> list[int]:
        return self.preparer.segment_ids(segment)

    def build_prompt(self, segments: Sequence[Segment], query: str | Segment) -> Prompt:
        """Tokenize each segment on its own; reject prompts the model cannot take."""
        return self.preparer.build_prompt(segments, query)

    def grammar_tokenizer(self, stop_ids: Sequence[int] = ()) -> GrammarTokenizer:
        """The tokenizer as the output grammar reads it (``Preparer.grammar_tokenizer``)."""
        return self.preparer.grammar_tokenizer(stop_ids)

    # -- one request ------------------------------------------------------------------------------

    def plan(self, prompt: Prompt, mode: str = "hypic", seam: int | float | None = None) -> RequestPlan:
        """How a composed request (``pic`` or ``hypic``) will serve each segment of ``prompt``."""
        return self.prefill_program.plan(prompt, mode, seam)

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
        ids = self.preparer.segments_ids(segments)
        plan = self.plan(Prompt(ids, [], tuple(s.cache for s in segments)), "hypic", seam)
        # any of them may follow another in a request, so each needs the remainder a seam leaves (the plan
        # gives the prompt's first none)
        plan = replace(plan, segments=[replace(seg, remainder=seg.record_remainder) for seg in plan.segments])
        misses, seen = [], set()
        for seg, found in zip(
            plan.segments, self.prefill_program.lookup(plan), strict=True
        ):  # not requests: no hit ratio
            if missing(seg, found) and seg.key not in seen:
                misses.append((seg, found))
                seen.add(seg.key)
        for start in range(0, len(misses), CACHE_AHEAD_CHUNK):
            self.prefill_program.fill(misses[start : start + CACHE_AHEAD_CHUNK])
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
        done = self.prefill_program.run(self.build_prompt(segments, query), mode, seam)
        self.prefill_program.fill(done.deferred)
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
        cancelled: Callable[[], bool] | None = None,
        **overrides: Any,
    ) -> GenerationOutput:
        """Answer a prompt of segments and a query.

        ``options`` (a ``RequestOptions``) and keyword arguments naming its fields (``mode=``,
        ``max_new_tokens=``, ``temperature=``, ``seam=``, ...; the keywords win) set the request; unset sampling
        settings are greedy and 64 tokens, whatever the checkpoint's ``generation_config.json`` says.

        Stops at ``max_new_tokens``, at an EOS or stop id (not included in the output), at a ``stop`` string (the
        text is cut before it), or at the model's context. ``on_token(id, text_delta)`` streams each token as it is
        chosen (``decoding.FLUSH`` ends held-back text); ``cancelled()``, asked before each token, ends the answer
        there (``finish_reason="cancelled"``). It runs as a batch of one on the scheduler every batch runs on.
        """
        prepared = self.prepare(segments, query, options, **_whole(overrides, "generate"))
        return run_one(functools.partial(self.begin, prepared, on_token=on_token, cancelled=cancelled))

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
        prepared = self.prepare(segments, query, options, **overrides)
        return self.begin(prepared, on_token=on_token, cancelled=cancelled, prefill_chunk=prefill_chunk)

    def prepare(
        self, segments: Sequence[Segment], query: str | Segment, options: RequestOptions | None = None, **overrides: Any
    ) -> Prepared:
        """``start``'s request prepared (``prepare.Preparer.segments``): tokenized, checked, its grammar compiled.
        Runs no model and touches no cache, so a server calls it off the engine thread."""
        return self.preparer.segments(segments, query, RequestOptions.from_mapping(overrides, base=options))

    def begin(
        self,
        prepared: Prepared,
        *,
        on_token: TokenCallback | None = None,
        cancelled: Callable[[], bool] | None = None,
        prefill_chunk: int | None = None,
    ) -> Generation | Prefilling:
        """A prepared request (``prepare``, ``prepare_chat``) started as ``start`` and ``start_chat`` start theirs
        (``request.start``)."""
        return request.start(self, prepared, on_token, cancelled, check_chunk(prefill_chunk))

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
        prepares = [functools.partial(self.prepare, s, q, options, **overrides) for s, q in prompts]
        begins = prepared_begins(prepares, self.begin)
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
        prepares = [functools.partial(self.prepare_chat, messages, options, **chat) for messages in conversations]
        begins = prepared_begins(prepares, self.begin)
        return run_batch(
            begins,
            max_active=max_active,
            max_num_batched_tokens=max_num_batched_tokens,
            return_exceptions=return_exceptions,
        )

    # -- chat ---------------------------------------------------------------------------------------

    @property
    def chat_format(self) -> ChatFormat:
        """The chat format of the checkpoint's template (``NONE`` without one): what writes a framework's messages
        as its model reads them (``ChatFormat.prepare_messages``), for the integrations, the server and the eval
        harness alike."""
        return self.chat_setup.format if self.chat_setup is not None else NONE

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        segmentation: str = "auto",
    ) -> RenderedPrompt:
        """The checkpoint's template applied to ``messages`` (the text transformers' ``apply_chat_template``
        gives), cut into segments (``chat.segmentation``), with the prompt's token ids."""
        return self.chats.render(messages, tools, chat_template_kwargs, segmentation)[0]

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RequestOptions | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        on_token: TokenCallback | None = None,
        cancelled: Callable[[], bool] | None = None,
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
        chat = {"tools": tools, "tool_choice": tool_choice, "parallel_tool_calls": parallel_tool_calls}
        prepared = self.prepare_chat(messages, options, **chat, **_whole(overrides, "chat"))
        return run_one(functools.partial(self.begin, prepared, on_token=on_token, cancelled=cancelled))

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
        prepared = self.prepare_chat(
            messages,
            options,
            tools=tools,
            tool_choice=tool_choice,
            parallel_tool_calls=parallel_tool_calls,
            **overrides,
        )
        return self.begin(prepared, on_token=on_token, cancelled=cancelled, prefill_chunk=prefill_chunk)

    def prepare_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        options: RequestOptions | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        tool_choice: str | Mapping[str, Any] | None = None,
        parallel_tool_calls: bool = True,
        **overrides: Any,
    ) -> Prepared:
        """``start_chat``'s request prepared (``prepare.Preparer.chat``): rendered, tokenized, checked against the
        context, its answer shaped and its grammar compiled, so that a schema or pattern the grammar cannot hold is
        a ``ValueError`` naming the field (``response_format`` or ``tools.N.function.parameters``) before the
        request is admitted. Runs no model and touches no cache, so a server calls it off the engine thread."""
        options = RequestOptions.from_mapping(overrides, base=options)
        return self.preparer.chat(messages, options, tools, tool_choice, parallel_tool_calls)
