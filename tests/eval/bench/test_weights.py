"""``hypic-rag bench weights``: decode steps from 8-bit or bfloat16 weights against float32, teacher-forced on the same
tokens."""

from __future__ import annotations

import pytest

from hypic_rag import Engine
from hypic_rag.eval.bench.weights import decode_drift, run


def test_the_drift_is_measured_on_every_step_and_is_small_on_the_bundled_model():
    report = run(["tool_call"], n=2, seed=3, max_new_tokens=12, log=lambda _: None)
    row = report["results"][0]
    assert row["steps"] > 0 and 0 <= row["kl_mean"] <= row["kl_max"] < 0.05
    assert 0.5 <= row["top1_agreement"] <= 1.0


def test_an_engine_against_itself_drifts_by_nothing_and_bad_arguments_are_refused():
    engine = Engine.from_pretrained()
    prompt = engine.prepare_chat([{"role": "user", "content": "Where does Bo Ek live?"}]).prompt.ids
    steps = decode_drift(engine, engine, prompt, [5, 6, 7, 8])
    assert len(steps) == 3 and all(kl == 0.0 and agree for kl, agree in steps)
    with pytest.raises(ValueError, match="workloads"):
        run(["bogus"], n=1)


def test_bfloat16_weights_are_compared_where_the_cpu_has_them_and_refused_where_it_does_not(monkeypatch):
    from hypic_rag import engine as engine_module

    with pytest.raises(ValueError, match="int8 or bfloat16"):
        run(["tool_call"], n=1, weights="float32")
    monkeypatch.setattr(engine_module, "native_bf16", lambda: False)
    with pytest.warns(UserWarning, match="native bfloat16"), pytest.raises(ValueError, match="nothing to compare"):
        run(["tool_call"], n=1, weights="bfloat16")
    monkeypatch.setattr(engine_module, "native_bf16", lambda: True)
    report = run(["tool_call"], n=2, seed=3, max_new_tokens=12, log=lambda _: None, weights="bfloat16")
    row = report["results"][0]
    assert report["weights"] == "bfloat16" and row["steps"] > 0 and 0 <= row["kl_mean"] <= row["kl_max"] < 0.05
