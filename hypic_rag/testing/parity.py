"""Side-by-side comparisons of the runtime with transformers on the same checkpoint, for the
parity tests and the training script's checks. Needs ``transformers``."""

from __future__ import annotations

import torch

from hypic_rag.model import HybridModel


def load_reference(path) -> torch.nn.Module:
    """transformers' own model for a checkpoint directory, fp32 on CPU."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def logits_max_diff(ours: HybridModel, reference: torch.nn.Module, ids: torch.Tensor) -> float:
    """Largest absolute difference of full-forward logits ``[B, T, V]``."""
    return float((ours(ids).float() - reference(ids, use_cache=False).logits.float()).abs().max())


@torch.inference_mode()
def split_prefill_max_diff(model: HybridModel, ids: torch.Tensor, split: int) -> float:
    """Largest logit difference between a one-shot prefill and ``split`` tokens then the rest, through
    the request state."""
    whole = model(ids)
    state = model.new_state()
    first = model(ids[:, :split], state=state)
    second = model(ids[:, split:], state=state)
    return float((torch.cat((first, second), dim=1) - whole).abs().max())


@torch.inference_mode()
def reference_greedy(reference: torch.nn.Module, prompt: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate``, with EOS disabled so exactly ``max_new_tokens`` come back.

    The attention mask is explicit: otherwise transformers masks prompt tokens equal to the pad id."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0, bos_token_id=None
    )
    ids = torch.tensor([prompt])
    out = reference.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
    return out[0, len(prompt) :].tolist()
