"""Grammar-constrained decoding: a token mask per sequence, so that JSON answers and tool calls come out well
formed whatever the weights would have written.

A grammar is Lark text in llguidance's dialect (``%json {schema}`` embeds a JSON schema, ``name[lazy]: ...``
matches text up to the first occurrence of what follows, ``<tag>`` is an added token). ``GrammarTokenizer``
holds the engine's tokenizer in llguidance's form; ``GrammarMask`` follows one sequence: ``apply`` masks the
logits of the next token to what the grammar allows, ``advance`` takes the token chosen. The chat formats'
grammars (text or calls of the offered tools) are built in ``chat.grammar``; this module knows requests'
``response_format`` and the library.

A token the grammar forbids is not simply dropped: its probability goes to the longest allowed token that spells
a prefix of it (``GrammarTokenizer.prefix_table``). BPE merges text across the grammar's boundaries (``"},"`` closes a
string and an object at once), so a model that means "close the string here" may put nearly all its mass on a merged
token the grammar refuses; masking it alone leaves the choice to the noise among the rest, and a string that should
have closed runs on until ``max_tokens``. Handing the mass to ``"`` keeps what the model meant. llguidance gives
the mask; the hand-over is ours, as no grammar library offers it (``masking`` writes both into rows, listing
only the mask's small side). A sequence's next mask is computed while the forward that needs it runs
(``GrammarMask.prefetch``), a batch's in one call (``GrammarMask.prefetch_together``).

Why llguidance rather than xgrammar (both are vLLM's backends, and both read our tokenizers): llguidance needs
no other Python package (xgrammar pulls in transformers, triton and apache-tvm-ffi, which the engine does not
otherwise need at run time), it builds a grammar's mask lazily while decoding, so a new schema per request costs
no compilation pass, and its Lark dialect embeds JSON schemas and lazy lexemes, which say "free text, or a call
to one of these tools" in each chat format directly.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from .json_schema import check_schema, for_grammar
from .masking import Plan, Plans, apply_row, apply_rows, bits_at, pack, unpack, words_for
from .schema_refusals import explain

RESPONSE_FORMATS = ("text", "json_object", "json_schema", "regex", "choice")

# JSON as each model family writes it: Python's json.dumps spacing (Qwen templates' tojson), compact for the
# bundled model.
SPACED: tuple[str, str] = (", ", ": ")
COMPACT: tuple[str, str] = (",", ":")

MAX_CHOICES = 1000  # a choice's options: llguidance refuses a rule of over 2000 alternatives, mid-answer
MAX_CHOICE_CHARS = 100_000
MAX_REGEX_CHARS = 4096
PROBE_TOKENS = 16  # tokens a new grammar is walked through before a request is admitted (``GrammarTokenizer``)
CLOSING_TOKENS = 32  # a JSON answer's last tokens, in which the mask steers it to close (``GrammarMask``)
COMPILED_KEPT = 64  # compiled grammars each tokenizer keeps, so a request checked before admission is not built again


def _llguidance() -> Any:
    try:
        import llguidance
    except ImportError as exc:  # a base dependency; a stripped install may lack it
        raise ValueError("constrained decoding needs llguidance: pip install 'llguidance>=1.9,<2'") from exc
    return llguidance


def lark_string(text: str) -> str:
    """``text`` as a Lark string literal."""
    return json.dumps(text, ensure_ascii=False)


def lark_regex(pattern: str) -> str:
    """``pattern`` as a Lark regex literal (``/.../``)."""
    return "/" + pattern.replace("/", "\\/") + "/"


def json_lark(schema: Mapping[str, Any], separators: tuple[str, str] = SPACED, *, sort_keys: bool = False) -> str:
    """A Lark item matching JSON text valid under ``schema`` (as ``json_schema.for_grammar`` rewrites it: objects
    closed to their listed properties, sorted with ``sort_keys``), written with ``separators`` and no other
    whitespace: a random model given free whitespace writes little else."""
    options = {"whitespace_flexible": False, "item_separator": separators[0], "key_separator": separators[1]}
    schema = for_grammar(schema, sort_keys=sort_keys)
    return "%json " + json.dumps({**schema, "x-guidance": options}, ensure_ascii=False)


def check_response_format(value: Any) -> dict[str, Any] | None:
    """OpenAI's ``response_format`` checked and normalised (``{"type": "text"}`` is None: no constraint).

    Besides OpenAI's ``text``, ``json_object`` and ``json_schema`` (``{"json_schema": {"name", "schema",
    "strict"}}``), ``{"type": "regex", "regex": ...}`` and ``{"type": "choice", "choice": [...]}`` take vLLM's
    ``structured_outputs`` of those kinds. Only the shape and the size are checked here, in time linear in the
    value: the grammar is compiled where the request is prepared (``GrammarTokenizer.matcher``), off the event
    loop."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or value.get("type") not in RESPONSE_FORMATS:
        raise ValueError(f"response_format must be an object whose type is one of {', '.join(RESPONSE_FORMATS)}")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, Mapping):
            raise ValueError("response_format json_schema needs a 'json_schema' object with the 'schema'")
        schema = check_schema(spec.get("schema", {"type": "object"}), "response_format json_schema.schema")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise ValueError(f"response_format json_schema.strict must be true or false, got {strict!r}")
        name, description = spec.get("name"), spec.get("description")
        for key, value in (("name", name), ("description", description)):
            if value is not None and not isinstance(value, str):
                raise ValueError(f"response_format json_schema.{key} must be a string")
        out = {"type": "json_schema", "json_schema": {"name": name, "schema": dict(schema), "strict": bool(strict)}}
        if description:
            out["json_schema"]["description"] = description
    elif kind == "regex":
        if not isinstance(value.get("regex"), str):
            raise ValueError("response_format regex needs 'regex', a string")
        if len(value["regex"]) > MAX_REGEX_CHARS:
            raise ValueError(f"response_format regex is over {MAX_REGEX_CHARS} characters")
        out = {"type": "regex", "regex": value["regex"]}
    else:
        choice = value.get("choice")
        if not isinstance(choice, list | tuple) or not choice or not all(isinstance(c, str) and c for c in choice):
            raise ValueError("response_format choice needs 'choice', a list of non-empty strings")
        if len(choice) > MAX_CHOICES or sum(len(c) for c in choice) > MAX_CHOICE_CHARS:
            raise ValueError(
                f"response_format choice takes up to {MAX_CHOICES} options of {MAX_CHOICE_CHARS:,} characters in all"
            )
        out = {"type": "choice", "choice": list(choice)}
    return out


