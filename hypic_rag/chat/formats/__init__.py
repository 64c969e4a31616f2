"""Chat formats, one module each: how a family of chat templates writes tool calls, and what its model reads.

- ``qwen3_json``: Qwen3 / Hermes, ``<tool_call>`` blocks holding ``{"name", "arguments"}`` JSON.
- ``qwen3_5_xml``: Qwen3.5 / Qwen3-Coder, ``<tool_call>`` blocks holding ``<function=NAME>`` and
  ``<parameter=KEY>`` elements.
- ``bundled``: the bundled model's compact JSON call, the whole answer or nothing.
- ``none`` (``base.NONE``): no tool calls; everything after the reasoning is content.

We parse these ourselves: no maintained standalone library parses Qwen's tool-call formats (vLLM's and SGLang's
parsers live inside those servers and take their request objects), and the bundled model has its own.
"""

from __future__ import annotations

from .base import NONE, ChatFormat, format_tool_result
from .bundled import BUNDLED
from .qwen3_5_xml import QWEN3_5_XML
from .qwen3_json import QWEN3_JSON

# In the order ``detect`` tries them: the bundled template also holds JSON, Qwen3.5's also ``<tool_call>``.
_DETECTION = (BUNDLED, QWEN3_5_XML, QWEN3_JSON)
FORMATS: dict[str, ChatFormat] = {f.name: f for f in (QWEN3_JSON, QWEN3_5_XML, BUNDLED, NONE)}


def detect(template_source: str | None) -> ChatFormat:
    """The format a chat template's answers use, from the tags the template itself renders."""
    source = template_source or ""
    for fmt in _DETECTION:
        if fmt.matches(source):
            return fmt
    if "tools" in source or "tool_calls" in source:
        return QWEN3_JSON  # the commonest format among templates that take tools
    return NONE


def detect_format(template_source: str | None) -> str:
    """The name of ``detect``'s format."""
    return detect(template_source).name


def get_format(fmt: str | ChatFormat) -> ChatFormat:
    """A format by name (``FORMATS``), or the format itself."""
    if isinstance(fmt, ChatFormat):
        return fmt
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValueError(f"unknown tool-call format {fmt!r}; expected one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


__all__ = [
    "BUNDLED",
    "FORMATS",
    "NONE",
    "QWEN3_5_XML",
    "QWEN3_JSON",
    "ChatFormat",
    "detect",
    "detect_format",
    "format_tool_result",
    "get_format",
]
