"""The output grammar's mask (hypic_rag/grammar.py) and the per-sequence logits step (hypic_rag/logits.py)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import torch
from tokenizers import Tokenizer

from hypic_rag.decoding import Sampler
from hypic_rag.grammar import SPACED, GrammarMask, GrammarTokenizer, check_response_format, response_lark
from hypic_rag.logits import Penalties, Picker
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
    assert logits.eq(0).all()  # a new tensor: the caller's logits are left alone
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
        ({"type": "json_schema", "json_schema": {"schema": {"type": "object", "minProperties": "x"}}}, "compile"),
        ({"type": "regex", "regex": "("}, "compile"),
        ({"type": "choice", "choice": []}, "non-empty strings"),
    ]:
        with pytest.raises(ValueError, match=match):
            check_response_format(bad)
    with pytest.raises(OptionError, match="response_format") as caught:
        RequestOptions(response_format={"type": "xml"})
    assert caught.value.option == "response_format"


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
