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
    """``begin(prefill_chunk=n)`` starts the request (an ``Engine.start``/``start_chat`` with its other arguments
    bound) and returns its ``Prefilling`` (or a ``Generation`` begun whole); ``cancelled()`` says the caller gave
    up; ``tag`` is the caller's, untouched."""

    begin: Callable[..., Generation | Prefilling]  # called with prefill_chunk=
    cancelled: Callable[[], bool] = lambda: False
    tag: Any = None
    status: str = WAITING
    pending: Prefilling | None = None  # its prompt, while it runs a piece a step
    run: Generation | None = None  # past its first token
    prefilled_tokens: int = 0  # prompt tokens its prefill ran through the model
    order: int = 0  # when its prompt began, among those of its scheduler (first come, first served)
    output: Any = None  # the finished ``GenerationOutput``
    error: BaseException | None = None


def either(first: Callable[[], bool], second: Callable[[], bool]) -> Callable[[], bool]:
    """A cancel flag raised when either of two is: the caller's own and the one a driver adds."""
    return lambda: first() or second()
