"""Grammar-constrained decoding: a token mask per sequence, so that JSON answers and tool calls come out well
formed whatever the weights would have written.

A grammar is Lark text in llguidance's dialect (``%json {schema}`` embeds a JSON schema, ``name[lazy]: ...``
matches text up to the first occurrence of what follows, ``<tag>`` is an added token). ``GrammarTokenizer``
holds the engine's tokenizer in llguidance's form; ``GrammarMask`` follows one sequence: ``apply`` masks the
logits of the next token to what the grammar allows, ``advance`` takes the token chosen. The chat formats'
grammars (text or calls of the offered tools) are built in ``chat.grammar``; this module knows requests'
``response_format`` and the library.

A token the grammar forbids is not simply dropped: its probability goes to the longest allowed token that spells
a prefix of it (``GrammarTokenizer.prefixes``). BPE merges text across the grammar's boundaries (``"},"`` closes a
string and an object at once), so a model that means "close the string here" may put nearly all its mass on a merged
token the grammar refuses; masking it alone leaves the choice to the noise among the rest, and a string that should
have closed runs on until ``max_tokens``. Handing the mass to ``"`` keeps what the model meant. llguidance gives
the mask; the hand-over is ours, as no grammar library offers it.

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
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import torch

from .json_schema import check_schema, for_grammar

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
        self._closers: torch.Tensor | None = None
        self._prefixes: dict[torch.device, torch.Tensor] = {}
        self._descendants: tuple[torch.Tensor, torch.Tensor] | None = None  # CSR: prefix -> tokens extending it
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

    def prefixes(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[vocab_size, depth]`` int32 on ``device``: each token's proper prefixes that are tokens themselves,
        longest first, -1 past the last (special tokens have and are none); made on first use, as it walks the
        vocabulary, and kept per device, as every constrained step reads it."""
        device = torch.device(device)
        if device not in self._prefixes and self._prefixes:
            self._prefixes[device] = next(iter(self._prefixes.values())).to(device)
        if device not in self._prefixes:
            texts = self.texts()
            spelled: dict[bytes, int] = {}
            for i, text in enumerate(texts):
                if text:
                    spelled.setdefault(text, i)
            chains = [[j for n in range(len(t) - 1, 0, -1) if (j := spelled.get(t[:n])) is not None] for t in texts]
            depth = max((len(c) for c in chains), default=0)
            table = torch.full((self.vocab_size, max(depth, 1)), -1, dtype=torch.int32)
            for i, chain in enumerate(chains):
                if chain:
                    table[i, : len(chain)] = torch.tensor(chain, dtype=torch.int32)
            self._prefixes[device] = table.to(device)
        return self._prefixes[device]

    def descendants(self, ids: torch.Tensor) -> torch.Tensor:
        """The tokens that have one of ``ids`` among their proper prefixes (``prefixes``), each once: the only
        ones a token in ``ids`` can inherit probability from. A table of edges sorted by prefix, made on first
        use."""
        if self._descendants is None:
            table = self.prefixes()
            child = torch.arange(table.shape[0], dtype=torch.long)[:, None].expand_as(table)
            keep = table >= 0
            parent, child = table[keep].long(), child[keep]
            order = torch.argsort(parent, stable=True)
            starts = torch.zeros(self.vocab_size + 1, dtype=torch.long)
            starts[1:] = torch.cumsum(torch.bincount(parent, minlength=self.vocab_size), 0)
            self._descendants = (starts, child[order])
        starts, children = self._descendants
        lo, hi = starts[ids], starts[ids + 1]
        counts = hi - lo
        if int(counts.sum()) == 0:
            return torch.empty(0, dtype=torch.long)
        offsets = torch.repeat_interleave(lo - torch.cumsum(counts, 0) + counts, counts)
        found = children[offsets + torch.arange(int(counts.sum()))]
        return torch.unique(found)

    def tag(self, text: str) -> str:
        """A tag as a Lark item: the added token that spells it, which is what the model was trained to write
        (llguidance never matches an added token against text), else the text itself."""
        if text in self._added and text.startswith("<") and text.endswith(">"):
            return text
        return lark_string(text)

    def is_token(self, text: str) -> bool:
        return text in self._added

    def closers(self) -> torch.Tensor:
        """``[vocab_size]`` bool: the tokens made only of ``"``, ``}`` and ``]``, which close what a JSON text has
        open; made on first use."""
        if self._closers is None:
            ids = [i for i, text in enumerate(self.texts()) if text and set(text) <= set(b'"}]')]
            self._closers = torch.zeros(self.vocab_size, dtype=torch.bool)
            self._closers[ids] = True
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


