"""A request's segment keys, computed at a fleet's ingress without the model: the same keys a replica's segment
cache files the request's pieces under, whatever order they come in.

The ingress holds the checkpoint's ``prepare.Preparer`` only (its tokenizer, template, vocabulary and context); the
key's other inputs (the weights' fingerprint, the model's dtype, ``min_cached_tokens``) come once from a replica
(``EngineReplica.describe``), so the keys match what the replicas compute however they were configured. The steps
are the replica's own: the body parsed as the server parses it, the request prepared by the same ``Preparer``, and
the keys the ones ``plan.cached_keys`` gives by the plan's own cache rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..cache.keys import segment_key
from ..options import COMPOSED
from ..plan import Prompt, cached_keys
from ..prepare import Preparer


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
    """The segment keys of requests to one checkpoint."""

    def __init__(self, checkpoint: str | Path, spec: KeySpec, default_mode: str = "hypic") -> None:
        self.preparer = Preparer.from_checkpoint(Path(checkpoint))
        self.spec, self.default_mode = spec, default_mode
        self._dtype = spec.torch_dtype

    @property
    def setup(self) -> Any:
        """The checkpoint's chat setup (None without a chat template)."""
        return self.preparer.chat_setup

    def of_arguments(self, arguments: Mapping[str, Any]) -> list[str]:
        """The keys of a request given as ``Engine.prepare_chat``'s arguments (``server.protocol.engine_arguments``),
        sorted: the cached pieces' keys, none for a mode that does not compose."""
        options = arguments["options"]
        if self.setup is None or options.mode not in COMPOSED:
            return []
        prepared = self.preparer.chat(
            arguments["messages"],
            options,
            arguments.get("tools"),
            arguments.get("tool_choice"),
            arguments.get("parallel_tool_calls", True),
            compile=False,
        )
        return self._keys(prepared.prompt)

    def _keys(self, prompt: Prompt) -> list[str]:
        return cached_keys(
            prompt, self.spec.min_cached_tokens, lambda ids: segment_key(ids, self.spec.fingerprint, self._dtype)
        )

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
                    keys.update(self._keys(self.preparer.segments(**arguments, compile=False).prompt))
            return sorted(keys)
        except (APIError, ValueError, TypeError, KeyError):
            return []
