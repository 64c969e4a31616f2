"""What a checkpoint's ``generation_config.json`` says about decoding: its sampling defaults and its
end-of-sequence ids.

Model authors tune these per checkpoint (Qwen's instruct models ship a temperature, top-p and top-k),
so a chat with no explicit settings should follow them. Only the fields we apply are read; the rest of
the file (``max_length``, beam settings, ...) is ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["GENERATION_CONFIG", "GenerationDefaults", "eos_token_ids", "read_generation_defaults"]

GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class GenerationDefaults:
    """A checkpoint's decoding defaults; ``None`` where the file does not say.

    ``do_sample=False`` means greedy whatever ``temperature`` says, as in transformers: whoever applies
    these treats the temperature as 0 then (``effective_temperature`` does). ``top_k`` 0 means off.
    Fields the file leaves out stay ``None`` rather than taking transformers' defaults (top_k 50,
    temperature 1.0): the caller's own defaults apply there. ``options.RequestOptions.with_defaults``
    applies them to a request.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    do_sample: bool | None = None

    @property
    def effective_temperature(self) -> float | None:
        """The temperature to sample with: 0 (greedy) when ``do_sample`` is false, else ``temperature``."""
        return 0.0 if self.do_sample is False else self.temperature


def _read(path: Path) -> dict[str, Any] | None:
    """The parsed ``generation_config.json`` of checkpoint directory ``path``, or None without one."""
    file = path / GENERATION_CONFIG
    if not file.is_file():
        return None
    try:
        data = json.loads(file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{file} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{file} must hold a JSON object, got {type(data).__name__}")
    return data


def _number(file: Path, data: dict[str, Any], field: str, lo: float, hi: float, lo_open: bool) -> float | None:
    value = data.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{file}: {field} must be a number, got {value!r}")
    if not ((lo < value) if lo_open else (lo <= value)) or value > hi:
        bound = f"{'(' if lo_open else '['}{lo}, {hi}]"
        raise ValueError(f"{file}: {field} must be in {bound}, got {value!r}")
    return float(value)


def _integer(file: Path, data: dict[str, Any], field: str, lo: int) -> int | None:
    value = data.get(field)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{file}: {field} must be an integer, got {value!r}")
    if value < lo:
        raise ValueError(f"{file}: {field} must be >= {lo}, got {value!r}")
    return value


def read_generation_defaults(path: Path) -> GenerationDefaults:
    """The decoding defaults of checkpoint directory ``path``; all ``None`` without the file.

    A malformed file or a wrongly typed or out-of-range field raises ``ValueError`` naming both, so a
    bad checkpoint fails at load rather than at its first request."""
    data = _read(Path(path))
    if data is None:
        return GenerationDefaults()
    file = Path(path) / GENERATION_CONFIG
    do_sample = data.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"{file}: do_sample must be true or false, got {do_sample!r}")
    return GenerationDefaults(
        temperature=_number(file, data, "temperature", 0.0, float("inf"), lo_open=False),
        top_p=_number(file, data, "top_p", 0.0, 1.0, lo_open=True),
        top_k=_integer(file, data, "top_k", 0),
        max_new_tokens=_integer(file, data, "max_new_tokens", 1),
        do_sample=do_sample,
    )


def eos_token_ids(path: Path, config_eos: tuple[int, ...]) -> tuple[int, ...]:
    """EOS ids of ``generation_config.json`` and ``config.json`` together: chat checkpoints often list
    their end-of-turn token only in the former, and stopping at either is what transformers does."""
    ids = list(config_eos)
    data = _read(Path(path))
    eos = data.get("eos_token_id") if data is not None else None
    for i in eos if isinstance(eos, list) else [] if eos is None else [eos]:
        if isinstance(i, bool) or not isinstance(i, int):
            raise ValueError(f"{Path(path) / GENERATION_CONFIG}: eos_token_id must be an integer or a list of them")
        if i not in ids:
            ids.append(i)
    return tuple(ids)
