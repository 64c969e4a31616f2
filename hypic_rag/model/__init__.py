"""The hybrid-model runtime: configuration, layers, request state and checkpoint loading."""

from .config import FULL, LINEAR, HybridConfig
from .families import SUPPORTED_MODEL_TYPES
from .loading import load_model
from .model import HybridModel
from .state import AttentionLayerKV, LinearLayerState, RequestState, SegmentJumps, TransitionCapture

__all__ = [
    "FULL",
    "LINEAR",
    "SUPPORTED_MODEL_TYPES",
    "AttentionLayerKV",
    "HybridConfig",
    "HybridModel",
    "LinearLayerState",
    "RequestState",
    "SegmentJumps",
    "TransitionCapture",
    "load_model",
]
