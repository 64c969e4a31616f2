"""A request: one object that holds its whole life while a ``scheduler.Scheduler`` runs it (how it begins, its
status, its timestamps, its cancel event, its prompt running a piece a step, its decoder, and what it ended with),
and ``start``, which turns a prepared prompt and its options into what runs it (its prefill, then its decode).

The scheduler moves a request through its states (``status.Status``) and nothing else does; a caller reads them,
and asks for a cancel (``cancel``, or the flag it gave), which the scheduler applies at the next step in any state:
a request cancelled before its first token ends ``CANCELLED`` with no output, one cancelled while decoding ends
``CANCELLED`` with the answer so far.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .decoding import Decoder, Generation, Piece, Prefilling, TokenCallback
from .grammar import GrammarMask, GrammarTokenizer
from .logits import Penalties, Picker, Sampler
from .model import HybridModel
from .outputs import GenerationOutput
from .prefill import PrefillProgram, drain
from .prepare import Prepared
from .status import Event, Status

__all__ = ["Event", "Request", "Runner", "Status", "either", "start"]


@dataclass(eq=False)
class Request:
    """``begin(prefill_chunk=n)`` starts the request (``start`` with its other arguments bound) and returns its
    ``Prefilling`` (or a ``Generation`` begun whole); ``gave_up()``, if given, is the caller's own cancel flag,
    read beside ``cancel_event``; ``tag`` is the caller's, untouched. The timestamps are ``time.perf_counter()``'s:
    ``arrival`` when it was made, ``started`` when its prompt began, ``first_token`` when that went out,
    ``finished`` when it ended."""

    begin: Callable[..., Generation | Prefilling]  # called with prefill_chunk=
    gave_up: Callable[[], bool] | None = None
    tag: Any = None
    status: Status = Status.WAITING
    cancel_event: threading.Event = field(default_factory=threading.Event)
    arrival: float = field(default_factory=time.perf_counter)
    started: float | None = None
    first_token: float | None = None
    finished: float | None = None
    pending: Prefilling | None = None  # its prompt, while it runs a piece a step
    run: Generation | None = None  # past its first token
    prefilled_tokens: int = 0  # prompt tokens its prefill ran through the model
    order: int = 0  # when its prompt began, among those of its scheduler (first come, first served)
    output: GenerationOutput | None = None  # its answer: finished, or cancelled while decoding
    error: BaseException | None = None

    def cancel(self) -> None:
        """Ask for the request to end; the scheduler applies it at its next step."""
        self.cancel_event.set()

    def cancelled(self) -> bool:
        return self.cancel_event.is_set() or (self.gave_up is not None and self.gave_up())

    def mark(self, status: Status) -> None:
        """Move to ``status``, stamping the time it began or ended (the scheduler's to call)."""
        self.status = status
        now = time.perf_counter()
        if status is Status.PREFILLING:
            self.started = now
        elif status is Status.RUNNING:
            self.first_token = now
            self.started = self.started if self.started is not None else now
        elif status.ended:
            self.finished = now


def either(first: Callable[[], bool], second: Callable[[], bool]) -> Callable[[], bool]:
    """A cancel flag raised when either of two is: the caller's own and the one a driver adds."""
    return lambda: first() or second()


class Runner(Protocol):
    """What starting a request reads of its engine (``engine.Engine``)."""

    name: str
    model: HybridModel
    tokenizer: Any
    eos_token_ids: tuple[int, ...]
    prefill_program: PrefillProgram

    def decode(self, ids: Sequence[int]) -> str: ...

    def grammar_tokenizer(self, stop_ids: Sequence[int] = ()) -> GrammarTokenizer: ...


def start(
    engine: Runner,
    prepared: Prepared,
    on_token: TokenCallback | None = None,
    cancelled: Callable[[], bool] | None = None,
    chunk: int | None = None,
) -> Generation | Prefilling:
    """Prefill ``prepared``'s prompt and choose its first token, under its options; the request also stops at
    the prepared end-of-turn ids and every EOS id. Its grammar masks every token chosen, from after the forced
    opening the prompt already ends with. With ``chunk``, nothing runs yet: the ``Prefilling`` returned runs the
    prompt a chunk at a time (``PrefillProgram.steps``)."""
    prompt, options = prepared.prompt, prepared.options
    if options.stop and engine.tokenizer is None:
        raise ValueError(f"checkpoint {engine.name!r} has no tokenizer files; stop strings need one")
    sampler = Sampler.of(options)
    generator = sampler.generator(engine.model.device)
    stops = set(engine.eos_token_ids) | set(prepared.ends) | set(options.stop_token_ids or ())
    mask = None
    if prepared.grammar is not None:  # built before the prompt runs, so that a schema it rejects costs no prefill
        tokenizer = engine.grammar_tokenizer(prepared.ends)
        budget = options.max_new_tokens if prepared.closing else None
        mask = GrammarMask(tokenizer, prepared.grammar, also_stop=options.stop_token_ids or (), budget=budget)
        mask.force(prepared.opening_ids)
        stops |= set(tokenizer.stop_ids)  # a finished answer may end at any of them
    picker = Picker(
        sampler,
        generator,
        penalties=Penalties.of(options),
        mask=mask,
        prompt_ids=prompt.ids,
        logprobs=(options.top_logprobs or 0) if options.logprobs else None,
        banned=prepared.banned,
    )
    detokenize = engine.decode if engine.tokenizer is not None else None
    assert options.max_new_tokens is not None  # with_defaults filled it
    max_new_tokens = options.max_new_tokens
    program = engine.prefill_program

    def steps() -> Generator[Piece, int | None, Generation]:
        begin = time.perf_counter()
        done = yield from program.steps(prompt, options.mode, options.seam, chunk, options)
        first = picker.pick(done.logits)
        ttft = time.perf_counter() - begin
        # the exact policy's misses are filled once the first token is out (``Generation.fill``)
        fill = functools.partial(program.fill, done.deferred) if done.deferred else None
        decoder = Decoder(
            engine.model,
            done.state,
            first,
            sampler,
            generator,
            stops=stops,
            max_new_tokens=max_new_tokens,
            on_token=on_token,
            detokenize=detokenize,
            stop_strings=list(options.stop or ()),
            cancelled=cancelled,
            picker=picker,
        )
        filling = sum(len(seg.ids) for seg, _ in done.deferred)
        keep = functools.partial(program.keep_answer, prompt.ids, done.keeping, decoder) if done.keeping else None
        return Generation(decoder, done.stats, ttft, done.logits, prepared.finalize, fill, filling, keep)

    run: Generation | Prefilling = drain(steps()) if chunk is None else Prefilling(steps())
    run.thinking_open, run.answer_prefix, run.exact_content = prepared.thinking, prepared.forced, prepared.exact
    run.call_streaming = prepared.calls
    return run
