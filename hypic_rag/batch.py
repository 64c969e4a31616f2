"""Requests of one caller run together to their ends (``Engine.generate_batch``, ``chat_batch``, ``run_together``):
every request handed to one ``scheduler.Scheduler`` up front, and the scheduler stepped until nothing is left.

Admission, the token budget, chunked prefill and failures are the scheduler's, as for the server and the shared
batch: prompts run first come first served (so each finds the segments the ones before it cached), at most
``max_active`` decode at once, and a request that fails (its input, its grammar, its stream, its output) fails
alone. Its slot then holds the exception: returned in place with ``return_exceptions``, otherwise raised as a
``BatchError`` that still carries every other answer, so nothing the batch computed is lost.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from .decoding import Generation, Prefilling
from .outputs import GenerationOutput
from .prepare import Prepared
from .request import Request
from .scheduler import MAX_ACTIVE, MAX_NUM_BATCHED_TOKENS, Scheduler

Begin = Callable[..., Generation | Prefilling]  # called with prefill_chunk=


class BatchError(Exception):
    """Some requests of a batch failed. ``results`` holds, in the batch's order, each request's output or its
    exception; ``failed`` the indices of the failed ones. Chained from the first failure."""

    def __init__(self, results: list[GenerationOutput | BaseException]) -> None:
        self.results = results
        self.failed = [i for i, r in enumerate(results) if isinstance(r, BaseException)]
        first = results[self.failed[0]]
        more = f" (and {len(self.failed) - 1} more)" if len(self.failed) > 1 else ""
        super().__init__(
            f"{len(self.failed)} of {len(results)} requests failed; request {self.failed[0]}: "
            f"{type(first).__name__}: {first}{more}. The others' outputs are in .results"
        )


def run_batch(
    begins: Sequence[Begin],
    *,
    max_active: int = MAX_ACTIVE,
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS,
    return_exceptions: bool = False,
) -> list[Any]:
    """Each ``begin(prefill_chunk=n)`` (an ``Engine.start``/``start_chat`` with its arguments bound, or a request
    already started) run to its end on one scheduler; the outputs in ``begins``' order (see the module docstring
    for a failure)."""
    scheduler = Scheduler(max_active=max_active, max_num_batched_tokens=max_num_batched_tokens)
    requests = [Request(begin) for begin in begins]
    for request in requests:
        scheduler.add(request)
    scheduler.run()
    results: list[GenerationOutput | BaseException] = []
    for request in requests:
        if request.output is not None:  # ended with an answer (a decoder's own flag may have cancelled it)
            results.append(request.output)
        else:
            assert request.error is not None  # nothing cancels a batch's request before its first token
            results.append(request.error)
    if not return_exceptions and any(isinstance(r, BaseException) for r in results):
        error = BatchError(results)
        raise error from results[error.failed[0]]
    return results


def prepared_begins(
    prepares: Sequence[Callable[[], Prepared]], begin: Callable[..., Generation | Prefilling]
) -> list[Begin]:
    """Each request prepared now, on the caller's thread, so that the scheduler's steps only build state; as a
    ``begin`` that runs ``begin(prepared, prefill_chunk=n)``. A request whose preparing fails (bad input) fails
    alone, when its turn comes, as one that fails at its start."""
    begins: list[Begin] = []
    for prepare in prepares:
        try:
            prepared = prepare()
        except Exception as exc:
            begins.append(functools.partial(_raise, exc))
        else:
            begins.append(functools.partial(begin, prepared))
    return begins


def _raise(exc: Exception, prefill_chunk: int) -> Generation | Prefilling:
    raise exc


def run_one(start: Callable[[], Generation | Prefilling]) -> GenerationOutput:
    """One request run to its end on a scheduler of its own, a batch of one (``Engine.chat``, ``generate``): the
    same steps as every batch, its failure raised as it is. ``start()`` begins it whole, its prompt in one go, as a
    single call has always run it."""
    [result] = run_batch([lambda prefill_chunk: start()], max_active=1, return_exceptions=True)
    if isinstance(result, BaseException):
        raise result
    return result


def started(run: Generation) -> Begin:
    """A request begun already, as a ``begin`` the scheduler takes (``Engine.run_together``)."""
    return lambda prefill_chunk: run
