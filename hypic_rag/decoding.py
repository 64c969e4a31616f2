"""Choosing the next token (greedy, or sampled with temperature, top-k and nucleus truncation) and the
decode loop that continues a prefilled request state one token at a time."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from .model import HybridModel, RequestState

TokenCallback = Callable[[int, "str | None"], None]


@dataclass(frozen=True)
class Sampler:
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k is not None and (isinstance(self.top_k, bool) or not isinstance(self.top_k, int)):
            raise ValueError(f"top_k must be an integer or None, got {self.top_k!r}")
        if self.top_k is not None and self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0 or None: off), got {self.top_k}")

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
        probs = torch.softmax(logits / self.temperature, dim=-1)
        if self.top_p < 1:
            sorted_p, order = torch.sort(probs, descending=True)
            before = sorted_p.cumsum(0) - sorted_p  # mass of strictly more likely tokens
            sorted_p = sorted_p.masked_fill(before >= self.top_p, 0.0)
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
        return int(torch.multinomial(probs, 1, generator=generator))


@torch.inference_mode()
def decode(
    model: HybridModel,
    state: RequestState,
    first: int,
    sampler: Sampler,
    generator: torch.Generator | None,
    *,
    stops: Collection[int],
    max_new_tokens: int,
    on_token: TokenCallback | None = None,
    detokenize: Callable[[Sequence[int]], str] | None = None,
) -> tuple[list[int], str]:
    """Generated ids from ``first`` on, and why it stopped: ``"stop"`` at a stop id (not included),
    ``"length"`` at ``max_new_tokens``, ``"context"`` at the model's context. ``on_token(id, delta)``
    gets each id as it is chosen, with its text delta when ``detokenize`` is given."""
    out: list[int] = []
    text_so_far = ""
    token = first
    while True:
        if token in stops:
            return out, "stop"
        out.append(token)
        if on_token is not None:
            delta = None
            if detokenize is not None:
                text = detokenize(out)
                delta, text_so_far = text[len(text_so_far) :], text
            on_token(token, delta)
        if len(out) >= max_new_tokens:
            return out, "length"
        if state.seq_len >= model.config.max_position_embeddings:
            return out, "context"
        step = torch.tensor([[token]], dtype=torch.long, device=model.device)
        token = sampler.pick(model(step, state=state)[0, -1].float(), generator)
