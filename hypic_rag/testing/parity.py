"""Side-by-side comparisons of the runtime with transformers on the same checkpoint, for the
parity tests and the training script's checks. Needs ``transformers``.

Why the bound is relative: two correct fp32 implementations of the same network differ by rounding,
and how large that rounding is depends on the CPU (its kernels' summation order) and on the family (a
chunked delta rule amplifies it more than a short conv). A fixed bound such as 1e-4 passes on one CPU
and fails on another for code that is equally right. So a comparison measures the rounding on the
machine it runs on: transformers' own model in fp32 against the same model in float64 is the size a
correct fp32 forward may be off, and ours must be no further from float64 than ``ROUNDING_FACTOR``
times that. A real divergence (a wrong constant, a misplaced norm, a masked position) is orders of
magnitude larger than the rounding and still fails.

Top-k routing is the one place where rounding can change *what* is computed: at a near-tie between the
k-th and the (k+1)-th expert, which one wins is decided by the last bits, and two correct
implementations may pick differently. ``well_conditioned_ids`` picks test inputs whose every routing
decision has a margin well above the rounding, so the comparison is well posed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch.overrides import TorchFunctionMode

from hypic_rag.model import HybridModel

# Ours may be this many times further from float64 than transformers' fp32 is: the two sum in
# different orders, and one order can round worse than the other on a given CPU.
ROUNDING_FACTOR = 3.0
# A floor relative to the logits' scale, for families whose measured rounding is near fp32's epsilon.
RELATIVE_FLOOR = 1e-6
# Every routing decision's margin must exceed its rounding this many times.
ROUTING_MARGIN = 10.0


def load_reference(path, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """transformers' own model for a checkpoint directory, on CPU. The MoE experts run eagerly, the
    one implementation that takes every dtype (the grouped matmul refuses float64)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, experts_implementation="eager").eval()


@torch.inference_mode()
def logits_max_diff(ours: HybridModel, reference: torch.nn.Module, ids: torch.Tensor) -> float:
    """Largest absolute difference of full-forward logits ``[B, T, V]``."""
    return float((ours(ids).float() - reference(ids, use_cache=False).logits.float()).abs().max())


@dataclass(frozen=True)
class Parity:
    """Ours (in its own dtype) and transformers' fp32 forward, each against transformers' float64 one."""

    ours: float  # max |ours - reference in float64|
    rounding: float  # max |reference in fp32 - reference in float64|: this CPU's fp32 rounding
    direct: float  # max |ours - reference in fp32|, for the message
    scale: float  # max |logits|

    @property
    def bound(self) -> float:
        return ROUNDING_FACTOR * max(self.rounding, RELATIVE_FLOOR * self.scale)

    @property
    def holds(self) -> bool:
        return self.ours <= self.bound

    def __str__(self) -> str:
        return (
            f"ours vs float64 {self.ours:.3e} (bound {self.bound:.3e} = {ROUNDING_FACTOR} x transformers' own "
            f"fp32 rounding {self.rounding:.3e}); ours vs transformers fp32 {self.direct:.3e}; logits up to "
            f"{self.scale:.2f}"
        )


@torch.inference_mode()
def logits_parity(ours: HybridModel, path, ids: torch.Tensor) -> Parity:
    """Compare ``ours`` with transformers' model of the checkpoint at ``path`` on ``ids``."""
    got = ours(ids).double()
    want32 = load_reference(path, torch.float32)(ids, use_cache=False).logits.double()
    want64 = load_reference(path, torch.float64)(ids, use_cache=False).logits.double()
    return Parity(
        ours=float((got - want64).abs().max()),
        rounding=float((want32 - want64).abs().max()),
        direct=float((got - want32).abs().max()),
        scale=float(want64.abs().max()),
    )


def assert_matches_transformers(ours: HybridModel, path, ids: torch.Tensor) -> Parity:
    """``logits_parity`` that fails with every figure in its message."""
    parity = logits_parity(ours, path, ids)
    assert parity.holds, str(parity)
    return parity


@torch.inference_mode()
def rounding_bound(model: HybridModel, ids: torch.Tensor) -> float:
    """How far two fp32 paths through ``model`` to the same logits may differ on this CPU.

    A float64 copy of ``model`` stands in for the exact value; parts of the runtime keep fp32 on
    purpose (recurrent states), so the copy is not exact either, but its distance from the fp32 model is
    the size of the rounding that a split prefill, a token-by-token decode or a fused forward re-orders.
    """
    got = model(ids).double()
    exact = copy.deepcopy(model).double()(ids)
    return ROUNDING_FACTOR * max(float((got - exact).abs().max()), RELATIVE_FLOOR * float(exact.abs().max()))


class _TopkRecorder(TorchFunctionMode):
    """Records the scores and ``k`` of every top-k call: the routing decisions of any router."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch.Tensor, int]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.topk, torch.Tensor.topk):
            k = args[1] if len(args) > 1 else kwargs["k"]
            self.calls.append((args[0].detach().double().clone(), int(k)))
        return func(*args, **kwargs)


@torch.inference_mode()
def routing_margin(model: HybridModel, ids: torch.Tensor) -> float:
    """The smallest ratio, over every top-k decision of a forward on ``ids``, of the margin between the
    k-th and the (k+1)-th score (in float64) to that row's fp32 rounding; ``inf`` without routing."""
    runs = []
    for m in (model, copy.deepcopy(model).double()):
        with _TopkRecorder() as recorder:
            m(ids)
        runs.append(recorder.calls)
    worst = float("inf")
    for (s32, k), (s64, _) in zip(*runs, strict=True):
        if k >= s64.shape[-1]:
            continue
        top = s64.sort(dim=-1, descending=True).values
        margin = top[..., k - 1] - top[..., k]
        rounding = (s32 - s64).abs().amax(dim=-1).clamp_min(torch.finfo(torch.float32).tiny)
        worst = min(worst, float((margin / rounding).min()))
    return worst


def well_conditioned_ids(model: HybridModel, shape: tuple[int, int], seed: int = 1, tries: int = 20) -> torch.Tensor:
    """Random token ids from the first seed at or after ``seed`` whose routing has no near-tie."""
    for s in range(seed, seed + tries):
        ids = torch.randint(0, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(s))
        if routing_margin(model, ids) >= ROUTING_MARGIN:
            return ids
    raise AssertionError(f"no seed in {seed}..{seed + tries - 1} gives a routing margin of {ROUTING_MARGIN}x")


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