def response_lark(response_format: Mapping[str, Any], separators: tuple[str, str]) -> str:
    """The Lark item a normalised ``response_format`` (``check_response_format``) holds an answer to."""
    kind = response_format["type"]
    if kind == "json_object":
        return json_lark({"type": "object"}, separators)
    if kind == "json_schema":
        return json_lark(response_format["json_schema"]["schema"], separators)
    if kind == "regex":
        return lark_regex(response_format["regex"])
    if kind == "choice":
        return "(" + " | ".join(lark_string(c) for c in response_format["choice"]) + ")"
    raise ValueError(f"response_format {kind!r} holds no grammar")


def asks_json(response_format: Mapping[str, Any] | None) -> bool:
    """Whether ``response_format`` asks for JSON, whose answer the grammar steers to close near its budget."""
    return response_format is not None and response_format["type"] in ("json_object", "json_schema")


def refused(where: str, exc: ValueError, schema: Any = None, schema_at: str | None = None) -> ValueError:
    """The grammar compiler's refusal as a ``ValueError`` that begins with the request field ``where``; where the
    refused grammar is a JSON ``schema`` (at request field ``schema_at``), in the request's terms
    (``schema_refusals``)."""
    reason = str(exc) if schema is None else explain(str(exc), schema, schema_at or where)
    return ValueError(f"{where}: the grammar cannot hold it: {reason}")


def response_schema(response_format: Mapping[str, Any] | None) -> tuple[Any, str | None]:
    """The JSON schema a ``response_format`` holds the answer to and the request field it sits at, or None."""
    if response_format is not None and response_format.get("type") == "json_schema":
        return response_format["json_schema"]["schema"], "response_format.json_schema.schema"
    return None, None


