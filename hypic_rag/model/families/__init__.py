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
import json
import pkgutil
from pathlib import Path
from typing import Any

from ..config import FULL, HYBRID, LINEAR, HybridConfig
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


def read_config(data: Any) -> HybridConfig:
    """A ``config.json`` object read by its family's reader; any field the runtime cannot run is a ``ValueError``
    that names the model type."""
    if not isinstance(data, dict):
        raise ValueError("config must be a JSON object")
    model_type = data.get("model_type")
    family = family_of(model_type)
    try:
        config = family.read_config(HybridConfig, data)
        _validate(config, family)
    except ValueError as exc:
        raise ValueError(f"invalid {model_type} config.json: {exc}") from exc
    except (TypeError, ZeroDivisionError, KeyError, AttributeError, IndexError) as exc:
        # A field of the wrong type, a zero size, a missing sub-field: the reader's arithmetic failed.
        raise ValueError(f"invalid {model_type} config.json: {type(exc).__name__}: {exc}") from exc
    return config


def config_from_file(path: str | Path) -> HybridConfig:
    """``read_config`` of a checkpoint's ``config.json`` (``path``: the file or its folder)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ValueError(f"no config.json at {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from exc
    return read_config(data)


def _validate(config: HybridConfig, family: Family) -> None:
    """The sizes every model needs, then the family's own checks (``Family.validate``)."""
    sizes = ["vocab_size", "hidden_size", "num_hidden_layers", "max_position_embeddings"]
    if FULL in config.layer_types or HYBRID in config.layer_types:
        sizes += ["num_attention_heads", "num_key_value_heads", "head_dim"]
    if LINEAR in config.layer_types or HYBRID in config.layer_types:
        sizes += family.linear_sizes
    for name in sizes:
        if getattr(config, name) < 1:
            raise ValueError(f"config {name} must be >= 1, got {getattr(config, name)}")
    if "num_key_value_heads" in sizes and config.num_attention_heads % config.num_key_value_heads:
        raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
    family.validate(config)


__all__ = ["FAMILIES", "SUPPORTED_MODEL_TYPES", "Family", "config_from_file", "family_of", "read_config"]
