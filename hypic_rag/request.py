"""One request's whole state while a ``scheduler.Scheduler`` runs it: how it begins, where it is (waiting, its
prompt running a piece a step, decoding, finished), and what it ended with.

The scheduler moves a request through these states and nothing else does; a caller reads them, and asks for a
cancel by the flag it gave (``cancelled``), which the scheduler applies at the next step in any state.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .decoding import Generation, Prefilling

WAITING, PREFILLING, RUNNING, FINISHED, FAILED, CANCELLED = (
    "waiting",
    "prefilling",
    "running",
    "finished",
    "failed",
    "cancelled",
)


@dataclass(eq=False)
class Request:
    """``begin(chunk)`` starts the request (an ``Engine.start``/``start_chat`` with ``prefill_chunk=chunk``) and
    returns its ``Prefilling``; ``cancelled()`` says the caller gave up; ``tag`` is the caller's, untouched."""

    begin: Callable[[int], Generation | Prefilling]
    cancelled: Callable[[], bool] = lambda: False
    tag: Any = None
    status: str = WAITING
    pending: Prefilling | None = None  # its prompt, while it runs a piece a step
    run: Generation | None = None  # past its first token
    prefilled_tokens: int = 0  # prompt tokens its prefill ran through the model
    output: Any = None  # the finished ``GenerationOutput``
    error: BaseException | None = None
