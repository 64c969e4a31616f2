"""Chat on real checkpoints: their own templates rendered as transformers does (``template``), the
rendered prompt cut into segments (``segmentation``), what a template implies for generation
(``conversation``), the tool-call formats, one module each (``formats``), and an answer split into
reasoning, content and calls (``tool_calls``)."""

from .formats import ChatFormat, detect_format, format_tool_result
from .segmentation import RenderedPrompt, content_pieces, plain_messages, segment_prompt
from .template import ChatTemplate
from .tool_calls import ParsedOutput, parse_output

__all__ = [
    "ChatFormat",
    "ChatTemplate",
    "ParsedOutput",
    "RenderedPrompt",
    "content_pieces",
    "detect_format",
    "format_tool_result",
    "parse_output",
    "plain_messages",
    "segment_prompt",
]
