"""Chat on real checkpoints: their own templates rendered as transformers does (``template``), the
rendered prompt cut into segments (``segmentation``), what a template implies for generation
(``conversation``), and tool calls parsed in its format (``tool_calls``)."""

from .segmentation import RenderedPrompt, content_pieces, plain_messages, segment_prompt
from .template import ChatTemplate
from .tool_calls import ParsedOutput, detect_format, format_tool_result, parse_output

__all__ = [
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
