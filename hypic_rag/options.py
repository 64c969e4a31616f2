"""Every per-request option in one place: what it means, its default, and the check a bad value fails.

``Engine.generate``/``start``/``chat``/``start_chat`` take these as keyword arguments (or a ready
``RequestOptions`` as ``options=``); the HTTP server, LangChain and LlamaIndex build a ``RequestOptions`` from
their own fields (``from_mapping``, which also knows the names OpenAI's API gives them) and hand it to the
engine. None of them lists the options again: they read them from here (``OPTIONS``).

A value is checked when the ``RequestOptions`` is made, so a bad one fails where it was given, with a
``OptionError`` (a ``ValueError``) that names it. The sampling settings left ``None`` are filled in one place,
``with_defaults``: the checkpoint's ``generation_config.json`` for chat, fixed defaults for ``generate``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .chat.segmentation import SEGMENTATIONS, check_segmentation, check_template_kwargs

if TYPE_CHECKING:
    from .generation_config import GenerationDefaults

AUTO = "auto"
BLEND = "blend"
ADAPTIVE = (AUTO, BLEND)  # seams whose widths a probe chooses, per boundary (``plan.choose_widths``)


def check_seam(seam: object) -> None:
    """A token count, a fraction in [0, 1], ``"auto"`` or ``"blend"``; anything else is a ``ValueError``."""
    if seam in ADAPTIVE:
        return
    if isinstance(seam, bool) or not isinstance(seam, (int, float)) or not math.isfinite(seam) or seam < 0:
        raise ValueError(f'seam must be a token count, a fraction in [0, 1], "auto" or "blend", got {seam!r}')
    if isinstance(seam, float) and seam > 1:
        raise ValueError(f"a fractional seam must be in [0, 1], got {seam}")


MODES = ("full", "prefix", "pic", "hypic")
COMPOSED = ("pic", "hypic")  # the modes that look segments up in the cache; ``full`` and ``prefix`` never do

# Names OpenAI's API (and the frameworks after it) give an option, for ``from_mapping``; the first one
# listed for an option is how LangChain and LlamaIndex fields spell it.
SPELLINGS = {"max_tokens": "max_new_tokens", "max_completion_tokens": "max_new_tokens"}

# What a request leaves unset and no ``generation_config.json`` says: 64 tokens, greedy, no truncation.
FALLBACK = {"max_new_tokens": 64, "temperature": 0.0, "top_p": 1.0, "top_k": None}


class OptionError(ValueError):
    """A request option with a bad value; ``option`` is its name as the caller spelled it."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_mode(mode: Any) -> None:
    if mode not in MODES:
        raise OptionError("mode", f"unknown mode {mode!r}; expected one of {', '.join(MODES)}")


def check_sampling(temperature: Any, top_p: Any, top_k: Any, seed: Any) -> None:
    """The sampling settings' rules (``None`` passes: unset), for ``RequestOptions`` and ``decoding.Sampler``."""
    if temperature is not None and not (_number(temperature) and temperature >= 0):
        raise OptionError("temperature", f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_p is not None and not (_number(top_p) and 0 < top_p <= 1):
        raise OptionError("top_p", f"top_p must be a number in (0, 1], got {top_p!r}")
    if top_k is not None and not (_integer(top_k) and top_k >= 0):
        raise OptionError("top_k", f"top_k must be an integer >= 0 (0 or None: off), got {top_k!r}")
    if seed is not None and not (_integer(seed) and -(2**63) <= seed < 2**64):
        raise OptionError("seed", f"seed must be an integer that fits in 64 bits, or None, got {seed!r}")


# Every generated token is matched against the stop strings' tails, so their total length bounds that work.
STOP_CHARS = 4096


def _strings(name: str, value: Any) -> tuple[str, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) for s in value):
        raise OptionError(name, f"{name} must be a list of strings, got {value!r:.80}")
    return tuple(value)


