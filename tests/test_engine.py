"""The engine surface: loading, prompts, decoding, and the errors bad input gets."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hypic_rag import Engine, Segment
from hypic_rag.plan import Prompt


@pytest.fixture(scope="module")
def engine(checkpoint) -> Engine:
    return Engine.from_pretrained(checkpoint("qwen3_5_text"))


@pytest.fixture(scope="module")
def text_engine(checkpoint, tmp_path_factory) -> Engine:
    """The tiny checkpoint with a small BPE tokenizer written beside it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    path = tmp_path_factory.mktemp("with_tokenizer") / "ck"
    shutil.copytree(checkpoint("qwen3_5_text"), path)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<pad>", "<eos>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = ["The capital of Veltria is Ostrava Prime.", "Tool calls are JSON objects.", "hello world"] * 20
    tok.train_from_iterator(corpus, trainer)
    from tokenizers import decoders

    tok.decoder = decoders.ByteLevel()
    tok.save(str(path / "tokenizer.json"))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [1, 2]}))
    return Engine.from_pretrained(path)


def _prompt(n: int, seed: int = 0) -> list[int]:
    return torch.randint(3, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_model_is_a_plain_causal_forward(engine):
    ids = torch.tensor([_prompt(30), _prompt(30, 1)])
    with torch.inference_mode():
        logits = engine.model(ids)
    assert logits.shape == (2, 30, engine.config.vocab_size) and logits.dtype == torch.float32


def test_out_of_vocabulary_ids(engine):
    with pytest.raises(ValueError, match="token id 320 is outside the vocabulary"):
        engine.model(torch.tensor([[5, 320]]))
    with pytest.raises(ValueError, match="token id 999 is outside the vocabulary"):
        engine.generate([Segment(token_ids=[4, 999])], Segment(token_ids=[5]), mode="full")


def test_prompt_past_the_context(engine):
    limit = engine.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"past max_position_embeddings={limit}"):
        engine.model(torch.zeros(1, limit + 1, dtype=torch.long))
    with pytest.raises(ValueError, match="past the model's context"):
        engine.prompt_logits([Segment(token_ids=[3] * limit)], Segment(token_ids=[4]), mode="full")


@pytest.mark.parametrize(
    "segments,query,kwargs,message",
    [
        ([], Segment(token_ids=[]), {}, "empty"),
        ([Segment(token_ids=[])], Segment(token_ids=[4]), {}, "segment 0 tokenizes to no tokens"),
        ([], Segment(token_ids=[4]), {"mode": "fast"}, "unknown mode 'fast'"),
        ([], Segment(token_ids=[4]), {"max_new_tokens": 0}, "max_new_tokens"),
        ([], Segment(token_ids=[4]), {"temperature": -1.0}, "temperature"),
        ([], Segment(token_ids=[4]), {"top_p": 0.0}, "top_p"),
        ("not a list", Segment(token_ids=[4]), {}, "segments must be a list"),
        ([], 42, {}, "query must be a str or a Segment"),
    ],
)
def test_bad_requests(engine, segments, query, kwargs, message):
    with pytest.raises(ValueError, match=message):
        engine.generate(segments, query, **{"mode": "full", **kwargs})


def test_text_needs_a_tokenizer(engine):
    assert engine.tokenizer is None
    with pytest.raises(ValueError, match="no tokenizer files"):
        engine.generate([Segment("a document")], "a question", mode="full")


def test_full_generation_continues_the_prompt_logits(engine):
    segs, query = (
        [Segment(token_ids=_prompt(50)), Segment(token_ids=_prompt(20, 2), kind="tool")],
        Segment(token_ids=_prompt(7, 3)),
    )
    ids = torch.tensor([[i for s in [*segs, query] for i in s.token_ids]])
    with torch.inference_mode():
        expected = engine.model(ids)[0, -1]
    logits = engine.prompt_logits(segs, query, mode="full")
    assert (logits - expected).abs().max() < 1e-5
    engine.eos_token_ids = ()
    out = engine.generate(segs, query, mode="full", max_new_tokens=5)
    assert out.token_ids[0] == int(expected.argmax())
    assert torch.equal(out.prompt_logits, logits)
    assert out.stats["prompt_tokens"] == 77 and out.stats["recomputed_tokens"] == 77
    assert out.stats["miss_segments"] == 2 and out.stats["hit_segments"] == 0
    assert out.ttft_s > 0 and out.text is None and out.finish_reason == "length"


