"""Chat support for real checkpoints: render their own chat templates as transformers does."""

from .template import ChatTemplate

__all__ = ["ChatTemplate"]
