from __future__ import annotations

import json
import shutil

import pytest

from hypic_rag import Engine
from hypic_rag.generation_config import GenerationDefaults, eos_token_ids, read_generation_defaults


def _write(path, data) -> None:
    (path / "generation_config.json").write_text(data if isinstance(data, str) else json.dumps(data))


def test_defaults_are_read(tmp_path):
    _write(
        tmp_path,
        {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 512, "do_sample": True, "max_length": 9},
    )
    got = read_generation_defaults(tmp_path)
    assert got == GenerationDefaults(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=512, do_sample=True)
    assert got.effective_temperature == 0.6
    assert isinstance(got.temperature, float)


def test_integer_temperature_and_nulls(tmp_path):
    _write(tmp_path, {"temperature": 1, "top_p": None, "eos_token_id": 3})
    assert read_generation_defaults(tmp_path) == GenerationDefaults(temperature=1.0)


def test_do_sample_false_means_greedy(tmp_path):
    _write(tmp_path, {"temperature": 0.7, "do_sample": False})
    got = read_generation_defaults(tmp_path)
    assert got.temperature == 0.7 and got.do_sample is False and got.effective_temperature == 0.0


def test_absent_file_is_all_none(tmp_path):
    got = read_generation_defaults(tmp_path)
    assert got == GenerationDefaults() and got.effective_temperature is None
    assert all(v is None for v in vars(got).values())


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": 2.5}, "top_k"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"max_new_tokens": "64"}, "max_new_tokens"),
        ({"do_sample": "yes"}, "do_sample"),
        ({"do_sample": 1}, "do_sample"),
    ],
)
def test_bad_values_name_file_and_field(tmp_path, data, field):
    _write(tmp_path, data)
    with pytest.raises(ValueError, match=rf"generation_config\.json: {field} must"):
        read_generation_defaults(tmp_path)


@pytest.mark.parametrize("text", ["{not json", "[1, 2]"])
def test_bad_json_names_the_file(tmp_path, text):
    _write(tmp_path, text)
    with pytest.raises(ValueError, match=r"generation_config\.json"):
        read_generation_defaults(tmp_path)
    with pytest.raises(ValueError, match=r"generation_config\.json"):
        eos_token_ids(tmp_path, (1,))


def test_eos_ids_merge_both_files(tmp_path):
    assert eos_token_ids(tmp_path, (7,)) == (7,)  # no generation_config.json: config.json's alone
    _write(tmp_path, {"eos_token_id": [9, 7, 11]})
    assert eos_token_ids(tmp_path, (7,)) == (7, 9, 11)  # config.json's first, no repeats
    _write(tmp_path, {"eos_token_id": 4})
    assert eos_token_ids(tmp_path, (7,)) == (7, 4)
    _write(tmp_path, {"temperature": 0.5})
    assert eos_token_ids(tmp_path, ()) == ()
    _write(tmp_path, {"eos_token_id": ["2"]})
    with pytest.raises(ValueError, match="eos_token_id"):
        eos_token_ids(tmp_path, ())


def test_engine_carries_the_checkpoint_defaults(checkpoint, tmp_path):
    path = tmp_path / "ck"
    shutil.copytree(checkpoint("qwen3_5_text"), path)
    _write(path, {"temperature": 0.6, "top_k": 20, "do_sample": True, "eos_token_id": [1, 5]})
    engine = Engine.from_pretrained(path)
    assert engine.generation_defaults == GenerationDefaults(temperature=0.6, top_k=20, do_sample=True)
    assert 5 in engine.eos_token_ids
    override = GenerationDefaults(top_p=0.5)
    assert Engine.from_pretrained(path, generation_defaults=override).generation_defaults == override
    assert Engine(engine.model).generation_defaults == GenerationDefaults()
