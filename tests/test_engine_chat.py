"""``Engine.chat`` and ``Engine.render`` on a random-weight checkpoint that ships a Qwen-style tokenizer,
chat template and generation config, checked against transformers on the same files."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from hypic_rag import Engine
from hypic_rag.chat.conversation import thinking_opened
from hypic_rag.chat.formats.base import NONE
from hypic_rag.generation_config import GenerationDefaults
from hypic_rag.options import RequestOptions
from hypic_rag.testing.synthetic import TEMPLATES

DOCS = ["Ana Lee lives in Oslo.", "Bo Ek lives in Rome.", "Cy Ru lives in Lima and works as a pilot."]


def _ask(docs: list[str], question: str = "Who lives in Rome?") -> list[dict]:
    context = "\n\n".join(docs)
    user = f"Answer the question based only on the following context:\n{context}\n\nQuestion: {question}"
    return [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": user}]


@pytest.fixture(scope="module")
def engine(chat_checkpoint) -> Engine:
    return Engine.from_pretrained(chat_checkpoint, min_cached_tokens=1)


@pytest.fixture(scope="module")
def hf_tokenizer(chat_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(chat_checkpoint)


@pytest.mark.parametrize("thinking", [None, True, False])
def test_render_equals_transformers_apply_chat_template(engine, hf_tokenizer, thinking):
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    messages = _ask(DOCS)
    rendered = engine.render(messages, chat_template_kwargs=kwargs)
    expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    assert rendered.text == expected
    assert "".join(s.text for s in rendered.segments) + rendered.query.text == expected
    # Prompt ids are the concatenation of each segment's own ids, then the query's.
    ids = [i for s in rendered.segments for i in engine.encode(s.text)] + engine.encode(rendered.query.text)
    assert rendered.token_ids == ids
    if thinking is False:
        assert rendered.text.endswith("<think>\n\n</think>\n\n")


def test_full_mode_logits_equal_transformers_on_the_same_ids(engine, chat_checkpoint, reference):
    out = engine.chat(_ask(DOCS), mode="full", max_new_tokens=1, temperature=0.0)
    ids = engine.render(_ask(DOCS)).token_ids
    with torch.inference_mode():
        theirs = reference(chat_checkpoint)(torch.tensor([ids])).logits[0, -1]
    assert (out.prompt_logits - theirs).abs().max() < 1e-4


def test_reordered_documents_hit_every_document_segment_through_chat(engine):
    engine.clear_cache()
    first = engine.chat(_ask(DOCS), max_new_tokens=1, temperature=0.0)
    assert first.stats["hit_segments"] == 0
    again = engine.chat(_ask(DOCS[::-1]), max_new_tokens=1, temperature=0.0)
    cached = [s.text for s in engine.render(_ask(DOCS[::-1])).segments if s.cache]
    assert cached == ["You are a helpful assistant.", *DOCS[::-1]]
    assert again.stats["hit_segments"] == len(cached)
    # Glue (role headers, separators) runs in context: only the cached pieces hit, and the answer
    # is computed over the same token ids as a full prefill of the rendered text.
    full = engine.chat(_ask(DOCS[::-1]), mode="full", max_new_tokens=1, temperature=0.0)
    assert full.stats["prompt_tokens"] == again.stats["prompt_tokens"]


def test_generation_settings_come_from_generation_config(chat_checkpoint, tmp_path):
    path = tmp_path / "ck"
    shutil.copytree(chat_checkpoint, path)
    config = json.loads((path / "generation_config.json").read_text())
    config.update(max_new_tokens=3, do_sample=True, temperature=0.7, top_p=0.8, top_k=5)
    (path / "generation_config.json").write_text(json.dumps(config))
    engine = Engine.from_pretrained(path)
    assert engine.generation_defaults == GenerationDefaults(0.7, 0.8, 5, 3, True)

    def filled(defaults):
        options = RequestOptions().with_defaults(defaults)
        return {k: getattr(options, k) for k in ("max_new_tokens", "temperature", "top_p", "top_k")}

    assert filled(engine.generation_defaults) == {"max_new_tokens": 3, "temperature": 0.7, "top_p": 0.8, "top_k": 5}
    assert filled(GenerationDefaults(do_sample=False, temperature=0.7))["temperature"] == 0.0
    assert (
        filled(GenerationDefaults())
        == filled(None)
        == {
            "max_new_tokens": 64,
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": None,
        }
    )
    # what a request sets wins over the checkpoint's defaults
    assert RequestOptions(temperature=0.0, top_k=0).with_defaults(engine.generation_defaults).top_k == 0
    out = engine.chat(_ask(DOCS), seed=0)
    assert len(out.token_ids) <= 3
    a, b = (engine.chat(_ask(DOCS), seed=7, max_new_tokens=8) for _ in range(2))
    assert a.token_ids == b.token_ids  # sampled, and reproducible with a seed


def test_chat_stops_on_every_eos_and_the_end_of_turn_token(engine):
    im_end = engine.tokenizer.token_to_id("<|im_end|>")
    assert engine.chat_setup.end_of_turn_ids == (im_end,)
    assert engine.chat_setup.format.name == "qwen3_json"
    out = engine.chat(_ask(DOCS), max_new_tokens=40, temperature=0.0)
    stops = set(engine.eos_token_ids) | {im_end}
    assert not stops & set(out.token_ids)
    assert out.finish_reason in ("stop", "length")


def test_chat_errors(engine, checkpoint):
    bare = Engine.from_pretrained(checkpoint("qwen3_5_text"))
    with pytest.raises(ValueError, match="has no chat template"):
        bare.chat([{"role": "user", "content": "hi"}])
    assert bare.chat_format is NONE and engine.chat_format is not NONE  # no template, no format to write for
    with pytest.raises(ValueError, match="role must be one of"):
        engine.chat([{"role": "narrator", "content": "hi"}])
    with pytest.raises(ValueError, match="segmentation must be one of"):
        engine.render([{"role": "user", "content": "hi"}], segmentation="sentences")


def test_stop_strings_cut_the_text_and_the_stream(engine):
    free = engine.chat(_ask(DOCS), max_new_tokens=24, temperature=0.0, segmentation="none")
    raw = engine.decode(free.token_ids)
    assert len(raw) > 12, raw
    stop = raw[6:9]
    expected = raw[: raw.find(stop)]
    streamed: list[str] = []
    out = engine.chat(
        _ask(DOCS),
        max_new_tokens=24,
        temperature=0.0,
        segmentation="none",
        stop=[stop],
        on_token=lambda _i, d: streamed.append(d or ""),
    )
    assert out.finish_reason == "stop"
    assert engine.decode(out.token_ids).startswith(expected) and stop not in "".join(streamed)
    assert "".join(streamed) == expected  # nothing past the stop string was streamed, nothing before it lost
    assert out.text == expected.strip()  # chat's content is stripped, as transformers-style parsers do
    with pytest.raises(ValueError, match="stop must be a list of strings"):
        engine.chat(_ask(DOCS), stop="x")


def test_held_back_text_is_flushed_when_no_stop_string_comes(engine):
    streamed: list[tuple[int, str]] = []
    out = engine.chat(
        _ask(DOCS),
        max_new_tokens=12,
        temperature=0.0,
        stop=["\ue123never"],
        on_token=lambda i, d: streamed.append((i, d or "")),
    )
    assert "".join(d for _, d in streamed) == engine.decode(out.token_ids)
    assert [i for i, _ in streamed if i != -1] == out.token_ids


def test_start_chat_runs_to_the_same_answer_and_can_be_cancelled(engine):
    whole = engine.chat(_ask(DOCS), max_new_tokens=10, temperature=0.0)
    run = engine.start_chat(_ask(DOCS), max_new_tokens=10, temperature=0.0)
    assert engine.run_together([run])[0].token_ids == whole.token_ids
    flag = {"stop": False}
    run = engine.start_chat(
        _ask(DOCS),
        max_new_tokens=10,
        temperature=0.0,
        cancelled=lambda: flag["stop"],
        on_token=lambda _i, _d: flag.update(stop=True),  # cancelled once its first token is out
    )
    out = engine.run_together([run])[0]
    assert out.finish_reason == "cancelled" and out.token_ids == whole.token_ids[:1]
    assert engine.chat(_ask(DOCS), max_new_tokens=10, cancelled=lambda: True).finish_reason == "cancelled"
    with pytest.raises(ValueError, match="has not finished"):
        engine.start_chat(_ask(DOCS), max_new_tokens=10).output()


WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def test_tool_choice_forces_the_opening_of_a_call(engine):
    named = {"type": "function", "function": {"name": "get_weather"}}
    plain = engine.chats.render(_ask(DOCS), [WEATHER], None, "auto")
    rendered, prompt, opening_ids = engine.chats.force_call(*plain, "get_weather", thinking_opened(plain[0].text))
    assert rendered.answer_prefix == '<tool_call>\n{"name": "get_weather", "arguments":'
    assert rendered.text == engine.render(_ask(DOCS), [WEATHER]).text + rendered.answer_prefix
    forced_ids = engine.encode(rendered.answer_prefix)  # tokenized on its own, as the model would write it
    assert prompt.query == engine.encode(engine.render(_ask(DOCS), [WEATHER]).query.text) + forced_ids
    assert opening_ids == forced_ids  # what the output grammar is fed before decoding
    out = engine.chat(_ask(DOCS), tools=[WEATHER], tool_choice=named, max_new_tokens=6)
    # The random model does not finish the call: it comes back as the partial call it is, never as content.
    if not out.tool_calls:
        assert out.finish_reason == "length" and out.text == "" and out.partial_call["name"] == "get_weather"
    else:
        assert [c["name"] for c in out.tool_calls] == ["get_weather"]
    none = engine.chat(_ask(DOCS), tools=[WEATHER], tool_choice="none", max_new_tokens=4, mode="full")
    plain = engine.chat(_ask(DOCS), max_new_tokens=4, mode="full")
    assert torch.equal(none.prompt_logits, plain.prompt_logits)  # the tools left out of the prompt
    with pytest.raises(ValueError, match="not among the tools"):
        engine.chat(_ask(DOCS), tools=[WEATHER], tool_choice={"type": "function", "function": {"name": "x"}})
    with pytest.raises(ValueError, match="'required' needs tools"):
        engine.chat(_ask(DOCS), tool_choice="required")
    with pytest.raises(ValueError, match="tool_choice must be"):
        engine.chat(_ask(DOCS), tools=[WEATHER], tool_choice="sometimes")


@pytest.mark.parametrize("kind", ["nemotron_h", "lfm2", "kimi_linear", "falcon_h1", "jamba", "bailing_moe_linear"])
def test_other_families_serve_chat_with_their_own_files(checkpoint, tmp_path, reference, kind):
    """A checkpoint of another family with a ChatML template and a tokenizer, as a real one ships them: its
    reordered documents hit through ``Engine.chat``, and ``full`` gives transformers' logits on the same ids
    (Ring-linear has no transformers class: its parity is the oracle's, in tests/model)."""

    from hypic_rag.testing.synthetic import add_chat_files

    path = tmp_path / kind
    shutil.copytree(checkpoint(kind), path)
    add_chat_files(path, (TEMPLATES / "chatml.jinja").read_text())
    engine = Engine.from_pretrained(path, min_cached_tokens=1)
    engine.chat(_ask(DOCS), max_new_tokens=1, temperature=0.0)
    again = engine.chat(_ask(DOCS[::-1]), max_new_tokens=1, temperature=0.0)
    cached = [s for s in engine.render(_ask(DOCS[::-1])).segments if s.cache]
    assert again.stats["hit_segments"] == len(cached) >= len(DOCS)
    if kind != "bailing_moe_linear":
        full = engine.chat(_ask(DOCS[::-1]), mode="full", max_new_tokens=1, temperature=0.0)
        ids = engine.render(_ask(DOCS[::-1])).token_ids
        with torch.inference_mode():
            theirs = reference(path)(torch.tensor([ids])).logits[0, -1]
        assert (full.prompt_logits - theirs).abs().max() < 1e-4