_LANES = torch.arange(32, dtype=torch.int32)


def _bits_at(words: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Whether each of ``ids`` (any shape) is set in llguidance's packed mask (bit ``i % 32`` of word ``i // 32``)."""
    return ((words[ids // 32] >> (ids % 32).int()) & 1).bool()


def _set_bits(words: torch.Tensor, ids: torch.Tensor) -> None:
    for i in ids.tolist():
        words[i // 32] |= torch.tensor(1, dtype=torch.int32) << (i % 32)


def _ids_where(words: torch.Tensor, at: torch.Tensor, vocab: int, *, allowed: bool) -> torch.Tensor:
    """The ids below ``vocab`` whose bit is set (``allowed``) or clear in the words at ``at``."""
    bits = ((words[at][:, None] >> _LANES) & 1).bool()
    ids = (at[:, None] * 32 + _LANES)[bits if allowed else ~bits]
    return ids[ids < vocab]


class GrammarMask:
    """One sequence's grammar state: ``apply`` the mask before choosing a token, ``advance`` with the one chosen.

    ``also_stop`` are the request's own stop ids: allowed whenever an end of sequence is (the grammar is
    complete). ``budget``: the answer's ``max_new_tokens``, given for a JSON answer (a forced call, a JSON
    response format): in its last ``CLOSING_TOKENS`` (a quarter of a small budget) only tokens that close what is
    open (``GrammarTokenizer.closers``) are allowed where the grammar allows one, and the end once it is
    complete, so that a value the model would run on past the budget (a string that never ends) still closes as
    valid JSON. Elsewhere the grammar's choices (a required key, an enum's letters) are the model's."""

    packed_from = 1 << 15  # the vocabulary size from which ``apply`` reads llguidance's packed mask

    def __init__(
        self, tokenizer: GrammarTokenizer, lark: str, also_stop: Sequence[int] = (), budget: int | None = None
    ) -> None:
        self.tokenizer = tokenizer
        self.matcher = tokenizer.matcher(lark)
        self.closing_at = None if budget is None else budget - min(CLOSING_TOKENS, budget // 4)
        self.written = 0
        self.also_stop = tuple(i for i in also_stop if i not in tokenizer.stop_ids)
        self._bits = torch.arange(8, dtype=torch.uint8)
        self._words = torch.empty((tokenizer.vocab_size + 31) // 32, dtype=torch.int32)  # llguidance's mask
        self._stop_ids = torch.tensor(tokenizer.stop_ids, dtype=torch.long)
        self._also_stop_ids = torch.tensor(self.also_stop, dtype=torch.long)

    def _raise_if_error(self, what: str) -> None:
        if self.matcher.is_error():
            raise ValueError(f"{what}: {grammar_error(self.matcher.get_error())}")

    def allowed(self) -> torch.Tensor:
        """The tokens the grammar allows next, as a bool tensor ``[vocab_size]`` (on the CPU)."""
        packed = torch.frombuffer(bytearray(self.matcher.compute_bitmask()), dtype=torch.uint8)
        allowed = ((packed[:, None] >> self._bits) & 1).bool().flatten()[: self.tokenizer.vocab_size]
        if self.also_stop and bool(allowed[list(self.tokenizer.stop_ids)].any()):
            allowed[list(self.also_stop)] = True
        if self.closing_at is not None and self.written >= self.closing_at:
            ends = torch.zeros_like(allowed)
            ends[[*self.tokenizer.stop_ids, *self.also_stop]] = True
            for steer in (ends, self.tokenizer.closers()):
                if bool((allowed & steer).any()):
                    return allowed & steer
        return allowed

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``[V]`` as log-probabilities with every token the grammar forbids at ``-inf`` and its
        probability added to its longest allowed prefix's (see the module docstring); a new tensor.

        On the CPU the allowed set stays llguidance's packed words, and only the side of it that is small is
        listed: the forbidden tokens when most are allowed (inside a string), else the allowed ones, whose
        descendants (``GrammarTokenizer.descendants``) are the only forbidden tokens with an allowed prefix. The
        result is the dense path's (``_apply_dense``), which a GPU row, the closing steer and a vocabulary under
        ``packed_from`` take (there a few passes over a short row cost less than listing ids)."""
        closing = self.closing_at is not None and self.written >= self.closing_at
        small = self.tokenizer.vocab_size < self.packed_from
        if small or logits.device.type != "cpu" or closing or logits.numel() < self.tokenizer.vocab_size:
            return self._apply_dense(logits)
        words = self._words
        self.matcher.unsafe_compute_mask_ptr(words.data_ptr(), words.numel() * words.element_size())
        if self.also_stop and bool(_bits_at(words, self._stop_ids).any()):
            _set_bits(words, self._also_stop_ids)
        vocab = self.tokenizer.vocab_size
        logp = torch.log_softmax(logits.float(), dim=-1)
        holding = torch.nonzero(words != 0).flatten()  # the words with an allowed token: list the smaller side
        if holding.numel() * 2 > words.numel():
            forbidden = _ids_where(words, torch.nonzero(words != -1).flatten(), vocab, allowed=False)
            out = logp.index_fill(0, forbidden, float("-inf"))
            candidates = forbidden
        else:
            allowed = _ids_where(words, holding, vocab, allowed=True)
            out = torch.full_like(logp, float("-inf"))
            out[allowed] = logp[allowed]
            candidates = self.tokenizer.descendants(allowed)
            candidates = candidates[~_bits_at(words, candidates)]
        if logits.numel() > vocab:  # a model vocabulary padded past the tokenizer's: never allowed
            out[vocab:] = float("-inf")
        movers = candidates[logp[candidates] > -30.0]
        return self._hand_over(out, logp, movers, lambda ids: _bits_at(words, ids))

    def _apply_dense(self, logits: torch.Tensor) -> torch.Tensor:
        """``apply`` over boolean rows as wide as the vocabulary (any device)."""
        allowed = self.allowed().to(logits.device)
        if allowed.numel() < logits.numel():  # a model vocabulary padded past the tokenizer's
            allowed = torch.cat([allowed, allowed.new_zeros(logits.numel() - allowed.numel())])
        allowed = allowed[: logits.numel()]
        logp = torch.log_softmax(logits.float(), dim=-1)
        out = logp.masked_fill(~allowed, float("-inf"))
        # forbidden tokens with mass to hand over (a vocabulary padded past the tokenizer's has no prefixes there)
        limit = min(logits.numel(), self.tokenizer.vocab_size)
        movers = torch.nonzero(~allowed[:limit] & (logp[:limit] > -30.0)).flatten()
        return self._hand_over(out, logp, movers, lambda ids: allowed[ids])

    def _hand_over(
        self,
        out: torch.Tensor,
        logp: torch.Tensor,
        movers: torch.Tensor,
        allowed_at: Callable[[torch.Tensor], torch.Tensor],
    ) -> torch.Tensor:
        """``out`` with the probability of each of ``movers`` (forbidden tokens with mass) added to its longest
        allowed prefix's, ``allowed_at(ids)`` saying which ids the grammar allows; both paths of ``apply`` end here."""
        if movers.numel() == 0:
            return out
        chains = self.tokenizer.prefixes(out.device)[movers].long()  # [n, depth]
        ok = (chains >= 0) & allowed_at(chains.clamp(min=0))
        has = ok.any(dim=1)
        if not bool(has.any()):
            return out
        heir = chains.gather(1, ok.int().argmax(dim=1, keepdim=True)).squeeze(1)[has]  # first allowed: the longest
        heirs, which = torch.unique(heir, return_inverse=True)
        gained = torch.zeros(heirs.numel(), dtype=logp.dtype, device=logp.device)
        gained.index_add_(0, which, logp[movers[has]].exp())
        out[heirs] = torch.logaddexp(out[heirs], gained.log())
        return out

    def advance(self, token: int) -> None:
        """Take the chosen ``token``; a request stop id ends the sequence without a word to the grammar."""
        self.written += 1
        if token in self.also_stop:
            return
        if not self.matcher.consume_token(token):
            self._raise_if_error(f"token {token} broke the output grammar")

    def force(self, ids: Sequence[int]) -> None:
        """Take tokens the engine wrote itself (a forced call opening); a ``ValueError`` if the grammar refuses
        them."""
        if ids and not self.matcher.consume_tokens(list(ids)):
            self._raise_if_error("the forced opening does not fit the output grammar")
            raise ValueError("the forced opening does not fit the output grammar")

    @property
    def complete(self) -> bool:
        """Whether the text so far is a whole answer of the grammar."""
        return bool(self.matcher.is_accepting())
