from __future__ import annotations

from hypic_rag.eval.bench.profile import run
from hypic_rag.testing.synthetic import TINY


def test_profile_splits_the_ttft_into_parts_that_add_up():
    report = run(segments=3, segment_tokens=24, query_tokens=5, layers=4, repeats=1, shapes=TINY, log=lambda _: None)
    parts = report["parts_s"]
    assert abs(sum(parts.values()) - report["ttft_s"]) < 1e-9
    assert report["stats"]["hit_segments"] == 3 and report["forwards"] >= 1
    assert sum(report["tokens_per_forward"]) == report["stats"]["recomputed_tokens"]
    assert set(report["decode_tokens_per_s"]) == {"full", "hypic"}


def test_the_lm_head_is_its_own_part_not_the_rest(monkeypatch):
    """The head runs after ``hidden_states``: a head that takes 1,000 s longer on the clock every part reads
    shows up as the head's time, and neither shrinks the forward nor swells the rest. The clock is skewed
    inside the head, not slept on, so nothing here depends on how fast the machine runs."""
    import time

    from hypic_rag.eval.bench import profile

    real, skew = time.perf_counter, [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: real() + skew[0])
    made = profile.random_engine

    def slow_head(*args, **kwargs):
        engine, reference, vocab = made(*args, **kwargs)
        engine.model.lm_head.register_forward_hook(lambda *_: skew.__setitem__(0, skew[0] + 1000.0))
        return engine, reference, vocab

    monkeypatch.setattr(profile, "random_engine", slow_head)
    report = profile.run(segments=3, segment_tokens=24, query_tokens=5, layers=4, repeats=1, shapes=TINY,
                         log=lambda _: None, decode=0)  # fmt: skip
    parts = report["parts_s"]
    assert parts["LM head"] >= 1000
    assert 0 < parts["last forward"] < 1000 and 0 <= parts["lookup, compose, KV, Python"] < 1000
