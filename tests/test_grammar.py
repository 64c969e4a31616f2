"""The output grammar's mask (hypic_rag/grammar.py) and the per-sequence logits step (hypic_rag/logits.py)."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer

from hypic_rag.grammar import SPACED, GrammarMask, GrammarTokenizer, check_response_format, response_lark
from hypic_rag.logits import Penalties, Picker, Sampler
from hypic_rag.masking import apply_rows
from hypic_rag.model.loading import default_model_path
from hypic_rag.options import OptionError, RequestOptions

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 12},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"enum": ["c", "f"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
    },
    "required": ["city", "unit"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def bundled() -> tuple[Tokenizer, GrammarTokenizer]:
    tok = Tokenizer.from_file(str(default_model_path() / "tokenizer.json"))
    return tok, GrammarTokenizer(tok, tok.get_vocab_size(), [tok.token_to_id("</a>")])


def _random_walk(gtok: GrammarTokenizer, lark: str, rng: random.Random, limit: int = 400) -> list[int] | None:
    """Tokens drawn uniformly from what the mask allows, ending at the first allowed stop: the grammar alone
    decides what comes out (None: it ran past ``limit``)."""
    mask = GrammarMask(gtok, lark)
    out: list[int] = []
    for _ in range(limit):
        allowed = mask.allowed().nonzero().flatten().tolist()
        ends = [t for t in allowed if t in gtok.stop_ids]
        if ends and (len(ends) == len(allowed) or rng.random() < 0.3):
            return out
        token = rng.choice([t for t in allowed if t not in gtok.stop_ids])
        mask.advance(token)
        out.append(token)
    return None


def test_a_uniformly_random_walk_under_a_schema_mask_is_always_valid(bundled):
    tok, gtok = bundled
    lark = "start: " + response_lark({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, SPACED)
    rng = random.Random(0)
    finished = 0
    for _ in range(60):
        ids = _random_walk(gtok, lark, rng)
        if ids is None:
            continue
        finished += 1
        jsonschema.validate(json.loads(tok.decode(ids)), SCHEMA)
    assert finished >= 50


def test_the_mask_forbids_what_the_schema_forbids(bundled):
    tok, gtok = bundled
    lark = "start: " + response_lark({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, SPACED)
    mask = GrammarMask(gtok, lark)
    logits = torch.zeros(gtok.vocab_size)
    masked = mask.apply(logits)
    allowed = set(torch.isfinite(masked).nonzero().flatten().tolist())
    assert allowed and all(tok.decode([t]).startswith("{") for t in allowed)
    assert tok.token_to_id("</a>") not in allowed  # an empty answer is not a JSON object
    with pytest.raises(ValueError, match="does not fit"):
        GrammarMask(gtok, lark).force(tok.encode('["a"]').ids)


def test_request_stop_ids_end_a_finished_answer_only(bundled):
    tok, gtok = bundled
    extra = tok.token_to_id("<q>")
    mask = GrammarMask(gtok, 'start: "ok"', also_stop=[extra])
    assert not mask.allowed()[extra]
    mask.force(tok.encode("ok").ids)
    assert mask.complete and mask.allowed()[extra] and mask.allowed()[tok.token_to_id("</a>")]
    mask.advance(extra)  # ends the sequence; no word to the grammar


def test_response_format_is_checked_and_normalised():
    assert check_response_format({"type": "text"}) is None
    assert check_response_format({"type": "json_object"}) == {"type": "json_object"}
    spec = check_response_format({"type": "json_schema", "json_schema": {"name": "City", "schema": SCHEMA}})
    assert spec == {"type": "json_schema", "json_schema": {"name": "City", "schema": SCHEMA, "strict": False}}
    assert check_response_format({"type": "choice", "choice": ["yes", "no"]})["choice"] == ["yes", "no"]
    for bad, match in [
        ({"type": "xml"}, "type is one of"),
        ("json", "type is one of"),
        ({"type": "json_schema"}, "needs a 'json_schema'"),
        ({"type": "json_schema", "json_schema": {"schema": []}}, "must be a JSON schema"),
        ({"type": "json_schema", "json_schema": {"schema": {}, "strict": "yes"}}, "strict"),
        ({"type": "json_schema", "json_schema": {"schema": False}}, "admits no value"),
        ({"type": "regex", "regex": "a" * 5000}, "over 4096 characters"),
        ({"type": "choice", "choice": []}, "non-empty strings"),
        ({"type": "choice", "choice": [f"c{i}" for i in range(1001)]}, "up to 1000 options"),
    ]:
        with pytest.raises(ValueError, match=match):
            check_response_format(bad)
    with pytest.raises(OptionError, match="response_format") as caught:
        RequestOptions(response_format={"type": "xml"})
    assert caught.value.option == "response_format"
    schema_true = check_response_format({"type": "json_schema", "json_schema": {"schema": True}})
    assert schema_true["json_schema"]["schema"] == {}  # true: any value


def test_a_grammar_is_compiled_once_and_refused_in_plain_words(bundled):
    """Shapes the compiler refuses, at once or on their first tokens (before any request decodes them): each a
    ValueError without the grammar listing or the parser's state."""
    _, gtok = bundled
    selfref = {
        "$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
        "$ref": "#/$defs/n",
    }
    for bad, match in [
        ({"type": "json_schema", "json_schema": {"schema": {"type": "object", "minProperties": "x"}}}, "."),
        ({"type": "regex", "regex": "("}, "."),
        ({"type": "regex", "regex": "a{1000}{1000}"}, "too large or too complex"),
        ({"type": "json_schema", "json_schema": {"schema": selfref}}, "too large or too complex"),
        ({"type": "json_schema", "json_schema": {"schema": {"enum": ["a"], "type": "object"}}}, "no value satisfies"),
    ]:
        with pytest.raises(ValueError, match=match) as caught:
            gtok.matcher("start: " + response_lark(check_response_format(bad), SPACED))
        message = str(caught.value)
        assert "%llguidance" not in message and "<state>" not in message and "\n" not in message, message
    lark = "start: " + response_lark({"type": "json_object"}, SPACED)
    first = gtok.matcher(lark)
    assert gtok._compiled[lark] is not first  # each use gets its own copy of the kept matcher
    assert gtok.matcher(lark) is not first


