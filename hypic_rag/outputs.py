"""What a request gives back: its statistics and, for ``generate``, the generated text."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch


@dataclass
class RequestStats:
    """How a prompt was served. ``recomputed_tokens`` counts the tokens that went through the model
    for it: seams, query, misses and segments run in context; ``cached_tokens`` the prompt tokens whose
    state came from what the cache held before the request (hit segments less their seams, or the
    restored prefix), OpenAI's ``usage.prompt_tokens_details.cached_tokens``. The composed modes also
    say which seam, variant and cold policy served them. A request that probed its boundaries (an ``auto`` seam,
    or a fidelity budget) also says the widths it used per segment, the tokens its probes ran through the
    model (the boundaries' probe its first layers, ``auto``'s reading probe every layer; not in
    ``recomputed_tokens``) and ``probe_cost``, those tokens weighted by the share of the model's layers they
    went through (what they cost in tokens of a whole forward, counting every layer alike), its deviation
    estimate and the guard's action:
    ``none``, ``widened`` (its seams) or ``exact`` (run as ``full``)."""

    mode: str
    prompt_tokens: int
    segments: int
    hit_segments: int = 0
    miss_segments: int = 0
    # of hit_segments' lookups, the segments the memory tier held when the request looked them up (the others
    # came from a persistent tier or were made): what a fleet's routing is for
    memory_segments: int = 0
    # of hit_segments, the leading segments a composed request restored exactly from the prefix store (the
    # nodes ``prefix`` mode writes) before composing the others onto them
    prefix_segments: int | None = None
    # of cached_tokens, the leading prompt tokens restored whole from a kept state: an exact prefix (``prefix`` mode's
    # nodes), or the state an earlier turn of the conversation ended with
    prefix_tokens: int | None = None
    # of cached_tokens, those of runs of kept turns found later in the prompt (after a document inserted into the
    # history), their seams aside
    run_tokens: int | None = None
    recomputed_tokens: int = 0
    cached_tokens: int = 0
    cache_bytes: int = 0
    seam: int | float | None = None
    seam_variant: str | None = None
    cold_policy: str | None = None
    generated_tokens: int = 0
    filled_tokens: int = 0  # of recomputed_tokens, those prefilled in isolation to make missing cache entries
    seam_widths: list[int] | None = None
    probe_tokens: int | None = None
    probe_cost: float | None = None
    # of a cold request, its cold segments' tokens run alone through the probed layers (not in probe_tokens)
    probe_cold_tokens: int | None = None
    fidelity_estimate: float | None = None
    fidelity_action: str | None = None
    # What the segment store saw for this request: hits per tier, entries found corrupt (dropped and
    # recomputed), and failures of a persistent tier (bypassed); flattened into the stats dict.
    store_counters: dict[str, int] | None = None

    @classmethod
    def uncached(cls, mode: str, prompt_tokens: int, segments: int) -> RequestStats:
        """Every segment missed and every token recomputed, as in ``full``."""
        return cls(mode, prompt_tokens, segments, miss_segments=segments, recomputed_tokens=prompt_tokens)

    def as_dict(self) -> dict[str, Any]:
        """API.md's stats dict; fields that do not apply to the mode are left out."""
        out = {k: v for k, v in asdict(self).items() if v is not None}
        out.update(out.pop("store_counters", None) or {})
        return out


@dataclass
class GenerationOutput:
    text: str | None
    token_ids: list[int]
    ttft_s: float
    stats: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "length"
    prompt_logits: torch.Tensor | None = None  # next-token logits [V] at the end of the prompt
    # ``Engine.chat`` only: calls parsed in the template's format ({"id", "name", "arguments"}) and the
    # reasoning split off the answer; ``text`` is then the answer without either.
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    reasoning: str | None = None
    # With ``logprobs=True``: each output token's ``logits.TokenLogprob`` (the model's own log-probability and,
    # with ``top_logprobs``, the likeliest alternatives).
    logprobs: list[Any] | None = None
    # A constrained answer (``response_format``, a tool-call grammar) that ended before its grammar was complete:
    # cut by ``max_new_tokens``, a stop string, the context or a cancel. Its text is not valid under the constraint.
    incomplete: bool = False
    # ``Engine.chat`` only: a call the answer began and ``max_new_tokens`` cut, ``{"id", "name", "arguments": str}``
    # with the arguments' text as far as it was written (the OpenAI API returns it as the answer's tool call).
    partial_call: dict[str, Any] | None = None
    # A stop string ended the text (its trailing whitespace is the model's, kept).
    stopped_at_string: bool = False
