"""Concurrent in-process callers of one engine, decoded together: the batched path for threads (LangChain's
``batch``/``abatch``, LlamaIndex's concurrent ``achat`` calls) as the server's worker is for HTTP requests.

The engine is not thread-safe, so no two forwards may overlap; instead of a lock held per request, callers
hand their request to a ``SharedBatch`` and the first one to find nobody driving it becomes the driver: it
starts each request handed in (its prefill), then decodes one token of every running request in one forward
(``decoding.step_together``), until its own answer is done, while the other callers wait for theirs; then a
caller still waiting takes over. No thread of its own, so nothing outlives the callers. ``lock`` is held for
each step, so a caller that needs the engine to itself (a stream) takes it and runs between two steps.

Async callers need a thread each while they wait, and asyncio's default executor holds only
``min(32, cores + 4)`` threads (six on two cores), which would cap how many concurrent ``await``s share a step:
``in_thread`` runs them on a pool as wide as ``ASYNC_CALLERS``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TypeVar
from weakref import WeakKeyDictionary

from .decoding import Decoder, Generation, step_together
from .engine import Engine
from .outputs import GenerationOutput

T = TypeVar("T")

# Concurrent async calls that can wait on a shared batch at once; more queue for a thread.
ASYNC_CALLERS = 256
_ASYNC_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _forget_pool() -> None:
    """A forked child inherits the pool's bookkeeping but not its threads: it starts a pool of its own."""
    global _ASYNC_POOL, _POOL_LOCK
    _ASYNC_POOL, _POOL_LOCK = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


async def in_thread(fn: Callable[..., T], *args: object) -> T:
    """``asyncio.to_thread`` on a pool of ``ASYNC_CALLERS`` threads (the module docstring says why); the
    caller's context variables go with it, as with ``to_thread``."""
    global _ASYNC_POOL
    with _POOL_LOCK:
        if _ASYNC_POOL is None:  # threads are made as calls need them, and idle ones wait on a queue
            _ASYNC_POOL = ThreadPoolExecutor(ASYNC_CALLERS, thread_name_prefix="hypic-async")
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    return await asyncio.get_running_loop().run_in_executor(_ASYNC_POOL, call)


@dataclass
class _Request:
    start: Callable[[], Generation]
    done: threading.Event = field(default_factory=threading.Event)
    run: Generation | None = None
    output: GenerationOutput | None = None
    error: BaseException | None = None

    def fail(self, exc: BaseException) -> None:
        self.error = exc
        self.done.set()


class SharedBatch:
    """Requests of many threads on one engine, decoded together (see the module docstring)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # the engine's: held for each step of the batch
        self._cond = threading.Condition()  # guards the waiting list, the running list and the driver flag
        self._waiting: list[_Request] = []
        self._running: list[_Request] = []
        self._driving = False

    def run(self, start: Callable[[], Generation]) -> GenerationOutput:
        """``start()`` (``Engine.start_chat``, ``Engine.start`` with their arguments) decoded to the end among
        whatever else is running; its output, as it decodes alone up to the rounding of a batched matmul.
        ``start``'s errors are raised here.

        A caller drives the batch only until its own request is done, then hands the driving to a caller still
        waiting, so no caller is held past its answer; a driver interrupted (an exception out of a step, a
        KeyboardInterrupt) leaves the batch to the next one."""
        request = _Request(start)
        with self._cond:
            self._waiting.append(request)
        while True:
            with self._cond:
                while self._driving and not request.done.is_set():
                    self._cond.wait()
                if request.done.is_set():
                    break
                self._driving = True
            try:
                self._drive(request)
            finally:
                with self._cond:
                    self._driving = False
                    self._cond.notify_all()
        if request.error is not None:
            raise request.error
        assert request.output is not None
        return request.output

    def _drive(self, own: _Request) -> None:
        while not own.done.is_set():
            with self._cond:
                joining, self._waiting = self._waiting, []
                if not joining and not self._running:
                    return
            with self.lock:
                for request in joining:
                    try:
                        request.run = request.start()
                        self._running.append(request)
                    except BaseException as exc:  # handed to its caller, who raises it
                        request.fail(exc)
                self._running = self._step(self._running)
            with self._cond:
                self._cond.notify_all()  # callers whose answers are done return

    def _step(self, running: list[_Request]) -> list[_Request]:
        failures: dict[int, Exception] = {}

        def failed(decoder: Decoder, exc: Exception) -> None:
            failures[id(decoder)] = exc

        decoders = [r.run.decoder for r in running if r.run is not None]
        try:
            done = step_together(decoders, failed)
        except BaseException as exc:  # the forward itself: every request in it fails
            for request in running:
                request.fail(exc)
            return []
        left = []
        for request, decoder, finished in zip(running, decoders, done, strict=True):
            if id(decoder) in failures:
                request.fail(failures[id(decoder)])
            elif finished:
                assert request.run is not None
                try:
                    request.output = request.run.output()
                except Exception as exc:
                    request.fail(exc)
                    continue
                request.done.set()
            else:
                left.append(request)
        return left


_GUARD = threading.Lock()
_SHARED: WeakKeyDictionary[Engine, SharedBatch] = WeakKeyDictionary()


def shared_batch(engine: Engine) -> SharedBatch:
    """The one ``SharedBatch`` of ``engine`` in this process."""
    with _GUARD:
        return _SHARED.setdefault(engine, SharedBatch())


def alone(engine: Engine, work: Callable[[], T]) -> T:
    """``work()`` with ``engine`` to itself (a stream), between two steps of its shared batch."""
    with shared_batch(engine).lock:
        return work()