def test_logits_options_are_checked_in_request_options():
    good = RequestOptions(presence_penalty=-2, frequency_penalty=2, repetition_penalty=1.3, min_p=0.1)
    assert Penalties.of(good) == Penalties(-2, 2, 1.3)
    assert Penalties.of(RequestOptions(presence_penalty=0, repetition_penalty=1.0)) is None
    assert RequestOptions(logprobs=True, top_logprobs=20).top_logprobs == 20
    for field, bad in [
        ("presence_penalty", 2.5),
        ("frequency_penalty", float("nan")),
        ("repetition_penalty", 0),
        ("min_p", 1.5),
        ("logprobs", 1),
        ("top_logprobs", 21),
    ]:
        with pytest.raises(OptionError, match=field):
            RequestOptions(**{field: bad, **({"logprobs": True} if field == "top_logprobs" else {})})
    with pytest.raises(OptionError, match="needs logprobs"):
        RequestOptions(top_logprobs=2)


def test_penalties_follow_their_definitions():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    picker = Picker(Sampler(), None, penalties=Penalties(0.5, 0.25, 2.0), prompt_ids=[1])
    assert picker.pick(logits) == 3
    # seen: 1 (prompt) and 3 (written once); repetition halves 3's positive logit and doubles 1's negative one,
    # then frequency (0.25 per time) and presence (0.5 once) come off 3.
    expected = torch.tensor([2.0, -2.0, 0.5, 3.0 / 2 - 0.25 - 0.5])
    assert torch.allclose(picker._penalised(logits), expected)
    assert picker.pick(logits) == 0


def test_min_p_drops_the_unlikely_after_temperature():
    logits = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    sampler = Sampler(temperature=1.0, min_p=0.4, seed=0)
    gen = sampler.generator(torch.device("cpu"))
    assert {sampler.pick(logits, gen) for _ in range(300)} == {0, 1}  # 0.1 < 0.4 * 0.6
    with pytest.raises(ValueError, match="min_p"):
        Sampler(min_p=2)


def test_logprobs_are_the_models_own_before_mask_and_penalties(bundled):
    tok, gtok = bundled
    logits = torch.randn(gtok.vocab_size, generator=torch.Generator().manual_seed(0))
    mask = GrammarMask(gtok, 'start: "{" /[a-z]+/ "}"')
    picker = Picker(Sampler(), None, mask=mask, logprobs=3)
    token = picker.pick(logits)
    assert tok.decode([token]).startswith("{")
    own = torch.log_softmax(logits, -1)
    (entry,) = picker.logprobs
    assert entry.token == token and entry.logprob == pytest.approx(float(own[token]))
    assert [i for i, _ in entry.top] == torch.topk(own, 3).indices.tolist()


