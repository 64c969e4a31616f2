"""Weights from (sharded) safetensors by their Hugging Face names.

Checkpoints come in several spellings of the same tensors; each family maps its own onto the runtime's one
layout (``Family.map_weights``: fused projections split, experts stacked, modules renamed) before loading,
and anything missing, misshaped or unrecognised is a ``ValueError`` that names the tensor. Multimodal
checkpoints nest the text model under ``model.language_model.``; vision towers and multi-token-prediction
heads are not read.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from hypic_rag.kernels.rope import rope_inv_freq

from .config import HybridConfig
from .families import config_from_file, family_of
from .model import HybridModel

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use float32, bfloat16 or float16")
        return dtype
    if dtype not in _DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {', '.join(_DTYPES)}")
    return _DTYPES[dtype]


def default_model_path() -> Path:
    """The checkpoint bundled inside the package."""
    return Path(__file__).resolve().parent.parent / "assets" / "default_model"


_IGNORED_PREFIXES = ("mtp.", "model.visual.", "visual.", "model.mtp.")


def checkpoint_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ValueError(f"{index} is not a valid safetensors index: {exc}") from exc
        files = sorted({path / name for name in weight_map.values()})
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ValueError(f"safetensors shards named in {index.name} are missing: {missing}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors weights in {path}")
    return files


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in checkpoint_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if not name.startswith(_IGNORED_PREFIXES):
                        tensors[name] = f.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types for a corrupt header
            raise ValueError(f"cannot read weights from {file}: {exc}") from exc
    return tensors


def canonical_state_dict(tensors: dict[str, torch.Tensor], config: HybridConfig) -> dict[str, torch.Tensor]:
    """Map any supported spelling of the checkpoint onto the runtime's parameter names."""
    out = {}
    for name, t in tensors.items():
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model.") :]
        out[name] = t
    family = family_of(config.model_type)
    family.map_weights(out, config)
    if config.tie_word_embeddings and family.embedding_weight in out:
        out["lm_head.weight"] = out[family.embedding_weight]
    return out


def _dtype_of(name: str, config: HybridConfig, dtype: torch.dtype) -> torch.dtype:
    """fp32 for the parameters the family keeps so (``Family.fp32_params``), else ``dtype``."""
    return torch.float32 if name.endswith(family_of(config.model_type).fp32_params) else dtype


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> HybridModel:
    """Build the runtime model for the checkpoint in ``path``."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint directory {path} does not exist")
    config = config_from_file(path)
    state = canonical_state_dict(read_tensors(path), config)
    with torch.device("meta"):
        model = HybridModel(config)
    expected = {name: p.shape for name, p in model.named_parameters()}
    missing = sorted(set(expected) - set(state))
    if missing:
        more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
        raise ValueError(f"checkpoint {path} is missing weights: {', '.join(missing[:5])}{more}")
    unexpected = sorted(set(state) - set(expected))
    if unexpected:
        more = f" (and {len(unexpected) - 5} more)" if len(unexpected) > 5 else ""
        raise ValueError(f"checkpoint {path} has weights this config does not use: {', '.join(unexpected[:5])}{more}")
    for name, shape in expected.items():
        if state[name].shape != shape:
            raise ValueError(
                f"weight {name} has shape {tuple(state[name].shape)}, expected {tuple(shape)} from the config"
            )
    # A tensor the checkpoint ties to several names (a family's map_weights may copy one name to others) is
    # converted once, so the names keep sharing it whatever the dtype or device.
    converted: dict[tuple[int, torch.dtype], torch.Tensor] = {}
    params = {}
    for name in expected:
        source, want = state[name], _dtype_of(name, config, dtype)
        key = (id(source), want)
        if key not in converted:
            converted[key] = source.to(device=device, dtype=want)
        params[name] = converted[key]
    if config.tie_word_embeddings:
        params["lm_head.weight"] = params[model.embedding_name]
    model.load_state_dict(params, assign=True, strict=False)
    model.inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta).to(device)  # the buffer was built on meta
    model.eval()
    model.requires_grad_(False)
    return model