def compile_checked(
    tokenizer: GrammarTokenizer, lark: str, where: str, schema: Any = None, schema_at: str | None = None
) -> None:
    """``tokenizer.matcher(lark)``, its refusal ``refused`` (of ``schema``, where ``lark`` holds one)."""
    try:
        tokenizer.matcher(lark)
    except ValueError as exc:
        raise refused(where, exc, schema, schema_at) from None


def _grammar(lark: str) -> str:
    return _llguidance().LLMatcher.grammar_from_lark("%llguidance {}\n" + lark)


def _limits() -> Any:
    """llguidance's own bounds on a grammar's size and each step's work, with errors that do not echo the
    grammar and the parser's state back."""
    return _llguidance().LLParserLimits(verbose_errors=False)


def grammar_error(error: str) -> str:
    """What the compiler said of a grammar, as a client may read it: the reason, without its grammar listing,
    positions or parser state."""
    first = error.strip().splitlines()[0] if error.strip() else "unknown error"
    if "Unsatisfiable" in first:
        return "no value satisfies it (" + first.split("Unsatisfiable", 1)[1].lstrip(" schema:").strip() + ")"
    if any(w in first.lower() for w in ("too many", "too big", "too complex", "max is", "limit")):
        return "it is too large or too complex for the grammar compiler"
    for head in ("failed to compile JSON schema: ", "parser error: ", "lexer error: ", "Parser Error: "):
        first = first.split(head, 1)[-1]
    if first.startswith("at ") and "): " in first:
        first = first.split("): ", 1)[1]
    return first[:200]