# What docs/serving.md says of JSON-schema keywords: each enforced one refuses an instance that breaks it, each
# refused one is a ValueError (a 400 over HTTP) before anything runs.
ENFORCED = {
    "type": ({"type": "integer"}, "x"),
    "enum": ({"enum": ["a", "b"]}, "c"),
    "const": ({"const": "a"}, "b"),
    "required": ({"type": "object", "properties": {"a": {}}, "required": ["a"]}, {}),
    "additionalProperties": ({"type": "object", "properties": {"a": {}}, "additionalProperties": False}, {"b": 1}),
    "patternProperties": (
        {"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
        {"y": 1},
    ),
    "minProperties": ({"type": "object", "minProperties": 1}, {}),
    "maxProperties": ({"type": "object", "maxProperties": 1}, {"a": 1, "b": 2}),
    "items": ({"type": "array", "items": {"type": "integer"}}, ["x"]),
    "prefixItems": ({"type": "array", "prefixItems": [{"type": "integer"}]}, ["x"]),
    "minItems": ({"type": "array", "minItems": 1}, []),
    "maxItems": ({"type": "array", "maxItems": 1}, [1, 2]),
    "minLength": ({"type": "string", "minLength": 2}, "a"),
    "maxLength": ({"type": "string", "maxLength": 2}, "abc"),
    "pattern": ({"type": "string", "pattern": "^a+$"}, "ab"),
    "format": ({"type": "string", "format": "date"}, "2024-13-01"),
    "minimum": ({"type": "integer", "minimum": 0}, -1),
    "maximum": ({"type": "integer", "maximum": 9}, 10),
    "exclusiveMinimum": ({"type": "number", "exclusiveMinimum": 0}, 0),
    "multipleOf": ({"type": "integer", "multipleOf": 3}, 4),
    "anyOf": ({"anyOf": [{"type": "integer"}, {"type": "boolean"}]}, "x"),
    "allOf": ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, {}),
    "$ref": ({"$defs": {"n": {"type": "integer"}}, "$ref": "#/$defs/n"}, "x"),
}
REFUSED = {
    "oneOf": {"oneOf": [{"type": "integer"}, {"type": "number"}]},
    "not": {"not": {"type": "integer"}},
    "if": {"if": {"type": "integer"}, "then": {"minimum": 0}},
    "uniqueItems": {"type": "array", "uniqueItems": True},
    "contains": {"type": "array", "contains": {"type": "integer"}},
    "propertyNames": {"type": "object", "propertyNames": {"pattern": "^a"}},
    "dependentRequired": {"type": "object", "dependentRequired": {"a": ["b"]}},
    "dependentSchemas": {"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}},
    "unevaluatedProperties": {"type": "object", "unevaluatedProperties": False},
    "format (unknown)": {"type": "string", "format": "zip-code"},
}


def _accepts(gtok: GrammarTokenizer, tok: Tokenizer, schema: dict, instance) -> bool:
    mask = GrammarMask(
        gtok, "start: " + response_lark({"type": "json_schema", "json_schema": {"schema": schema}}, SPACED)
    )
    ids = tok.encode(json.dumps(instance, separators=SPACED)).ids
    return all(mask.matcher.consume_token(i) for i in ids) and mask.complete


@pytest.mark.parametrize("keyword", list(ENFORCED))
def test_each_enforced_schema_keyword_refuses_an_instance_that_breaks_it(keyword, bundled):
    tok, gtok = bundled
    schema, breaking = ENFORCED[keyword]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(breaking, schema, format_checker=jsonschema.FormatChecker())  # it does break it
    assert not _accepts(gtok, tok, schema, breaking)
    walk = _random_walk(
        gtok,
        "start: " + response_lark({"type": "json_schema", "json_schema": {"schema": schema}}, SPACED),
        random.Random(1),
    )
    if walk is not None:  # what the mask lets through is valid
        jsonschema.validate(json.loads(tok.decode(walk)), schema, format_checker=jsonschema.FormatChecker())


@pytest.mark.parametrize("keyword", list(REFUSED))
def test_each_refused_schema_keyword_is_a_clear_error(keyword, bundled):
    spec = check_response_format({"type": "json_schema", "json_schema": {"schema": REFUSED[keyword]}})
    with pytest.raises(ValueError, match=".") as caught:
        bundled[1].matcher("start: " + response_lark(spec, SPACED))
    assert "%json" not in str(caught.value) and "\n" not in str(caught.value)


def test_json_object_answers_are_objects(bundled):
    tok, gtok = bundled
    lark = "start: " + response_lark({"type": "json_object"}, SPACED)
    finished = [w for seed in range(20) if (w := _random_walk(gtok, lark, random.Random(seed))) is not None]
    assert len(finished) >= 5 and all(isinstance(json.loads(tok.decode(w)), dict) for w in finished)
    assert not _accepts(gtok, tok, {"type": "object"}, [1])


def test_a_forbidden_token_hands_its_probability_to_its_longest_allowed_prefix(bundled):
    tok, gtok = bundled
    lark = "start: " + response_lark({"type": "json_schema", "json_schema": {"schema": {"type": "string"}}}, SPACED)
    mask = GrammarMask(gtok, lark)
    mask.advance(tok.token_to_id('"'))
    mask.advance(tok.encode("Oslo").ids[0])
    merged = [i for t, i in tok.get_vocab().items() if t.startswith('"') and len(t) > 1 and not mask.allowed()[i]]
    assert merged  # a token closing the string and going on, which the grammar forbids
    logits = torch.full((tok.get_vocab_size(),), -20.0)
    logits[merged[0]] = 10.0  # the model means to close the string
    out = mask.apply(logits)
    assert torch.isinf(out[merged[0]]) and int(out.argmax()) == tok.token_to_id('"')
    # no probability lost: every forbidden token had an heir here
    torch.testing.assert_close(torch.logsumexp(out, -1), torch.logsumexp(logits, -1))


def test_a_json_answer_near_its_budget_is_steered_to_close(bundled):
    """A model that would write a string forever (greedy on a letter) still ends with valid JSON inside its
    budget when the mask knows the budget; without it, the walk runs on."""
    tok, gtok = bundled
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["city", "tags"],
    }
    lark = "start: " + response_lark({"type": "json_schema", "json_schema": {"schema": schema}}, SPACED)
    letter = tok.token_to_id("a")
    for budget, closes in ((80, True), (None, False)):
        mask = GrammarMask(gtok, lark, budget=budget)
        written: list[int] = []
        for _ in range(80):
            logits = torch.zeros(gtok.vocab_size)
            logits[letter] = 5.0  # the model's wish: more letters
            token = int(mask.apply(logits).argmax())
            if token in gtok.stop_ids:
                break
            mask.advance(token)
            written.append(token)
        assert mask.complete == closes, tok.decode(written)
        if closes:
            jsonschema.validate(json.loads(tok.decode(written)), schema)


