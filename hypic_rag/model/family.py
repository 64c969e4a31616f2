"""What one model family declares. The runtime reads, builds and loads a checkpoint of any family through
this and nothing else; ``families`` holds one module per family, each ending in ``FAMILIES``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from .layers import PlainRMSNorm
from .mixers import NAMES as MIXER_NAMES

if TYPE_CHECKING:
    from .config import HybridConfig


def _no_checks(config: HybridConfig) -> None:
    pass


def _names_as_they_are(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    pass


@dataclass(frozen=True)
class Family:
    """One family of checkpoints.

    - ``model_types``: the ``config.json`` model types it reads (wrappers such as ``qwen3_5`` included).
    - ``mixer``: its linear layers' token mixer, one of ``mixers.NAMES``.
    - ``read_config(cls, data)``: the ``HybridConfig`` of a ``config.json`` object, the family's defaults
      (transformers') applied; ``ValueError`` for what the runtime cannot run.
    - ``layer(config, idx)``: decoder layer ``idx``, a module with ``is_linear``, ``linear_mixer`` (the
      linear layers' token mixer) and ``forward(x, ctx)`` (``context.Forward``).
    - ``root``, ``embeddings``, ``final_norm``: where the stack sits, as the checkpoints name it
      (``{root}.{embeddings}``, ``{root}.layers.N``, ``{root}.{final_norm}``); ``norm``, the final norm's class.
    - ``linear_sizes``: config fields that must be >= 1 when the model has linear layers; ``validate(config)``:
      the family's other checks (``reading.check_*``).
    - ``map_weights(tensors, config)``: maps the checkpoint's tensor names and layouts onto the runtime's
      parameters, in place (fused projections split, experts stacked, renamed modules).
    - ``fp32_params``: suffixes of parameters kept in fp32 whatever the model's dtype, as transformers keeps
      them (its ``_keep_in_fp32_modules_strict``): routers and their score biases, where a rounded bias picks
      other experts.
    """

    model_types: tuple[str, ...]
    mixer: str
    read_config: Callable[[type[HybridConfig], dict[str, Any]], HybridConfig]
    layer: Callable[[HybridConfig, int], nn.Module]
    root: str = "model"
    embeddings: str = "embed_tokens"
    final_norm: str = "norm"
    norm: Callable[[int, float], nn.Module] = PlainRMSNorm
    linear_sizes: tuple[str, ...] = ()
    validate: Callable[[HybridConfig], None] = _no_checks
    map_weights: Callable[[dict[str, torch.Tensor], HybridConfig], None] = _names_as_they_are
    fp32_params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.model_types:
            raise ValueError("a family reads at least one model_type")
        if self.mixer not in MIXER_NAMES:
            raise ValueError(f"family {self.model_types[0]!r}: unknown mixer {self.mixer!r}; expected {MIXER_NAMES}")

    @property
    def embedding_weight(self) -> str:
        """The input embedding's parameter name (an LM head tied to it loads from it)."""
        return f"{self.root}.{self.embeddings}.weight"
