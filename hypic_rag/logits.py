"""What happens to one sequence's next-token logits between the forward and its next token: penalties on what it
has seen, the output grammar's mask, the log-probabilities a request asked to see, and the choice itself
(``Sampler``: greedy, or sampled with temperature, top-k, min-p and nucleus truncation).

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

from .options import check_sampling

if TYPE_CHECKING:
    from .options import RequestOptions


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int | None = None
    min_p: float = 0.0

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_p, self.top_k, self.seed)
        if not (isinstance(self.min_p, int | float) and 0 <= self.min_p <= 1):
            raise ValueError(f"min_p must be a number in [0, 1], got {self.min_p!r}")
        if self.temperature is None or self.top_p is None:
            raise ValueError("a Sampler needs a temperature and a top_p (RequestOptions.with_defaults fills them)")

    @classmethod
    def of(cls, options: RequestOptions) -> Sampler:
        """The sampler of a request whose defaults are filled (``RequestOptions.with_defaults``)."""
        return cls(
            temperature=options.temperature,
            top_p=options.top_p,
            seed=options.seed,
            top_k=options.top_k,
            min_p=options.min_p or 0.0,
        )

    def generator(self, device: torch.device) -> torch.Generator | None:
        if self.temperature == 0:
            return None
        gen = torch.Generator(device=device)
        if self.seed is None:
            gen.seed()
        else:
            gen.manual_seed(self.seed)
        return gen

    def pick(self, logits: torch.Tensor, generator: torch.Generator | None) -> int:
        """The next id from logits ``[V]``."""
        if self.temperature == 0:
            return int(torch.argmax(logits))
        logits = logits.float()
        if self.top_k and self.top_k < logits.numel():
            # As transformers' TopKLogitsWarper, before top-p: ties with the k-th logit stay in.
            kth = torch.topk(logits, self.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        # Shifted first, so that a tiny temperature sends the others to -inf instead of overflowing to inf - inf,
        # and kept above float32's smallest normal, which a Python float may be far below (0/0 is NaN).
        temperature = max(self.temperature, torch.finfo(torch.float32).tiny)
        probs = torch.softmax((logits - logits.max()) / temperature, dim=-1)
        if self.min_p > 0:  # as vLLM: after the temperature, relative to the likeliest token
            probs = probs.masked_fill(probs < self.min_p * probs.max(), 0.0)
        if self.top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            before = sorted_p.cumsum(0) - sorted_p  # mass of strictly more likely tokens
            sorted_p = sorted_p.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=generator))


class LogitsMask(Protocol):
    """A per-sequence constraint (``grammar.GrammarMask``): ``apply`` before choosing, ``advance`` after, then
    ``prefetch`` to start on the next step's work while the forward runs."""

    def apply(self, logits: torch.Tensor, *, scratch: bool = False) -> torch.Tensor: ...

    def advance(self, token: int) -> None: ...

    def prefetch(self) -> None: ...

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

    def pick(self, logits: torch.Tensor, *, scratch: bool = False, prefetch: bool = True) -> int:
        """The next token from a logits row ``[V]``, recorded (penalties, grammar, log) as chosen. ``scratch``: the
        caller reads ``logits`` no more, so the mask may write into it. ``prefetch``: the mask starts on the next
        step at once (a batch's are started together instead, ``GrammarMask.prefetch_together``)."""
        if self.logprobs is not None:
            logged = torch.log_softmax(logits.float(), dim=-1)
        if self.penalties is not None:
            logits, scratch = self._penalised(logits.float()), True
        if self.banned is not None:
            banned = self.banned.apply(logits, first=not self.picked)
            logits, scratch = banned, scratch or banned is not logits
        if self.mask is not None:
            logits = self.mask.apply(logits, scratch=scratch)
        token = self.sampler.pick(logits, self.generator)
        if self.mask is not None:
            self.mask.advance(token)
            if prefetch:
                self.mask.prefetch()
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