def _ids(name: str, value: Any) -> tuple[int, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not all(_integer(i) and i >= 0 for i in value):
        raise OptionError(name, f"{name} must be a list of token ids (integers >= 0), got {value!r:.80}")
    return tuple(value)


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


def _chat(help: str) -> Any:
    """Metadata of an option only chat requests read (the rendering of messages)."""
    return {"help": help, "chat": True}


@dataclass(frozen=True)
class RequestOptions:
    """The options of one request. ``None`` means unset: the engine's seam, the checkpoint's sampling
    defaults (``with_defaults``)."""

    mode: str = field(default="hypic", metadata={"help": "full | prefix | pic | hypic"})
    seam: int | float | str | None = field(
        default=None,
        metadata={"help": 'tokens (or a fraction of each segment) recomputed at a boundary, or "auto": per boundary'},
    )
    max_new_tokens: int | None = field(default=None, metadata={"help": "at most this many tokens"})
    temperature: float | None = field(default=None, metadata={"help": "0: greedy"})
    top_p: float | None = field(default=None, metadata={"help": "nucleus truncation, in (0, 1]"})
    top_k: int | None = field(default=None, metadata={"help": "keep the k likeliest tokens; 0: off"})
    seed: int | None = field(default=None, metadata={"help": "makes sampling reproducible"})
    stop: tuple[str, ...] | None = field(default=None, metadata={"help": "strings the answer ends before"})
    stop_token_ids: tuple[int, ...] | None = field(default=None, metadata={"help": "ids that end the answer"})
    min_p: float | None = field(default=None, metadata={"help": "drop tokens under min_p times the likeliest's p"})
    presence_penalty: float | None = field(
        default=None, metadata={"help": "subtracted from a written token's logit, in [-2, 2]"}
    )
    frequency_penalty: float | None = field(
        default=None, metadata={"help": "subtracted per time a token was written, in [-2, 2]"}
    )
    repetition_penalty: float | None = field(
        default=None, metadata={"help": "divides seen tokens' positive logits (> 0; 1: off)"}
    )
    logprobs: bool = field(default=False, metadata={"help": "return each chosen token's log-probability"})
    top_logprobs: int | None = field(
        default=None, metadata={"help": "and this many likeliest alternatives (0..20; needs logprobs)"}
    )
    response_format: Mapping[str, Any] | None = field(
        default=None, metadata={"help": "text | json_object | json_schema (OpenAI's shape): the answer's grammar"}
    )
    segmentation: str = field(default="auto", metadata=_chat("explicit | auto | none: how messages become segments"))
    chat_template_kwargs: Mapping[str, Any] | None = field(
        default=None, metadata=_chat("extra template variables, e.g. {'enable_thinking': False}")
    )

    # Read by the composed modes: what an "auto" seam may spend, and the guard on the estimated deviation.
    seam_budget: float | None = field(
        default=None, metadata={"help": 'for seam "auto": mean tokens recomputed per boundary (default 8; inf: all)'}
    )
    fidelity_budget: float | None = field(
        default=None, metadata={"help": "widen the seams, or compute exactly, when the deviation estimate is above"}
    )

    def __post_init__(self) -> None:
        check_mode(self.mode)
        if self.seam is not None:
            try:
                check_seam(self.seam)
            except ValueError as exc:
                raise OptionError("seam", str(exc)) from None
        for name in ("seam_budget", "fidelity_budget"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0):
                raise OptionError(name, f"{name} must be a number >= 0 (inf: no limit), got {value!r}")
        tokens = self.max_new_tokens
        if tokens is not None and not (_integer(tokens) and tokens >= 1):
            raise OptionError("max_new_tokens", f"max_new_tokens must be an integer >= 1, got {tokens!r}")
        check_sampling(self.temperature, self.top_p, self.top_k, self.seed)
        object.__setattr__(self, "stop", _strings("stop", self.stop))
        if self.stop is not None and sum(map(len, self.stop)) > STOP_CHARS:
            raise OptionError(
                "stop", f"stop strings may hold {STOP_CHARS:,} characters in all, got {sum(map(len, self.stop)):,}"
            )
        object.__setattr__(self, "stop_token_ids", _ids("stop_token_ids", self.stop_token_ids))
        self._check_logits_options()
        try:
            check_segmentation(self.segmentation)
        except ValueError as exc:
            raise OptionError("segmentation", str(exc)) from None
        if self.chat_template_kwargs is not None:
            try:
                object.__setattr__(self, "chat_template_kwargs", check_template_kwargs(self.chat_template_kwargs))
            except ValueError as exc:
                raise OptionError("chat_template_kwargs", str(exc)) from None

    def _check_logits_options(self) -> None:
        """The penalties, ``min_p``, log-probabilities and ``response_format`` (``logits.Picker`` applies them)."""
        if self.min_p is not None and not (_number(self.min_p) and 0 <= self.min_p <= 1):
            raise OptionError("min_p", f"min_p must be a number in [0, 1], got {self.min_p!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if value is not None and not (_number(value) and -2 <= value <= 2):
                raise OptionError(name, f"{name} must be a number in [-2, 2], got {value!r}")
        rep = self.repetition_penalty
        if rep is not None and not (_number(rep) and rep > 0):
            raise OptionError("repetition_penalty", f"repetition_penalty must be a number > 0, got {rep!r}")
        if not isinstance(self.logprobs, bool):
            raise OptionError("logprobs", f"logprobs must be true or false, got {self.logprobs!r}")
        top = self.top_logprobs
        if top is not None and not (_integer(top) and 0 <= top <= 20):
            raise OptionError("top_logprobs", f"top_logprobs must be an integer in [0, 20], got {top!r}")
        if top is not None and not self.logprobs:
            raise OptionError("top_logprobs", "top_logprobs needs logprobs to be true")
        if self.response_format is not None:
            from .grammar import check_response_format

            try:
                object.__setattr__(self, "response_format", check_response_format(self.response_format))
            except ValueError as exc:
                raise OptionError("response_format", str(exc)) from None

    @classmethod
    def from_mapping(
        cls, values: Mapping[str, Any], *, base: RequestOptions | None = None, ignore_none: bool = False
    ) -> RequestOptions:
        """``base`` (or the defaults) with the options in ``values``, whose names may be OpenAI's (``SPELLINGS``).
        An unknown name, two names of one option that disagree, or a bad value is an ``OptionError`` that names
        it as given. ``ignore_none``: a ``None`` leaves the option as it was (as an unset wire field does)."""
        if base is not None and not isinstance(base, RequestOptions):
            raise OptionError("options", f"options must be a RequestOptions, got {type(base).__name__}")
        if isinstance(values, RequestOptions) or not isinstance(values, Mapping):
            raise OptionError("options", f"request options must be a mapping of names, got {type(values).__name__}")
        given: dict[str, Any] = {}
        spelled: dict[str, str] = {}
        for name, value in values.items():
            if ignore_none and value is None:
                continue
            option = SPELLINGS.get(name, name)
            if option not in OPTIONS:
                raise OptionError(name, f"{name!r} is not a request option; the options are {', '.join(OPTIONS)}")
            if option in given and given[option] != value:
                raise OptionError(name, f"{spelled[option]} and {name} disagree")
            given[option], spelled[option] = value, name
        if not given:
            return base or cls()
        try:
            return cls(**{**(base.as_dict() if base is not None else {}), **given})
        except OptionError as exc:
            name = spelled.get(exc.option, exc.option)
            raise OptionError(name, str(exc).replace(exc.option, name, 1)) from None

    def replace(self, **changes: Any) -> RequestOptions:
        """A copy with ``changes`` (names as ``from_mapping`` takes them), checked as any new one is."""
        return RequestOptions.from_mapping(changes, base=self)

    def as_dict(self) -> dict[str, Any]:
        """Every option by name (``None`` where unset)."""
        return {name: getattr(self, name) for name in OPTIONS}

    def with_defaults(self, defaults: GenerationDefaults | None = None) -> RequestOptions:
        """Each sampling setting left unset taken from ``defaults`` (a checkpoint's ``generation_config.json``),
        else from ``FALLBACK`` (64 tokens, greedy): the one place defaults are applied. ``do_sample: false``
        there means greedy whatever its temperature says, as in transformers."""
        own = (
            {
                "max_new_tokens": defaults.max_new_tokens,
                "temperature": defaults.effective_temperature,
                "top_p": defaults.top_p,
                "top_k": defaults.top_k,
            }
            if defaults is not None
            else {}
        )
        filled = {name: _first(getattr(self, name), own.get(name), fallback) for name, fallback in FALLBACK.items()}
        return dataclasses.replace(self, **filled)

    def chat_only(self) -> list[str]:
        """The chat-only options this request sets (``generate`` has no messages to apply them to)."""
        return [
            f.name for f in dataclasses.fields(self) if f.metadata.get("chat") and getattr(self, f.name) != f.default
        ]


OPTIONS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(RequestOptions))
"""Every option's name, in declaration order."""

__all__ = [
    "FALLBACK",
    "MODES",
    "OPTIONS",
    "SEGMENTATIONS",
    "SPELLINGS",
    "OptionError",
    "RequestOptions",
    "check_mode",
    "check_sampling",
]
