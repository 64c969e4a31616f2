"""Weights from (sharded) safetensors by their Hugging Face names.

Checkpoints come in several spellings of the same tensors; each is mapped onto the runtime's one
layout before loading, and anything missing, misshaped or unrecognised is a ``ValueError`` that
names the tensor:

- Qwen3.5 multimodal checkpoints nest the text model under ``model.language_model.``;
- Qwen3-Next fuses and interleaves the Gated DeltaNet projections per key-head group;
- MoE experts are stored one module each or already stacked.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch
from safetensors import safe_open

from hypic_rag.kernels.rope import rope_inv_freq

from .config import HybridConfig
from .model import _EMBEDDINGS, HybridModel

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
_JAMBA_EXPERT_RE = re.compile(
    r"^(model\.layers\.\d+\.feed_forward\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$"
)
_EXPERT_RE = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")


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


def _split_qwen3_next_projections(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """``in_proj_qkvz``/``in_proj_ba`` are laid out per key-head group as [q | k | v | z] and [b | a]."""
    nk, dk, dv = config.linear_num_key_heads, config.linear_key_head_dim, config.linear_value_head_dim
    r = config.linear_num_value_heads // nk
    for name in [n for n in tensors if n.endswith("linear_attn.in_proj_qkvz.weight")]:
        prefix = name[: -len("in_proj_qkvz.weight")]
        w = tensors.pop(name)
        if w.dim() != 2 or w.shape[0] != nk * (2 * dk + 2 * r * dv):
            raise ValueError(f"weight {name} has shape {tuple(w.shape)}, which does not fit the config")
        q, k, v, z = w.view(nk, 2 * dk + 2 * r * dv, -1).split((dk, dk, r * dv, r * dv), dim=1)
        hidden = w.shape[1]
        tensors[prefix + "in_proj_qkv.weight"] = torch.cat(
            (q.reshape(-1, hidden), k.reshape(-1, hidden), v.reshape(-1, hidden))
        )
        tensors[prefix + "in_proj_z.weight"] = z.reshape(-1, hidden)
        ba_name = prefix + "in_proj_ba.weight"
        if ba_name not in tensors:
            raise ValueError(f"missing weight {ba_name}")
        ba = tensors.pop(ba_name)
        if ba.dim() != 2 or ba.shape[0] != 2 * nk * r:
            raise ValueError(f"weight {ba_name} has shape {tuple(ba.shape)}, which does not fit the config")
        b, a = ba.view(nk, 2 * r, -1).split((r, r), dim=1)
        tensors[prefix + "in_proj_b.weight"] = b.reshape(-1, hidden)
        tensors[prefix + "in_proj_a.weight"] = a.reshape(-1, hidden)


def _expert_groups(
    tensors: dict[str, torch.Tensor], config: HybridConfig, pattern: re.Pattern[str], parts: tuple[str, ...]
) -> dict[str, list[dict[str, torch.Tensor]]]:
    """Experts stored one module each: the tensors ``pattern`` matches (groups: prefix, expert, part) are
    taken out and checked (experts 0..E-1, each with all of ``parts``); per prefix, the experts in order."""
    found: dict[str, dict[int, dict[str, torch.Tensor]]] = {}
    for name in [n for n in tensors if pattern.match(n)]:
        m = pattern.match(name)
        assert m is not None
        found.setdefault(m.group(1), {}).setdefault(int(m.group(2)), {})[m.group(3)] = tensors.pop(name)
    groups = {}
    for prefix, experts in found.items():
        ids = sorted(experts)
        if ids != list(range(config.num_experts)):
            raise ValueError(f"{prefix} holds experts {ids[:5]}..., expected 0..{config.num_experts - 1}")
        for e in ids:
            absent = set(parts) - experts[e].keys()
            if absent:
                raise ValueError(f"missing weight {prefix}.{e}.{sorted(absent)[0]}.weight")
        groups[prefix] = [experts[e] for e in ids]
    return groups


def _stack_experts(
    tensors: dict[str, torch.Tensor], config: HybridConfig, pattern: re.Pattern[str] = _EXPERT_RE
) -> None:
    """Gated experts stored one module each (Qwen's, Ring-linear's; Jamba's under ``feed_forward``):
    ``gate_up_proj [E, 2I, H]`` and ``down_proj``."""
    for prefix, experts in _expert_groups(tensors, config, pattern, ("gate_proj", "up_proj", "down_proj")).items():
        tensors[prefix + ".gate_up_proj"] = torch.stack([torch.cat((x["gate_proj"], x["up_proj"])) for x in experts])
        tensors[prefix + ".down_proj"] = torch.stack([x["down_proj"] for x in experts])


_NEMOTRON_EXPERT_RE = re.compile(r"^(backbone\.layers\.\d+\.mixer\.experts)\.(\d+)\.(up_proj|down_proj)\.weight$")


def _stack_nemotron_experts(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Nemotron-H checkpoints store each (ungated, ReLU²) expert's ``up_proj``/``down_proj`` apart."""
    for prefix, experts in _expert_groups(tensors, config, _NEMOTRON_EXPERT_RE, ("up_proj", "down_proj")).items():
        for proj in ("up_proj", "down_proj"):
            tensors[f"{prefix}.{proj}"] = torch.stack([x[proj] for x in experts])


# Granite-4.0-H checkpoints name its MoE as the original release did; transformers renames on load.
_GRANITE_RENAMES = (
    (".block_sparse_moe.input_linear.weight", ".block_sparse_moe.experts.gate_up_proj"),
    (".block_sparse_moe.output_linear.weight", ".block_sparse_moe.experts.down_proj"),
    (".block_sparse_moe.router.layer.weight", ".block_sparse_moe.router.weight"),
)


_MINIMAX_BUFFERS = ("slope_rate", "query_decay", "key_decay", "diagonal_decay")


def _minimax_names(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """MiniMax checkpoints keep Mixtral's names (``block_sparse_moe``, experts' ``w1``/``w2``/``w3``) and the
    Lightning layers' decay tables, which the runtime recomputes."""
    for name in [n for n in tensors if n.rsplit(".", 1)[-1] in _MINIMAX_BUFFERS]:
        del tensors[name]
    _merge_expert_modules(tensors, config, "block_sparse_moe", "mlp")


def _kimi_names(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Kimi Linear checkpoints keep the forget gate's tensors on the attention module, one short conv each for
    q, k and v, and DeepSeek's expert names (``block_sparse_moe``, ``w1``/``w2``/``w3``)."""
    for name in list(tensors):
        for part in ("f_a_proj", "f_b_proj", "dt_bias", "A_log"):
            old = f".self_attn.{part}"
            if old + "." in name or name.endswith(old):
                tensors[name.replace(old, f".self_attn.forget_gate.{part}")] = tensors.pop(name)
    for name in [n for n in tensors if n.endswith(".self_attn.q_conv1d.weight")]:
        prefix = name[: -len("q_conv1d.weight")]
        parts = [tensors.pop(prefix + f"{p}_conv1d.weight", None) for p in "qkv"]
        if any(p is None for p in parts):
            raise ValueError(f"{prefix}: q_conv1d, k_conv1d and v_conv1d must all be present")
        tensors[prefix + "conv1d.weight"] = torch.cat(parts)
    _merge_expert_modules(tensors, config, "block_sparse_moe", "mlp")


def _merge_expert_modules(tensors: dict[str, torch.Tensor], config: HybridConfig, old: str, new: str) -> None:
    """Experts stored one module each as ``w1`` (gate), ``w3`` (up), ``w2`` (down) under ``old``, stacked into
    ``new.experts.gate_up_proj`` / ``down_proj``; the rest of ``old`` renamed to ``new``."""
    pattern = re.compile(rf"^(model\.layers\.\d+)\.{old}\.experts\.(\d+)\.(w1|w2|w3)\.weight$")
    for layer, experts in _expert_groups(tensors, config, pattern, ("w1", "w2", "w3")).items():
        tensors[f"{layer}.{new}.experts.gate_up_proj"] = torch.stack([torch.cat((x["w1"], x["w3"])) for x in experts])
        tensors[f"{layer}.{new}.experts.down_proj"] = torch.stack([x["w2"] for x in experts])
    for name in [n for n in tensors if f".{old}." in n]:
        tensors[name.replace(f".{old}.", f".{new}.")] = tensors.pop(name)


# OLMo hybrid's Gated DeltaNet projections, as this runtime's fused layout takes them.
_OLMO_LINEAR = (("g_proj", "in_proj_z"), ("b_proj", "in_proj_b"), ("a_proj", "in_proj_a"), ("o_proj", "out_proj"),
                ("o_norm", "norm"))  # fmt: skip


def _olmo_hybrid_names(tensors: dict[str, torch.Tensor]) -> None:
    """OLMo hybrid keeps q, k, v (and their convs) apart and names its norms as OLMo-core does."""
    for name in list(tensors):
        new = name.replace("attention_layer_norm", "input_layernorm").replace(
            "feedforward_layer_norm", "post_attention_layernorm"
        )
        if new != name:
            tensors[new] = tensors.pop(name)
    for name in [n for n in tensors if n.endswith(".linear_attn.q_proj.weight")]:
        prefix = name[: -len("q_proj.weight")]
        fusions = ((("q_proj", "k_proj", "v_proj"), "in_proj_qkv"), (("q_conv1d", "k_conv1d", "v_conv1d"), "conv1d"))
        for parts, fused in fusions:
            found = [tensors.pop(f"{prefix}{p}.weight", None) for p in parts]
            if all(f is not None for f in found):
                tensors[f"{prefix}{fused}.weight"] = torch.cat(found)
            elif any(f is not None for f in found):
                raise ValueError(f"{prefix}: {', '.join(parts)} must all be present")
        for old, new in _OLMO_LINEAR:
            if f"{prefix}{old}.weight" in tensors:
                tensors[f"{prefix}{new}.weight"] = tensors.pop(f"{prefix}{old}.weight")


def _fold_falcon_multipliers(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Falcon-H1's μP multipliers, folded into the weights they scale, so its layers are plain: the Mamba input
    (``ssm_in``, weights only) and each block of its projection's rows (``ssm_multipliers``: z, x, B, C, dt),
    its output (``ssm_out``), the attention input (``attention_in``, weights only), keys (``key``), output
    (``attention_out``), and the MLP's gate and down projections (``mlp_multipliers``). Exact up to rounding."""
    raw = config.raw
    ssm = [float(m) for m in raw.get("ssm_multipliers") or [1.0] * 5]
    mlp = [float(m) for m in raw.get("mlp_multipliers") or [1.0, 1.0]]
    ssm_in, ssm_out = float(raw.get("ssm_in_multiplier", 1.0)), float(raw.get("ssm_out_multiplier", 1.0))
    att_in, att_out = float(raw.get("attention_in_multiplier", 1.0)), float(raw.get("attention_out_multiplier", 1.0))
    key = float(raw.get("key_multiplier", 1.0))
    if len(ssm) != 5 or len(mlp) != 2:
        raise ValueError("ssm_multipliers must hold 5 numbers and mlp_multipliers 2")
    inner, gn = config.mamba_intermediate, config.mamba_n_groups * config.ssm_state_size
    blocks = (inner, inner, gn, gn, config.mamba_num_heads)
    rows = torch.cat([torch.full((n,), m) for n, m in zip(blocks, ssm, strict=True)])
    scale = {  # suffix: (factor on the weight, factor on the bias), per output row where a tensor
        "mamba.in_proj": (rows[:, None] * ssm_in, rows),
        "mamba.out_proj": (ssm_out, ssm_out),
        "self_attn.q_proj": (att_in, 1.0),
        "self_attn.k_proj": (att_in * key, key),
        "self_attn.v_proj": (att_in, 1.0),
        "self_attn.o_proj": (att_out, att_out),
        "feed_forward.gate_proj": (mlp[0], mlp[0]),
        "feed_forward.down_proj": (mlp[1], mlp[1]),
    }
    for name in list(tensors):
        for suffix, (on_weight, on_bias) in scale.items():
            for kind, factor in (("weight", on_weight), ("bias", on_bias)):
                if name.endswith(f".{suffix}.{kind}"):
                    t = tensors[name]
                    tensors[name] = (t.float() * factor).to(t.dtype)


def _ring_names(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Ring-linear-2.0 stores experts one module each, the router's bias as ``expert_bias`` (absent when the
    bias is off), and the Lightning layers' slopes and RoPE tables, which the runtime recomputes."""
    for name in [n for n in tensors if n.rsplit(".", 1)[-1] in ("slope", "slopes", "inv_freq")]:
        del tensors[name]
    for name in [n for n in tensors if n.endswith(".mlp.gate.expert_bias")]:
        tensors[name.replace(".expert_bias", ".e_score_correction_bias")] = tensors.pop(name)
    for name in [n for n in tensors if n.endswith(".mlp.gate.weight")]:
        bias = name.replace(".weight", ".e_score_correction_bias")
        tensors.setdefault(bias, torch.zeros(config.num_experts))
    _stack_experts(tensors, config)


def _ling_names(tensors: dict[str, torch.Tensor], config: HybridConfig) -> None:
    """Ling 3.0 (``bailing_hybrid``) as its checkpoints lay it out: Ring-linear's MoE names and one short conv
    each for q, k and v (concatenated here into the one depthwise conv)."""
    for name in [n for n in tensors if n.endswith(".attention.q_conv1d.weight")]:
        prefix = name[: -len("q_conv1d.weight")]
        parts = [tensors.pop(prefix + f"{p}_conv1d.weight", None) for p in "qkv"]
        if any(p is None for p in parts):
            raise ValueError(f"{prefix}: q_conv1d, k_conv1d and v_conv1d must all be present")
        tensors[prefix + "conv1d.weight"] = torch.cat(parts)
    _ring_names(tensors, config)


def canonical_state_dict(tensors: dict[str, torch.Tensor], config: HybridConfig) -> dict[str, torch.Tensor]:
    """Map any supported spelling of the checkpoint onto the runtime's parameter names."""
    out = {}
    for name, t in tensors.items():
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model.") :]
        out[name] = t
    if config.model_type == "olmo_hybrid":
        _olmo_hybrid_names(out)
    elif config.mixer == "gated_deltanet":
        _split_qwen3_next_projections(out, config)
        _stack_experts(out, config)
    elif config.model_type == "nemotron_h":
        _stack_nemotron_experts(out, config)
    elif config.model_type == "minimax":
        _minimax_names(out, config)
    elif config.model_type == "falcon_h1":
        _fold_falcon_multipliers(out, config)
    elif config.model_type == "bailing_moe_linear":
        _ring_names(out, config)
    elif config.model_type == "bailing_hybrid":
        _ling_names(out, config)
    elif config.model_type == "jamba":
        _stack_experts(out, config, _JAMBA_EXPERT_RE)
    elif config.model_type == "kimi_linear":
        _kimi_names(out, config)
    elif config.model_type == "granitemoehybrid":
        for name in list(out):
            for old, new in _GRANITE_RENAMES:
                if name.endswith(old):
                    out[name[: -len(old)] + new] = out.pop(name)
    embedding = _EMBEDDINGS.get(config.model_type, "model.embed_tokens.weight")
    if config.tie_word_embeddings and embedding in out:
        out["lm_head.weight"] = out[embedding]
    return out


# Parameters transformers keeps in fp32 whatever the model's dtype (its ``_keep_in_fp32_modules_strict``):
# routers and their score biases, where a rounded bias picks other experts, and KDA's gate bias. Ring-linear's
# ports keep its router bias in fp32 as well.
_FP32_PARAMS = {
    "nemotron_h": ("e_score_correction_bias", "gate.weight"),
    "kimi_linear": ("e_score_correction_bias", "gate.weight", "dt_bias"),
    "bailing_moe_linear": ("e_score_correction_bias", "gate.weight"),
    "bailing_hybrid": ("e_score_correction_bias", "gate.weight"),
}


def _dtype_of(name: str, config: HybridConfig, dtype: torch.dtype) -> torch.dtype:
    keep = _FP32_PARAMS.get(config.model_type, ())
    return torch.float32 if any(name.endswith(k) for k in keep) else dtype


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> HybridModel:
    """Build the runtime model for the checkpoint in ``path``."""
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"checkpoint directory {path} does not exist")
    config = HybridConfig.from_file(path)
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
    params = {name: state[name].to(device=device, dtype=_dtype_of(name, config, dtype)) for name in expected}
    if config.tie_word_embeddings:
        params["lm_head.weight"] = params[model.embedding_name]
    model.load_state_dict(params, assign=True, strict=False)
    model.inv_freq = rope_inv_freq(config.rotary_dim, config.rope_theta).to(device)  # the buffer was built on meta
    model.eval()
    model.requires_grad_(False)
    return model
