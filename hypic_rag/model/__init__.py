"""The hybrid-model runtime: configuration, layers, cache and checkpoint loading."""

from .cache import AttentionLayerKV, HybridCache, LinearLayerState
from .config import FULL, LINEAR, SUPPORTED_MODEL_TYPES, HybridConfig
from .loading import load_model
from .model import HybridModel

__all__ = [
    "FULL",
    "LINEAR",
    "SUPPORTED_MODEL_TYPES",
    "AttentionLayerKV",
    "HybridCache",
    "HybridConfig",
    "HybridModel",
    "LinearLayerState",
    "load_model",
]