class GrammarTokenizer:
    """A tokenizer (``tokenizers.Tokenizer``) as llguidance reads it, with the ids that end an answer (allowed
    once the grammar is complete). Building it walks the vocabulary, so an engine keeps one."""

    def __init__(self, tokenizer: Any, vocab_size: int, stop_ids: Collection[int]) -> None:
        llg = _llguidance()
        if not stop_ids:
            raise ValueError("constrained decoding needs an end-of-sequence id to end a finished answer")
        self.stop_ids = tuple(sorted(stop_ids))
        self.llg = llg.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size, eos_token=list(self.stop_ids))
        self.vocab_size = vocab_size
        self._added = {t.content: i for i, t in tokenizer.get_added_tokens_decoder().items()}
        self._texts: list[bytes] | None = None
        self._openers: dict[bytes, tuple[int, ...]] = {}
        self._closers: np.ndarray | None = None
        self._prefixes: np.ndarray | None = None
        self._descendants: tuple[np.ndarray, np.ndarray] | None = None  # CSR: prefix -> tokens extending it
        self._plans: Plans | None = None
        self._compiled: OrderedDict[str, Any] = OrderedDict()  # lark -> a checked matcher, never advanced
        self._lock = threading.Lock()

    def matcher(self, lark: str) -> Any:
        """A fresh matcher (``llguidance.LLMatcher``) of ``lark``, compiled under llguidance's limits and walked
        ``PROBE_TOKENS`` tokens ahead on a copy the first time (some grammars pass compilation and break the
        parser's limits only on their first tokens); a ``ValueError`` (``grammar_error``'s words) for one that
        fails. Thread-safe: a server compiles here off the engine thread before admitting the request, and the
        engine then copies the kept matcher instead of compiling it again."""
        with self._lock:
            kept = self._compiled.get(lark)
            if kept is not None:
                self._compiled.move_to_end(lark)
                return kept.deep_copy()
        llg = _llguidance()
        kept = llg.LLMatcher(self.llg, _grammar(lark), log_level=0, limits=_limits())
        if kept.is_error():
            raise ValueError(grammar_error(kept.get_error()))
        probe = kept.deep_copy()
        for _ in range(PROBE_TOKENS):
            mask = probe.compute_bitmask()
            if probe.is_error():
                raise ValueError(grammar_error(probe.get_error()))
            token = self._probe_token(mask)
            if token is None:
                break
            probe.consume_token(token)
            if probe.is_error():
                raise ValueError(grammar_error(probe.get_error()))
        with self._lock:
            self._compiled[lark] = kept
            while len(self._compiled) > COMPILED_KEPT:
                self._compiled.popitem(last=False)
        return kept.deep_copy()

    def _probe_token(self, mask: bytes) -> int | None:
        """The first token ``mask`` allows that does not end the answer, or None."""
        stops = set(self.stop_ids)
        for byte_at, byte in enumerate(mask):
            if byte:
                for bit in range(8):
                    token = byte_at * 8 + bit
                    if byte >> bit & 1 and token not in stops and token < self.vocab_size:
                        return token
        return None

    def texts(self) -> list[bytes]:
        """Each token's bytes (empty for a special token), walked from the vocabulary once for the tables below."""
        if self._texts is None:
            special = self.llg.is_special_token
            self._texts = [b"" if special(i) else self.llg.decode_bytes([i]) for i in range(self.vocab_size)]
        return self._texts

    def prefix_table(self) -> np.ndarray:
        """``[vocab_size, depth]`` int32: each token's proper prefixes that are tokens themselves, longest first, -1
        past the last (special tokens have and are none); made on first use, as it walks the vocabulary."""
        if self._prefixes is None:
            texts = self.texts()
            spelled: dict[bytes, int] = {}
            for i, text in enumerate(texts):
                if text:
                    spelled.setdefault(text, i)
            chains = [[j for n in range(len(t) - 1, 0, -1) if (j := spelled.get(t[:n])) is not None] for t in texts]
            depth = max((len(c) for c in chains), default=0)
            table = np.full((self.vocab_size, max(depth, 1)), -1, dtype=np.int32)
            for i, chain in enumerate(chains):
                if chain:
                    table[i, : len(chain)] = chain
            self._prefixes = table
        return self._prefixes

    def descendants(self, ids: np.ndarray) -> np.ndarray:
        """The tokens that have one of ``ids`` among their proper prefixes (``prefix_table``), each once: the only
        ones a token in ``ids`` can inherit probability from. A table of edges sorted by prefix, made on first
        use."""
        if self._descendants is None:
            table = self.prefix_table()
            child = np.broadcast_to(np.arange(table.shape[0], dtype=np.int64)[:, None], table.shape)
            keep = table >= 0
            parent, child = table[keep].astype(np.int64), child[keep]
            order = np.argsort(parent, kind="stable")
            starts = np.zeros(self.vocab_size + 1, dtype=np.int64)
            starts[1:] = np.cumsum(np.bincount(parent, minlength=self.vocab_size))
            self._descendants = (starts, child[order])
        starts, children = self._descendants
        lo, hi = starts[ids], starts[ids + 1]
        counts = hi - lo
        if int(counts.sum()) == 0:
            return np.empty(0, dtype=np.int64)
        offsets = np.repeat(lo - np.cumsum(counts) + counts, counts)
        return np.unique(children[offsets + np.arange(int(counts.sum()))])

    def plans(self) -> Plans:
        """What each packed mask does to a row (``masking.Plans``), kept by mask; made on first use."""
        if self._plans is None:
            self._plans = Plans(self.vocab_size, self.prefix_table(), self.descendants)
        return self._plans

    def tag(self, text: str) -> str:
        """A tag as a Lark item: the added token that spells it, which is what the model was trained to write
        (llguidance never matches an added token against text), else the text itself."""
        if text in self._added and text.startswith("<") and text.endswith(">"):
            return text
        return lark_string(text)

    def is_token(self, text: str) -> bool:
        return text in self._added

    def closers(self) -> np.ndarray:
        """The tokens made only of ``"``, ``}`` and ``]``, which close what a JSON text has open, as packed words
        (``masking.pack``); made on first use."""
        if self._closers is None:
            ids = [i for i, text in enumerate(self.texts()) if text and set(text) <= set(b'"}]')]
            self._closers = pack(ids, self.vocab_size)
        return self._closers

    def token_id(self, text: str) -> int:
        """The id of the added token ``text`` (``is_token``)."""
        return self._added[text]

    def openers(self, head: bytes) -> tuple[int, ...]:
        """The tokens an answer that must not begin with ``head`` cannot begin with: those whose text, leading
        whitespace aside, begins with it, and those of whitespace alone (after which it could); made once per
        ``head``, as it walks the vocabulary."""
        if head not in self._openers:
            starts = [(i, text, text.lstrip()) for i, text in enumerate(self.texts())]
            self._openers[head] = tuple(i for i, text, rest in starts if text and (not rest or rest.startswith(head)))
        return self._openers[head]