def _reference(logits: torch.Tensor, allowed: torch.Tensor, prefixes: np.ndarray) -> torch.Tensor:
    """The mask and hand-over as the definition reads, over the whole row in float64: each forbidden token's
    probability to its longest allowed prefix, everything forbidden (and past the vocabulary) at -inf."""
    vocab = allowed.numel()
    row = logits.double()
    chains = torch.from_numpy(prefixes).long()
    heir = torch.full((vocab,), -1, dtype=torch.long)
    for column in reversed(range(chains.shape[1])):  # the first allowed in the chain wins: the longest
        c = chains[:, column]
        heir = torch.where((c >= 0) & allowed[c.clamp(min=0)], c, heir)
    movers = torch.nonzero(~allowed & (heir >= 0)).flatten()
    probs = torch.zeros(row.numel(), dtype=torch.float64)
    probs[:vocab][allowed] = torch.softmax(row, -1)[:vocab][allowed]
    probs.index_add_(0, heir[movers], torch.softmax(row, -1)[movers])
    return (probs / probs.sum()).log()  # what a forbidden token without an heir had is lost to all alike


@pytest.mark.parametrize("also_stop", [(), (7,)])
def test_the_mask_hands_over_as_the_definition_reads_at_every_step(bundled, also_stop):
    """``apply`` lists only the small side of llguidance's packed mask (the forbidden tokens inside a string, the
    allowed ones elsewhere) and writes logits, not log-probabilities; the batch path (``masking.apply_rows``, what
    a device row takes) writes a whole batch at once. On walks under a schema, with peaked, flat and padded rows,
    both give the distribution of the plain definition (``_reference``): the same tokens forbidden, the same
    probabilities handed to the same prefixes."""
    tok, gtok = bundled
    lark = "start: " + response_lark({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, SPACED)
    rng = random.Random(1)
    generator = torch.Generator().manual_seed(1)
    vocab = gtok.vocab_size
    sides = set()
    for _ in range(6):
        ids = _random_walk(gtok, lark, rng) or []
        mask = GrammarMask(gtok, lark, also_stop=also_stop)
        for token in [*ids, None]:
            rows = [
                torch.randn(vocab, generator=generator) * 8,  # peaked: few tokens carry mass
                torch.zeros(vocab),  # flat: every token does
                torch.randn(vocab + 5, generator=generator),  # padded past the tokenizer's vocabulary
            ]
            batch = torch.stack([torch.nn.functional.pad(r, (0, vocab + 5 - r.numel())) for r in rows])
            apply_rows(batch, [mask.plan()] * len(rows))
            for row, batched in zip(rows, batch, strict=True):
                expected = _reference(row, mask.allowed(), gtok.prefix_table())
                for got in (mask.apply(row), batched[: row.numel()]):
                    got = torch.log_softmax(got.double(), -1)
                    assert torch.equal(torch.isinf(got), torch.isinf(expected))
                    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
            sides.add(mask.plan().keeps)
            if token is not None:
                mask.advance(token)
    assert sides == {True, False}  # both sides of the mask were listed


def test_a_row_is_written_in_place_only_when_the_caller_lets_it(bundled):
    tok, gtok = bundled
    mask = GrammarMask(gtok, "start: " + response_lark({"type": "json_object"}, SPACED))
    row = torch.zeros(gtok.vocab_size)
    assert mask.apply(row) is not row and row.eq(0).all()
    assert mask.apply(row, scratch=True) is row and torch.isinf(row).any()
    with pytest.raises(ValueError, match="narrower"):
        mask.apply(torch.zeros(gtok.vocab_size - 1))


def test_masks_prefetched_alone_or_together_are_the_ones_computed_when_asked(bundled):
    """The next mask computed on the worker (after ``advance``, or a batch's in one call of llguidance's
    executor) is the mask computed on demand, and the matcher is waited for before anything else reads it."""
    tok, gtok = bundled
    lark = "start: " + response_lark({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, SPACED)
    walks = [w for seed in range(8) if (w := _random_walk(gtok, lark, random.Random(seed)))][:3]
    asked = [GrammarMask(gtok, lark) for _ in walks]
    alone = [GrammarMask(gtok, lark) for _ in walks]
    together = [GrammarMask(gtok, lark) for _ in walks]
    for step in range(max(len(w) for w in walks)):
        GrammarMask.prefetch_together(together)
        for mask in alone:
            mask.prefetch()
        for walk, a, b, c in zip(walks, asked, alone, together, strict=True):
            assert torch.equal(a.allowed(), b.allowed()) and torch.equal(a.allowed(), c.allowed())
            if step < len(walk):
                for mask in (a, b, c):
                    mask.advance(walk[step])
    assert all(m.complete for m in (*asked, *alone, *together))


def test_a_batchs_masks_go_on_its_rows_together_as_each_alone(bundled):
    """``apply_together`` (a device batch's one set of operations) writes each row as its own ``apply`` would,
    leaves a row without a mask alone, and each mask's ``apply`` then finds its row done; a mask whose grammar
    fails is left for its own ``apply`` to raise."""
    tok, gtok = bundled
    lark = "start: " + response_lark({"type": "json_schema", "json_schema": {"schema": SCHEMA}}, SPACED)
    walk = next(w for seed in range(8) if (w := _random_walk(gtok, lark, random.Random(seed))))
    masks = [GrammarMask(gtok, lark), None, GrammarMask(gtok, lark)]
    for token in walk[:5]:
        masks[2].advance(token)  # the two masks at different places in the answer
    logits = torch.randn(3, gtok.vocab_size, generator=torch.Generator().manual_seed(0)) * 4
    alone = [m.apply(row) if m is not None else row.clone() for m, row in zip(masks, logits, strict=True)]
    GrammarMask.apply_together(logits, masks)
    for mask, row, expected in zip(masks, logits, alone, strict=True):
        torch.testing.assert_close(row, expected, rtol=1e-5, atol=1e-5)
        if mask is not None:
            assert mask.apply(row, scratch=True) is row
            mask.advance(int(row.argmax()))
            assert mask._applied is None  # the next token's row is masked afresh
    broken = GrammarMask(gtok, 'start: "ok"')
    broken.plan = lambda: (_ for _ in ()).throw(ValueError("broken"))  # type: ignore[method-assign]
    GrammarMask.apply_together(torch.zeros(1, gtok.vocab_size), [broken])
    with pytest.raises(ValueError, match="broken"):
        broken.apply(torch.zeros(gtok.vocab_size))
