"""How far a mode's answer drifts from full recompute on the same token ids (docs/design.md §8)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .engine import Engine
from .segments import Segment


def kl_divergence(full_logits: torch.Tensor, mode_logits: torch.Tensor) -> float:
    """KL(full ‖ mode) of the next-token distributions, in nats, computed in fp64."""
    p = torch.log_softmax(full_logits.double(), dim=-1)
    q = torch.log_softmax(mode_logits.double(), dim=-1)
    return float((p.exp() * (p - q)).sum().clamp_min(0.0))


def top1_agreement(full_logits: torch.Tensor, mode_logits: torch.Tensor) -> bool:
    return int(full_logits.argmax()) == int(mode_logits.argmax())


def answer_log_likelihood(
    engine: Engine,
    segments: Sequence[Segment],
    query: str | Segment,
    answer: Sequence[int],
    *,
    mode: str = "hypic",
    seam: int | float | None = None,
) -> float:
    """Teacher-forced log-probability of ``answer`` ids after the prompt, with the prompt in ``mode``."""
    if not answer:
        raise ValueError("answer must hold at least one token id")
    logits, state = engine.prefill(segments, query, mode=mode, seam=seam)
    total = float(torch.log_softmax(logits.double(), dim=-1)[answer[0]])
    if len(answer) > 1:
        ids = torch.tensor([list(answer)], dtype=torch.long, device=engine.model.device)
        with torch.inference_mode():
            rest = engine.model(ids[:, :-1], state=state)[0].double()
        total += float(torch.log_softmax(rest, dim=-1).gather(1, ids[0, 1:, None]).sum())
    return total
