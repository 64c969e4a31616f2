"""The registry of model families: every module in this package that ends in ``FAMILIES`` is one family (or
a few that share their parts), and ``SUPPORTED_MODEL_TYPES`` is what they read.

config, model and loading hold no family's name: they ask ``family_of(model_type)`` for its config reader,
its layers, where its stack sits, how its checkpoints' weight names map onto the runtime's and which
parameters stay fp32 (``family.Family``). Shared parts exist once and families compose them: attention
(``attention``), the linear mixers (``mixers``), the norms, SwiGLU and MoE (``layers``), the pre-norm layer
(``block``), config-reading idioms (``families.reading``) and weight-name maps (``weight_names``).

Adding a family is one new file and its test entry:

1. ``families/<name>.py``: its defaults and ``read_config`` (over ``reading.merge`` and
   ``reading.common_fields``), its decoder layer (usually a ``block.PreNormLayer`` naming its parts as the
   checkpoints do), ``map_weights`` where its checkpoints' names differ from its modules', and at the end
   ``FAMILIES = (Family(model_types=("<model_type>",), mixer=..., read_config=..., layer=..., ...),)``.
   A field the runtime lacks goes on ``config.HybridConfig`` with a default that means "unused".
2. Its test entry: a tiny checkpoint in ``testing/synthetic.py`` (its name in ``KINDS``, its tiny config and
   transformers' class in ``build_reference_model``, and its model type in ``_PLAIN_NORM_FAMILIES`` when its
   norms apply the weight as stored); ``tests/model`` then checks its logits and greedy decoding against
   transformers, and ``tests/model/test_families.py`` that every family has such an entry and builds what it
   declares.
"""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any

from ..family import Family


def _collect() -> dict[str, Family]:
    found: dict[str, Family] = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        for family in getattr(module, "FAMILIES", ()):
            for model_type in family.model_types:
                if model_type in found:
                    raise ValueError(f"model_type {model_type!r} is declared twice (families.{info.name})")
                found[model_type] = family
    return found


_BY_MODEL_TYPE = _collect()
SUPPORTED_MODEL_TYPES: tuple[str, ...] = tuple(_BY_MODEL_TYPE)
FAMILIES: tuple[Family, ...] = tuple({id(f): f for f in _BY_MODEL_TYPE.values()}.values())


def family_of(model_type: Any) -> Family:
    """The family that reads ``model_type``; ``ValueError`` naming the supported ones otherwise."""
    if not isinstance(model_type, str) or model_type not in _BY_MODEL_TYPE:
        raise ValueError(f"unsupported model_type {model_type!r}: hypic-rag runs {', '.join(SUPPORTED_MODEL_TYPES)}")
    return _BY_MODEL_TYPE[model_type]


__all__ = ["FAMILIES", "SUPPORTED_MODEL_TYPES", "Family", "family_of"]