def test_stop_ids_end_generation(engine):
    engine.eos_token_ids = ()
    query = Segment(token_ids=_prompt(40, 4))
    free = engine.generate([], query, mode="full", max_new_tokens=12).token_ids
    stop = free[5]
    first = free.index(stop)
    out = engine.generate([], query, mode="full", max_new_tokens=12, stop_token_ids=[stop])
    assert out.token_ids == free[:first] and out.finish_reason == "stop"


def test_sampling_is_seeded_and_top_p_narrows_to_greedy(engine):
    engine.eos_token_ids = ()
    query = Segment(token_ids=_prompt(30, 5))
    a = engine.generate([], query, mode="full", max_new_tokens=15, temperature=1.0, seed=7).token_ids
    b = engine.generate([], query, mode="full", max_new_tokens=15, temperature=1.0, seed=7).token_ids
    c = engine.generate([], query, mode="full", max_new_tokens=15, temperature=1.0, seed=8).token_ids
    greedy = engine.generate([], query, mode="full", max_new_tokens=15).token_ids
    nucleus = engine.generate([], query, mode="full", max_new_tokens=15, temperature=1.0, top_p=1e-6, seed=1)
    assert a == b and a != c
    assert nucleus.token_ids == greedy


def test_text_generation_streams_and_stops_on_eos(text_engine):
    assert text_engine.eos_token_ids == (1, 2)
    streamed: list[tuple[int, str | None]] = []
    out = text_engine.generate(
        [Segment("The capital of Veltria is Ostrava Prime.", kind="document")],
        "hello",
        mode="full",
        max_new_tokens=30,
        on_token=lambda i, d: streamed.append((i, d)),
    )
    assert [i for i, _ in streamed] == out.token_ids
    assert "".join(d or "" for _, d in streamed) == out.text
    assert not {1, 2} & set(out.token_ids)
    assert out.text == text_engine.decode(out.token_ids)
    doc_ids = text_engine.encode("The capital of Veltria is Ostrava Prime.")
    assert out.stats["prompt_tokens"] == len(doc_ids) + len(text_engine.encode("hello"))


def test_dtype_strings_and_default_model(checkpoint, tmp_path, monkeypatch):
    engine = Engine.from_pretrained(checkpoint("qwen3_5_text"), dtype="bfloat16")
    assert engine.model.dtype == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        Engine.from_pretrained(checkpoint("qwen3_5_text"), dtype="float8")
    assert Engine.from_pretrained().tokenizer is not None  # the bundled model
    monkeypatch.setattr("hypic_rag.hub.default_model_path", lambda: tmp_path)
    with pytest.raises(ValueError, match="bundled default model is missing from this install"):
        Engine.from_pretrained()


def test_a_cache_url_that_is_not_redis_is_refused_not_taken_as_a_folder(checkpoint):
    with pytest.raises(ValueError, match="cache_url must be redis://"):
        Engine.from_pretrained(checkpoint("qwen3_5_text"), cache_url="./cache")


def test_entry_dtype_names_the_store_and_its_fingerprint(checkpoint):
    path = checkpoint("qwen3_5_text")
    wide, half = Engine.from_pretrained(path), Engine.from_pretrained(path, entry_dtype="bfloat16")
    assert half.segment_store.entry_dtype == torch.bfloat16 and half.fingerprint == wide.fingerprint + "+bfloat16"
    ids = list(range(10, 40))
    assert half.plan(Prompt([ids], [3])).segments[0].key != wide.plan(Prompt([ids], [3])).segments[0].key
    with pytest.raises(ValueError, match="entry_dtype must be one of float32, bfloat16, float16, got 'fp8'"):
        Engine.from_pretrained(path, entry_dtype="fp8")


def test_an_engine_let_go_is_freed_at_once():
    """No reference cycle holds an engine (its caches close when the last reference goes, not at the next
    garbage collection): a chat request prepared through it leaves none behind either."""
    import gc
    import weakref

    engine = Engine.from_pretrained()
    engine.chat([{"role": "user", "content": "Where does Bo Ek live?"}], max_new_tokens=2)
    gone = weakref.ref(engine)
    gc.disable()
    try:
        del engine
        assert gone() is None
    finally:
        gc.enable()
