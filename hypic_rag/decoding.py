"""The decode loop that continues a prefilled request state one token at a time, alone or with others in one
forward (``step_together``); each row's next token is its ``logits.Picker``'s."""

from __future__ import annotations

from collections.abc import Callable, Collection, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .grammar import GrammarMask
from .logits import Picker, Sampler
from .model import HybridModel, RequestState
from .outputs import GenerationOutput, RequestStats
from .status import Status
from .tags import partial_suffix

TokenCallback = Callable[[int, "str | None"], None]
# The id of the last ``on_token`` call when text was held back (a possible start of a stop string, an
# unfinished character) and the request ended without it: it carries that text and no new token.
FLUSH = -1


# A token's text may re-decode this many trailing characters of the text before it (an unfinished UTF-8
# character completed), so a search for a new stop string starts this far before where the last one ended.
REDECODED = 8


def _held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters of ``text`` a stream must hold back: a possible start of a stop
    string, or an unfinished UTF-8 character (the tokenizer's replacement character)."""
    hold = partial_suffix(text, stops)
    if text.endswith("\ufffd"):
        hold = max(hold, len(text) - len(text.rstrip("\ufffd")))
    return hold


class Decoder:
    """One request's decode, a token at a time, stepped with others by ``step_together`` (a scheduler's step).

    Stops at a stop id (not included), at ``max_new_tokens``, at the model's context, at a stop string
    (the text is cut before it) or when ``cancelled()`` says so. ``on_token(id, delta)`` gets each id
    as it is chosen with the text it adds; text that may turn out to begin a stop string is held back
    until it does not."""

    def __init__(
        self,
        model: HybridModel,
        state: RequestState,
        first: int,
        sampler: Sampler,
        generator: torch.Generator | None,
        *,
        stops: Collection[int],
        max_new_tokens: int,
        on_token: TokenCallback | None = None,
        detokenize: Callable[[Sequence[int]], str] | None = None,
        stop_strings: Sequence[str] = (),
        cancelled: Callable[[], bool] | None = None,
        picker: Picker | None = None,
    ) -> None:
        """``picker`` (``logits.Picker``: penalties, an output grammar, log-probabilities) chooses each token
        after ``first``; by default ``sampler`` alone does."""
        if stop_strings and detokenize is None:
            raise ValueError("stop strings need a tokenizer to read the text")
        self.model, self.state, self.sampler, self.generator = model, state, sampler, generator
        self.stops, self.max_new_tokens = stops, max_new_tokens
        self.on_token, self.detokenize = on_token, detokenize
        self.stop_strings = [s for s in stop_strings if s]
        self._stop_reach = max((len(s) for s in self.stop_strings), default=0) + REDECODED
        self._searched = 0  # the text's length when it was last searched for a stop string
        self.cancelled = cancelled
        self.picker = picker if picker is not None else Picker(sampler, generator)
        self.ids: list[int] = []
        self.text: str | None = None  # set when a stop string cut the text
        self.finish: Status | None = None  # one of the ended statuses
        self._next = first
        self._held: int | None = None  # taken early (``take_now``), for the next ``take`` to return
        self._emitted = 0

    @property
    def done(self) -> bool:
        return self.finish is not None

    def take(self) -> int | None:
        """Take the next token and return it, for the model to run next (``choose`` then gets the logits after
        it); None once finished. ``step_together`` runs many decoders' tokens, or one's, in one forward."""
        if self._held is not None:
            token, self._held = self._held, None
            return token
        if self.finish is not None:
            return None
        if self.cancelled is not None and self.cancelled():
            self.finish = Status.CANCELLED
            return None
        token = self._next
        if token in self.stops:
            self._end(Status.STOPPED)
            return None
        self.ids.append(token)
        if self._read(token):
            self._end(Status.STOPPED)
            return None
        if len(self.ids) >= self.max_new_tokens:
            self._end(Status.LENGTH)
            return None
        if self.state.seq_len >= self.model.config.max_position_embeddings:
            self._end(Status.CONTEXT)
            return None
        return token

    def take_now(self) -> None:
        """Take the next token now, so its text goes out at once; the next ``take`` returns it. A server does this
        when a prompt is in, so the first token does not wait for the step that decodes it."""
        if self._held is None:
            self._held = self.take()

    def choose(self, logits: torch.Tensor, *, prefetch: bool = True) -> None:
        """Choose the token after the one ``take`` returned, from the logits ``[V]`` the model gave for it (which
        nothing reads after: the picker may write into them). ``prefetch``: as ``Picker.pick``'s."""
        self._next = self.picker.pick(logits.float(), scratch=True, prefetch=prefetch)

    def _read(self, token: int) -> bool:
        """Stream the text this token adds; True when a stop string has appeared."""
        if self.detokenize is None:
            if self.on_token is not None:
                self.on_token(token, None)
            return False
        if self.on_token is None and not self.stop_strings:
            return False
        text = self.detokenize(self.ids)
        # a stop string new in this text ends within its new characters: search only from the last one's reach
        start = max(0, self._searched - self._stop_reach)
        cut = min((at for s in self.stop_strings if (at := text.find(s, start)) >= 0), default=-1)
        self._searched = len(text)
        if cut >= 0:
            text = self.text = text[:cut]
        safe = len(text) if cut >= 0 else len(text) - _held_back(text, self.stop_strings)
        if self.on_token is not None:
            delta = text[self._emitted : safe] if safe > self._emitted else ""
            self._emitted = max(self._emitted, safe)
            self.on_token(token, delta)
        return cut >= 0

    def _end(self, status: Status) -> bool:
        self.finish = status
        if self.on_token is not None and self.detokenize is not None and self.ids:
            text = self.detokenize(self.ids) if self.text is None else self.text
            if len(text) > self._emitted:  # held back for a stop string that never came
                self.on_token(FLUSH, text[self._emitted :])
                self._emitted = len(text)
        return True


def _plain_mask(decoder: Decoder) -> GrammarMask | None:
    """A decoder's grammar mask when nothing comes before it on the row (penalties, bans, the log of the model's
    own log-probabilities), so that a batch's masks may go on their rows together."""
    p = decoder.picker
    plain = p.penalties is None and p.banned is None and p.logprobs is None
    return p.mask if plain and isinstance(p.mask, GrammarMask) else None


def step_together(
    decoders: Sequence[Decoder], failed: Callable[[Decoder, Exception], None] | None = None
) -> list[bool]:
    """One token of every decoder in one forward (``HybridModel.decode_batch``), each row then chosen by its own
    ``Picker`` (sampler, penalties, grammar); a finished or cancelled decoder just leaves. Each decoder's done
    flag after the step. ``failed(decoder, exc)``, if given, takes an error of one decoder's own (its stream, its
    grammar), which then leaves the step while the others go on; else the error is raised."""

    def guarded(d: Decoder, work: Callable[[], int | None]) -> int | None:
        if failed is None:
            return work()
        try:
            return work()
        except Exception as exc:
            failed(d, exc)
            return None

    taken = [(d, token) for d in decoders if (token := guarded(d, d.take)) is not None]
    if taken:
        model = taken[0][0].model
        if any(d.model is not model for d, _ in taken):
            raise ValueError("decoders stepped together must share one model")
        with torch.inference_mode():
            logits = model.decode_batch([token for _, token in taken], [d.state for d, _ in taken])
            if logits.device.type != "cpu":  # one device-side apply of the plain masked rows' masks
                logits = logits.float()
                GrammarMask.apply_together(logits, [_plain_mask(d) for d, _ in taken])
        for row, (d, _) in enumerate(taken):
            guarded(d, lambda d=d, row=row: d.choose(logits[row], prefetch=False))
        GrammarMask.prefetch_together([m for d, _ in taken if isinstance(m := d.picker.mask, GrammarMask)])
    return [d.done for d in decoders]


@dataclass(frozen=True)
class Piece:
    """One forward of a prompt's prefill, announced before it runs, so that a scheduler can keep a step within its
    token budget: ``tokens`` it runs through the model (a cold segment's fill, a probe, the fused seam and query
    forward, a deferred fill), or, ``splittable``, at most that many (a chunk of in-context tokens), cut to what the
    scheduler allows."""

    tokens: int
    splittable: bool = False

    def runs(self, limit: int | None) -> int:
        """The tokens it runs when allowed ``limit`` (None: no bound): all of them, unless it is splittable."""
        return min(self.tokens, limit) if self.splittable and limit is not None else self.tokens


# A chunked prefill: yields each ``Piece`` before running it and is sent the tokens it may run (None: no bound).
PieceSteps = Generator[Piece, "int | None", "Generation"]


class Prefilling:
    """A request whose prompt runs a piece at a time (``Engine.start(..., prefill_chunk=n)``), so that a long cold
    prompt holds the requests decoding beside it back by one piece, not by its whole prefill. ``piece`` is what
    the next ``advance`` runs; once the prompt is in, ``generation`` is the started request, as ``Engine.start``
    without chunks returns it."""

    thinking_open: bool = False  # passed on to the generation (see ``Generation``)
    answer_prefix: str = ""
    exact_content: bool = False
    call_streaming: Any = None

    def __init__(self, steps: PieceSteps) -> None:
        self._steps = steps
        self._piece: Piece | None = None
        self._primed = False
        self.generation: Generation | None = None

    @property
    def piece(self) -> Piece | None:
        """The piece the next ``advance`` runs (the prompt's planning runs on the first look); None once in."""
        if not self._primed:
            self._primed = True
            self._resume(None)
        return self._piece

    def advance(self, limit: int | None = None) -> int:
        """Run the next piece, a splittable one cut to ``limit`` tokens (None: whole); the tokens it ran."""
        piece = self.piece
        if piece is None:
            raise ValueError("the prompt is already in")
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be a positive number of tokens, got {limit}")
        self._resume(limit)
        return piece.runs(limit)

    def _resume(self, limit: int | None) -> None:
        try:
            self._piece = self._steps.send(limit) if self._piece is not None else next(self._steps)
        except StopIteration as stop:
            self._piece, self.generation = None, stop.value
            self.generation.thinking_open, self.generation.answer_prefix = self.thinking_open, self.answer_prefix
            self.generation.exact_content = self.exact_content
            self.generation.call_streaming = self.call_streaming


class Generation:
    """A request with its prompt in and its first token chosen (``ttft_s`` after it began); a scheduler decodes it,
    with others or alone, a token a step (``step_together``), and ``output`` sums it up once ``done``.
    ``finalize`` turns the raw output into the caller's (``Engine.chat`` parses tool calls there);
    ``thinking_open`` and ``answer_prefix`` say how the chat prompt ended, for a caller that splits the
    streamed text as ``finalize`` will (``chat.streaming``). ``fill`` is cache work the prompt left for after
    its first token is out (the exact cold policy's segments, ``fill_tokens`` of them), which the scheduler runs as
    a piece of a later step; ``keep``, what the scheduler calls once it has ended, keeps its state after the answer
    for the conversation's next turn (``PrefillProgram.keep_answer``)."""

    thinking_open: bool = False  # the prompt opened a reasoning block the answer continues
    answer_prefix: str = ""  # text the answer was made to begin with (a forced call), not streamed
    exact_content: bool = False  # the answer is content a grammar wrote, streamed and returned as written
    call_streaming: Any = None  # a ``chat.streaming.CallStreaming``: how its calls stream as they are written

    def __init__(
        self,
        decoder: Decoder,
        stats: RequestStats,
        ttft_s: float,
        prompt_logits: torch.Tensor,
        finalize: Callable[[GenerationOutput], GenerationOutput] | None = None,
        fill: Callable[[], object] | None = None,
        fill_tokens: int = 0,
        keep: Callable[[], object] | None = None,
    ) -> None:
        self.decoder, self.stats, self.ttft_s = decoder, stats, ttft_s
        self.prompt_logits, self.finalize = prompt_logits, finalize
        self.fill, self.fill_tokens, self.keep = fill, fill_tokens, keep

    @property
    def done(self) -> bool:
        return self.decoder.done

    def output(self) -> GenerationOutput:
        if not self.decoder.done:
            raise ValueError("the generation has not finished; run it on a scheduler (Engine.run_together) first")
        ids, finish = self.decoder.ids, self.decoder.finish
        assert finish is not None
        self.stats.generated_tokens = len(ids)
        text = self.decoder.text
        if text is None and self.decoder.detokenize is not None:
            text = self.decoder.detokenize(ids)
        out = GenerationOutput(text, list(ids), self.ttft_s, self.stats.as_dict(), finish.value, self.prompt_logits)
        out.stopped_at_string = self.decoder.text is not None
        mask = self.decoder.picker.mask
        if mask is not None:
            # a stop id ends only a complete answer (the grammar allows one nowhere else); a stop string cuts text
            out.incomplete = out.stopped_at_string or (finish is not Status.STOPPED and not mask.complete)
        logged = self.decoder.picker.logprobs
        if logged is not None:
            out.logprobs = logged[: len(ids)]  # the picks that became output: a stop id ends it unwritten
        return self.finalize(out) if self.finalize is not None else out
