"""What happens to one sequence's next-token logits between the forward and the sampler: penalties on what it
has seen, the output grammar's mask, and the log-probabilities a request asked to see.

``Picker.pick`` is the whole step from a sequence's logits row to its next token, so a decoder that runs many
sequences in one forward calls it once per row and each keeps its own penalties, grammar state and log.
Log-probabilities are the model's own (a log-softmax of the raw logits, before penalties, mask and temperature),
as vLLM reports them by default.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

if TYPE_CHECKING:
    from .decoding import Sampler
    from .options import RequestOptions


class LogitsMask(Protocol):
    """A per-sequence constraint (``grammar.GrammarMask``): ``apply`` before choosing, ``advance`` after."""

    def apply(self, logits: torch.Tensor) -> torch.Tensor: ...

    def advance(self, token: int) -> None: ...

    @property
    def complete(self) -> bool: ...


@dataclass(frozen=True)
class Penalties:
    """OpenAI's ``presence_penalty`` and ``frequency_penalty`` (subtracted once per token written, and per time
    written) on the answer's tokens; ``repetition_penalty`` (a positive logit divided by it, a negative one
    multiplied) on the prompt's and the answer's, as transformers and vLLM apply it."""

    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0

    @classmethod
    def of(cls, options: RequestOptions) -> Penalties | None:
        """The request's penalties, or None when it sets none (or only neutral ones)."""
        made = cls(options.presence_penalty or 0.0, options.frequency_penalty or 0.0, options.repetition_penalty or 1.0)
        return None if made == cls() else made


@dataclass(frozen=True)
class Banned:
    """Tokens a sequence may never choose (``always``) or not as its first (``first``): how an answer with no tool
    offered is kept from a format's call syntax without a grammar's per-token cost (``chat.grammar.no_call_bans``)."""

    always: tuple[int, ...] = ()
    first: tuple[int, ...] = ()

    def apply(self, logits: torch.Tensor, first: bool) -> torch.Tensor:
        ids = [i for i in (*self.always, *(self.first if first else ())) if i < logits.numel()]
        return logits.index_fill(0, torch.tensor(ids, device=logits.device), float("-inf")) if ids else logits


@dataclass
class TokenLogprob:
    """A chosen token's log-probability and the likeliest alternatives (``top``: ``(id, logprob)``, best first)."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


class Picker:
    """One sequence's way from logits to its next token (see the module docstring). ``logprobs``: the number of
    alternatives to log per token (0: the chosen one only), or None to log nothing."""

    def __init__(
        self,
        sampler: Sampler,
        generator: torch.Generator | None,
        *,
        penalties: Penalties | None = None,
        mask: LogitsMask | None = None,
        prompt_ids: Sequence[int] = (),
        logprobs: int | None = None,
        banned: Banned | None = None,
    ) -> None:
        self.sampler, self.generator, self.penalties, self.mask = sampler, generator, penalties, mask
        self.banned = banned
        self.top_logprobs = logprobs
        self.logprobs: list[TokenLogprob] | None = [] if logprobs is not None else None
        self.picked: list[int] = []
        self._prompt_ids = list(prompt_ids)
        self._counts: torch.Tensor | None = None  # times each id was written, for the penalties
        self._seen: torch.Tensor | None = None  # ids in the prompt or the answer, for the repetition penalty

    def pick(self, logits: torch.Tensor) -> int:
        """The next token from a logits row ``[V]``, recorded (penalties, grammar, log) as chosen."""
        if self.logprobs is not None:
            logged = torch.log_softmax(logits.float(), dim=-1)
        if self.penalties is not None:
            logits = self._penalised(logits.float())
        if self.banned is not None:
            logits = self.banned.apply(logits, first=not self.picked)
        if self.mask is not None:
            logits = self.mask.apply(logits)
        token = self.sampler.pick(logits, self.generator)
        if self.mask is not None:
            self.mask.advance(token)
        if self.penalties is not None:
            assert self._counts is not None and self._seen is not None
            self._counts[token] += 1
            self._seen[token] = True
        if self.logprobs is not None:
            top: list[tuple[int, float]] = []
            if self.top_logprobs:
                values, ids = torch.topk(logged, min(self.top_logprobs, logged.numel()))
                top = list(zip(ids.tolist(), values.tolist(), strict=True))
            self.logprobs.append(TokenLogprob(token, float(logged[token]), top))
        self.picked.append(token)
        return token

    def _penalised(self, logits: torch.Tensor) -> torch.Tensor:
        assert self.penalties is not None
        if self._counts is None:
            self._counts = torch.zeros(logits.numel(), device=logits.device)
            self._seen = torch.zeros(logits.numel(), dtype=torch.bool, device=logits.device)
            prompt = [i for i in self._prompt_ids if 0 <= i < logits.numel()]
            if prompt:
                self._seen[prompt] = True
        assert self._seen is not None
        p = self.penalties
        if p.repetition != 1.0:
            scaled = torch.where(logits > 0, logits / p.repetition, logits * p.repetition)
            logits = torch.where(self._seen, scaled, logits)
        if p.frequency:
            logits = logits - p.frequency * self._counts
        if p.presence:
            logits = logits - p.presence * (self._counts > 0).float()
        return logits
