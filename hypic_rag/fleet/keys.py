"""A chat request's segment keys, computed at a fleet's ingress without the model: the same keys a replica's
segment cache files the request's pieces under, whatever order they come in.

The ingress holds the checkpoint's tokenizer and chat template only; the key's other inputs (the weights'
fingerprint, the model's dtype, ``min_cached_tokens``) come once from a replica (``EngineReplica.describe``), so
the keys match what the replicas compute however they were configured. The steps are the engine's own
(``Engine.start_chat`` up to its plan): the body parsed as the server parses it, a JSON response format turned
into a tool as the bundled model takes it, the template rendered into pieces, each piece tokenized alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..cache.keys import segment_key
from ..chat.caller_text import literal_pieces
from ..chat.conversation import ChatSetup
from ..chat.grammar import schema_as_call
from ..chat.segmentation import segment_prompt
from ..chat.template import ChatTemplate
from ..chat.tool_calls import chosen_tool
from ..tokenizer import load_tokenizer

COMPOSED = ("pic", "hypic")  # the modes that look segments up; ``full`` and ``prefix`` never do


@dataclass(frozen=True)
class KeySpec:
    """What a segment key depends on beyond its tokens: the replicas' ``describe()``."""

    fingerprint: str
    dtype: str  # as torch spells it: "torch.float32"
    min_cached_tokens: int

    @classmethod
    def of(cls, described: Mapping[str, Any]) -> KeySpec:
        return cls(described["fingerprint"], described["dtype"], int(described["min_cached_tokens"]))

    @property
    def torch_dtype(self) -> torch.dtype:
        found = getattr(torch, self.dtype.removeprefix("torch."), None)
        if not isinstance(found, torch.dtype):
            raise ValueError(f"not a torch dtype: {self.dtype!r}")
        return found


class RequestKeys:
    """The segment keys of chat requests to one checkpoint."""

    def __init__(self, checkpoint: str | Path, spec: KeySpec, default_mode: str = "hypic") -> None:
        self.tokenizer = load_tokenizer(Path(checkpoint))
        template = ChatTemplate.from_checkpoint(Path(checkpoint))
        self.setup = ChatSetup.build(template, self.tokenizer) if template is not None else None
        self.spec, self.default_mode = spec, default_mode
        self._dtype = spec.torch_dtype

    def of_arguments(self, arguments: Mapping[str, Any]) -> list[str]:
        """The keys of a request given as ``Engine.start_chat``'s arguments (``server.protocol.engine_arguments``),
        sorted: the cached pieces' keys, none for a mode that does not compose."""
        options = arguments["options"]
        if self.setup is None or self.tokenizer is None or options.mode not in COMPOSED:
            return []
        tools = arguments.get("tools")
        choice = chosen_tool(arguments.get("tool_choice"), tools)
        shape = schema_as_call(self.setup.format, tools, choice, options.response_format)
        rendered = segment_prompt(
            self.setup.template,
            arguments["messages"],
            tools=shape.tools,
            chat_template_kwargs=options.chat_template_kwargs,
            segmentation=options.segmentation,
        )
        pieces, _ = literal_pieces(
            self.tokenizer, self.setup.template, rendered, shape.tools, options.chat_template_kwargs
        )
        return self._keys(pieces)

    def _keys(self, pieces: Any) -> list[str]:
        """The keys of the pieces (``Segment``s) a replica caches, sorted."""
        least = max(1, self.spec.min_cached_tokens)
        keys = set()
        for piece in pieces:
            if not piece.cache:
                continue
            ids = list(piece.token_ids) if piece.token_ids is not None else self._encode(piece.text or "")
            if len(ids) >= least:
                keys.add(segment_key(ids, self.spec.fingerprint, self._dtype))
        return sorted(keys)

    def of_body(self, body: Any) -> list[str]:
        """The keys of a ``/v1/chat/completions`` body; none for a body the replica will refuse (it answers
        the 400 itself, with the reason)."""
        from ..server.protocol import APIError, engine_arguments, parse_request

        if self.setup is None:
            return []
        try:
            arguments = engine_arguments(parse_request(body), self.default_mode, self.setup.format)
            return self.of_arguments(arguments)
        except (APIError, ValueError, TypeError, KeyError):
            return []

    def of_completion_body(self, body: Any) -> list[str]:
        """The keys of a ``/v1/completions`` body: each of its prompts cut at its paragraphs as the replica cuts
        it (``server.completions``); none for a body the replica will refuse."""
        from ..server.completions import completion_arguments, parse_completion_request, prompts
        from ..server.protocol import APIError

        try:
            request = parse_completion_request(body)
            keys: set[str] = set()
            for prompt in prompts(request, most=1 << 30):
                arguments = completion_arguments(request, prompt, self.default_mode)
                if arguments["options"].mode in COMPOSED:
                    keys.update(self._keys(arguments["segments"]))
            return sorted(keys)
        except (APIError, ValueError, TypeError, KeyError):
            return []

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)