_WORKER: ThreadPoolExecutor | None = None
_EXECUTOR: Any = None
_WORKER_LOCK = threading.Lock()


def _worker() -> tuple[ThreadPoolExecutor, Any]:
    """The thread the next masks are computed on while the forward runs (llguidance drops the GIL), and
    llguidance's executor, which spreads a batch's masks over its own threads; made on first use."""
    global _WORKER, _EXECUTOR
    with _WORKER_LOCK:
        if _WORKER is None:
            _WORKER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hypic-grammar")
            _EXECUTOR = _llguidance().LLExecutor()
    return _WORKER, _EXECUTOR


def _fill_together(executor: Any, masks: list[GrammarMask], buffer: np.ndarray) -> None:
    """Each of ``masks``' next mask into its row of ``buffer`` in one call of llguidance's executor, then its plan."""
    matchers = [(m.matcher, i) for i, m in enumerate(masks)]
    executor.unsafe_compute_mask_ptr(matchers, buffer.ctypes.data, buffer.shape[1] * 4, len(masks))
    for m in masks:
        m._planned()


class GrammarMask:
    """One sequence's grammar state: ``apply`` the mask before choosing a token, ``advance`` with the one chosen.

    ``also_stop`` are the request's own stop ids: allowed whenever an end of sequence is (the grammar is
    complete). ``budget``: the answer's ``max_new_tokens``, given for a JSON answer (a forced call, a JSON
    response format): in its last ``CLOSING_TOKENS`` (a quarter of a small budget) only tokens that close what is
    open (``GrammarTokenizer.closers``) are allowed where the grammar allows one, and the end once it is
    complete, so that a value the model would run on past the budget (a string that never ends) still closes as
    valid JSON. Elsewhere the grammar's choices (a required key, an enum's letters) are the model's.

    The next token's mask is computed on ``prefetch`` (after ``advance``, while the forward runs; for a batch,
    ``prefetch_together``) or else when it is first needed. Whatever touches the matcher first waits for it."""

    def __init__(
        self, tokenizer: GrammarTokenizer, lark: str, also_stop: Sequence[int] = (), budget: int | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.matcher = tokenizer.matcher(lark)
        self.closing_at = None if budget is None else budget - min(CLOSING_TOKENS, budget // 4)
        self.written = 0
        self.also_stop = tuple(i for i in also_stop if i not in tokenizer.stop_ids)
        vocab = tokenizer.vocab_size
        self._words = np.empty(words_for(vocab), dtype=np.int32)  # llguidance's mask of the next token
        self._plan: Plan | None = None  # what that mask does to a row, once made
        self._pending: Future[None] | None = None
        self._applied: int | None = None  # the storage of a row ``apply_together`` has masked for the next token
        self._stop_ids = np.array(tokenizer.stop_ids, dtype=np.int64)
        self._also_words = pack(self.also_stop, vocab)
        self._end_words = pack([*tokenizer.stop_ids, *self.also_stop], vocab)

    def _raise_if_error(self, what: str) -> None:
        if self.matcher.is_error():
            raise ValueError(f"{what}: {grammar_error(self.matcher.get_error())}")

    def _compute(self) -> None:
        self.matcher.unsafe_compute_mask_ptr(self._words.ctypes.data, self._words.nbytes)
        self._planned()

    def _planned(self) -> None:
        """The request's stops and the closing steer folded into the mask just computed, and its plan."""
        words = self._words
        if self.also_stop and bool(bits_at(words, self._stop_ids).any()):
            words |= self._also_words
        if self.closing_at is not None and self.written >= self.closing_at:
            for steer in (self._end_words, self.tokenizer.closers()):
                steered = words & steer
                if steered.any():
                    words[:] = steered
                    break
        self._plan = self.tokenizer.plans().of(words)

    def _settle(self) -> None:
        """Wait for a mask being computed on the worker: the matcher is then the caller's alone."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def _ready(self) -> bool:
        return self._pending is not None or self._plan is not None

    def prefetch(self) -> None:
        """Start on the next token's mask and its plan on the worker thread, to overlap the forward that makes
        the next logits."""
        if not self._ready() and not self.matcher.is_stopped():
            self._pending = _worker()[0].submit(self._compute)

    @staticmethod
    def prefetch_together(masks: Sequence[GrammarMask]) -> None:
        """``prefetch`` for a batch's masks: one call of llguidance's executor, each mask into its row of one
        buffer, then their plans, on the worker thread."""
        todo = [m for m in masks if not m._ready() and not m.matcher.is_stopped()]
        for size in {len(m._words) for m in todo}:
            group = [m for m in todo if len(m._words) == size]
            buffer = np.empty((len(group), size), dtype=np.int32)
            for i, m in enumerate(group):
                m._words = buffer[i]
            worker, executor = _worker()
            pending = worker.submit(_fill_together, executor, group, buffer)
            for m in group:
                m._pending = pending

    def plan(self) -> Plan:
        """What the next token's mask does to a row (``masking.Plan``): made on the worker when prefetched, else
        now."""
        self._settle()
        if self._plan is None:
            self._compute()
        assert self._plan is not None
        return self._plan

    def allowed(self) -> torch.Tensor:
        """The tokens the grammar allows next, as a bool tensor ``[vocab_size]`` (on the CPU)."""
        self.plan()
        return torch.from_numpy(unpack(self._words, self.tokenizer.vocab_size))

    def apply(self, logits: torch.Tensor, *, scratch: bool = False) -> torch.Tensor:
        """``logits`` ``[V]`` with every token the grammar forbids at ``-inf`` and its probability added to its
        longest allowed prefix's (see the module docstring), as logits: the same distribution as the
        log-probabilities would give any sampler. ``scratch``: the caller reads ``logits`` no more, so a float32
        row is written in place; else the result is a new tensor."""
        vocab = self.tokenizer.vocab_size
        if logits.shape[-1] < vocab:
            raise ValueError(f"a logits row of {logits.shape[-1]} is narrower than the grammar's {vocab} tokens")
        if self._applied is not None and self._applied == logits.data_ptr():
            return logits  # masked with its batch already
        plan = self.plan()
        out = logits if scratch and logits.dtype == torch.float32 else logits.float().clone()
        if out.device.type == "cpu" and out.is_contiguous():
            apply_row(out.numpy(), plan)
        else:
            apply_rows(out.view(1, -1), [plan])
        return out

    @staticmethod
    def apply_together(logits: torch.Tensor, masks: Sequence[GrammarMask | None]) -> None:
        """``apply`` for a batch's rows (``logits`` ``[B, V]`` float32, written in place; a None mask leaves its row
        alone) in one set of device operations (``masking.apply_rows``); each row's own ``apply`` then finds it
        done. A mask whose plan fails is left for its own ``apply`` to raise, on its sequence alone."""
        plans: list[Plan | None] = []
        for mask in masks:
            try:
                plans.append(mask.plan() if mask is not None else None)
            except ValueError:
                plans.append(None)
        apply_rows(logits, plans)
        for row, (mask, plan) in enumerate(zip(masks, plans, strict=True)):
            if mask is not None and plan is not None:
                mask._applied = logits[row].data_ptr()

    def advance(self, token: int) -> None:
        """Take the chosen ``token``; a request stop id ends the sequence without a word to the grammar."""
        self._settle()
        self._plan = self._applied = None
        self.written += 1
        if token in self.also_stop:
            return
        if not self.matcher.consume_token(token):
            self._raise_if_error(f"token {token} broke the output grammar")

    def force(self, ids: Sequence[int]) -> None:
        """Take tokens the engine wrote itself (a forced call opening); a ``ValueError`` if the grammar refuses
        them."""
        self._settle()
        self._plan = self._applied = None
        if ids and not self.matcher.consume_tokens(list(ids)):
            self._raise_if_error("the forced opening does not fit the output grammar")
            raise ValueError("the forced opening does not fit the output grammar")

    @property
    def complete(self) -> bool:
        """Whether the text so far is a whole answer of the grammar."""
        self._settle()
        return bool(self.matcher.is_accepting())
