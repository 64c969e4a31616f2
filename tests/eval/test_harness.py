"""hypic-rag eval on a briefly trained tiny checkpoint: the API.md JSON, per mode, on the same ids."""

from __future__ import annotations

import pytest

from hypic_rag import Engine, GenerationOutput
from hypic_rag.cli import main
from hypic_rag.eval.data.longbench import write_longbench_jsonl
from hypic_rag.eval.data.workloads import make
from hypic_rag.eval.harness import evaluate, load_examples, prediction


@pytest.fixture(scope="module")
def trained(tmp_path_factory, train_args):
    from hypic_rag.training.train import run

    out = tmp_path_factory.mktemp("trained")
    run(train_args(out))
    return out


def test_eval_report_follows_the_api(trained):
    engine = Engine.from_pretrained(trained, min_cached_tokens=0)
    report = evaluate(engine, "memory", ["full", "pic", "hypic"], n=3, seed=5, max_new_tokens=4, log=lambda _: None)
    assert report["workload"] == "memory" and report["n"] == 3
    assert set(report["results"]) == {"full", "pic", "hypic"}
    for mode, row in report["results"].items():
        assert 0.0 <= row["score"] <= 100.0 and row["metric"] == "f1"
        assert ("kl" in row) == (mode != "full")
    assert report["results"]["pic"]["kl"] >= 0.0 and 0.0 <= report["results"]["hypic"]["top1"] <= 1.0
    assert report["gap_points"]["hypic"] == report["results"]["full"]["score"] - report["results"]["hypic"]["score"]
    # each example's score (and KL) is kept, and each gap comes with a paired interval that holds it
    per = report["per_example"]
    assert set(per) == {"full", "pic", "hypic"} and "kl" not in per["full"]
    for mode in ("pic", "hypic"):
        assert len(per[mode]["score"]) == len(per[mode]["kl"]) == 3
        assert sum(per[mode]["score"]) / 3 == pytest.approx(report["results"][mode]["score"])
        low, high = report["results"][mode]["gap_interval"]
        assert low <= report["gap_points"][mode] <= high


def test_eval_reports_the_tokens_each_seam_recomputes(trained):
    engine = Engine.from_pretrained(trained, min_cached_tokens=0)
    report = evaluate(
        engine,
        "memory",
        ["full", "hypic"],
        n=2,
        seed=5,
        max_new_tokens=2,
        log=lambda _: None,
        seams=[0, 32, "auto", "blend:4"],
    )
    rows = report["results"]
    assert set(rows) == {"full", "hypic", "hypic@w0", "hypic@w32", "hypic@auto", "hypic@blend:4"}
    # full runs every prompt token; the seams recompute more as they widen, and only auto probes
    assert rows["full"]["recomputed_tokens"] > rows["hypic@w32"]["recomputed_tokens"]
    assert rows["hypic@w32"]["recomputed_tokens"] >= rows["hypic"]["recomputed_tokens"]
    assert rows["hypic"]["recomputed_tokens"] > rows["hypic@w0"]["recomputed_tokens"]
    assert rows["hypic@auto"]["probe_tokens"] > 0 and rows["hypic"]["probe_tokens"] == 0
    # blend's probe runs through the layers up to the first attention layer: that share of its tokens is its
    # cost; auto's reading probe runs the query through every layer, so it costs at least that share
    auto, blend, config = rows["hypic@auto"], rows["hypic@blend:4"], engine.model.config
    share = (config.layer_types.index("full_attention") + 1) / config.num_hidden_layers
    assert blend["probe_cost"] == pytest.approx(blend["probe_tokens"] * share) and blend["probe_cost"] > 0
    assert auto["probe_tokens"] * share <= auto["probe_cost"] <= auto["probe_tokens"]
    assert auto["cost_tokens"] == auto["recomputed_tokens"] + auto["probe_cost"]
    assert rows["hypic"]["cost_tokens"] == rows["hypic"]["recomputed_tokens"]
    # the blend baseline's probe runs every segment token: more than auto's seams
    assert rows["hypic@blend:4"]["probe_tokens"] > auto["probe_tokens"]
    assert rows["full"]["filled_tokens"] == 0 and "kl" in rows["hypic@auto"]


def test_each_example_goes_through_chat_with_its_messages_and_tools(trained, monkeypatch):
    engine = Engine.from_pretrained(trained, min_cached_tokens=0)
    seen, chat = [], engine.chat

    def spy(messages, **kwargs):
        out = chat(messages, **kwargs)
        seen.append((messages, kwargs["tools"], kwargs["mode"], out))
        return out

    monkeypatch.setattr(engine, "chat", spy)
    evaluate(engine, "tool_call", ["full", "hypic"], n=2, seed=1, max_new_tokens=3, log=lambda _: None)
    examples = make("tool_call", 2, 1)
    assert [(m, t, mode) for m, t, mode, _ in seen] == [
        (ex.messages, ex.tools, mode) for ex in examples for mode in ("full", "hypic")
    ]
    # the same prompt in every mode, the one the bundled template makes
    assert seen[0][3].stats["prompt_tokens"] == len(engine.render(examples[0].messages, examples[0].tools).token_ids)


def test_a_framework_prompt_is_scored_as_served(trained, monkeypatch):
    """A chat form as the integrations hand it over (the format's ``prepare_messages``), the completions route's
    flat prompt as that route cuts it, with no chat template."""
    from hypic_rag.chat.formats.bundled import BUNDLED
    from hypic_rag.server.completions import prompt_segments

    engine = Engine.from_pretrained(trained, min_cached_tokens=0)
    chats, flats = [], []
    chat, generate = engine.chat, engine.generate
    monkeypatch.setattr(engine, "chat", lambda messages, **kw: chats.append(messages) or chat(messages, **kw))
    monkeypatch.setattr(engine, "generate", lambda s, q, **kw: flats.append((s, q)) or generate(s, q, **kw))
    evaluate(engine, "framework_qa", ["full"], n=6, seed=2, max_new_tokens=2, log=lambda _: None)
    examples = make("framework_qa", 6, 2)
    assert chats == [BUNDLED.prepare_messages(ex.messages) for ex in examples if "completion" not in ex.meta]
    assert flats == [prompt_segments(ex.meta["completion"]) for ex in examples if "completion" in ex.meta]
    assert chats and flats


def test_a_tool_call_is_scored_as_the_model_wrote_it(trained):
    engine = Engine.from_pretrained(trained)
    ids = engine.encode('{"arguments":{"city":"Oslo"},"name":"get_weather"}')
    call = {"id": "call_0", "name": "get_weather", "arguments": {"city": "Oslo"}}
    out = GenerationOutput("", ids, 0.0, tool_calls=[call])
    assert prediction(engine, out) == '{"arguments":{"city":"Oslo"},"name":"get_weather"}'
    assert prediction(engine, GenerationOutput(" Oslo ", engine.encode(" Oslo "), 0.0)) == "Oslo"


def test_eval_needs_a_chat_template(trained):
    engine = Engine.from_pretrained(trained, chat_template=None)
    with pytest.raises(ValueError, match="chat template"):
        evaluate(engine, "memory", ["full"], n=1, log=lambda _: None)


def test_eval_reads_longbench_files(tmp_path):
    path = tmp_path / "mine.jsonl"
    write_longbench_jsonl(make("single_doc", 4, 0), path)
    name, examples = load_examples(str(path), 2, 0)
    assert name == "mine" and len(examples) == 2
    with pytest.raises(ValueError, match="must be one of"):
        load_examples("nope", 2, 0)


def test_eval_command_errors(trained, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--workload", "nope", "--model", str(trained), "--n", "1"])
    assert "must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--workload", "memory", "--modes", "fast", "--model", str(trained), "--n", "1"])
    assert "modes must come from" in capsys.readouterr().err


def test_eval_command_writes_json(trained, tmp_path):
    import json

    out = tmp_path / "r.json"
    code = main(
        [
            "eval",
            "--workload",
            "tool_call",
            "--modes",
            "full,hypic",
            "--n",
            "2",
            "--model",
            str(trained),
            "--max-new-tokens",
            "3",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["results"]["full"]["metric"] == "tool_call" and "hypic" in report["gap_points"]


def test_eval_command_compares_two_modes(trained, tmp_path, capsys):
    import json

    out = tmp_path / "r.json"
    args = ["eval", "--workload", "memory", "--modes", "full,pic,hypic", "--n", "2", "--model", str(trained)]
    args += ["--max-new-tokens", "2", "--json", str(out)]
    assert main([*args, "--compare", "hypic,pic"]) == 0
    comparison = json.loads(out.read_text())["comparison"]
    assert comparison["first"] == "hypic" and set(comparison["workloads"]) == {"memory"}
    assert "hypic against pic" in capsys.readouterr().out
    out.unlink()
    for bad, message in (
        ("hypic", "two different mode labels"),
        ("hypic, full", "no mode 'full' with a KL"),
        ("hypic,hypic@w4", "no mode 'hypic@w4'"),
    ):
        with pytest.raises(SystemExit):  # before the run: nothing was computed or written
            main([*args, "--compare", bad])
        assert message in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit):
        main([*args[:6], "1", *args[7:], "--compare", "hypic,pic"])
    assert "--n 2 or more" in capsys.readouterr().err


def test_many_workloads_with_a_seam_sweep_and_a_report(trained, tmp_path):
    from hypic_rag.eval.harness import evaluate_many
    from hypic_rag.eval.report import write_report

    engine = Engine.from_pretrained(trained, min_cached_tokens=0)
    report = evaluate_many(
        engine, ["memory", "single_doc"], ["full", "hypic"], n=2, seed=3, max_new_tokens=3, seams=[2], log=print
    )
    assert [r["workload"] for r in report["workloads"]] == ["memory", "single_doc"]
    assert set(report["mean_score"]) == {"full", "hypic", "hypic@w2"}
    for r in report["workloads"]:
        assert {"exact_match", "rouge_l"} <= set(r["results"]["full"])
        assert r["results"]["hypic@w2"]["kl"] >= 0.0
    gaps = [r["gap_points"]["hypic"] for r in report["workloads"]]
    assert report["mean_gap_points"]["hypic"] == sum(gaps) / 2
    md, png, pareto = write_report(report, tmp_path / "rep", "hypic-rag eval ...")
    assert "| memory | f1 |" in md.read_text() and "hypic@w2" in md.read_text()
    assert png.read_bytes()[:8] == pareto.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_swept_seams_read_auto_with_a_budget():
    from hypic_rag.eval.harness import seam_label, seam_options

    assert seam_options("auto:12") == {"seam": "auto", "seam_budget": 12.0} and seam_label("auto:12") == "hypic@auto:12"
    assert seam_options(8) == {"seam": 8} and seam_label(8) == "hypic@w8" and seam_label(0.25) == "hypic@w0.25"
    assert seam_options("blend:8") == {"seam": "blend", "seam_budget": 8.0} and seam_label("blend:8") == "hypic@blend:8"
    for bad in ("auto:x", "blend:x", "wide", -1):
        with pytest.raises(ValueError):
            seam_options(bad)


def test_eval_counts_the_answers_identical_to_full(trained):
    """``same_answer``: an unlimited ``auto`` budget recomputes every segment, so every answer is ``full``'s."""
    engine = Engine.from_pretrained(trained, min_cached_tokens=0)
    report = evaluate(
        engine, "memory", ["full", "pic"], n=3, seed=5, max_new_tokens=4, log=lambda _: None, seams=["auto:inf"]
    )
    rows = report["results"]
    assert rows["hypic@auto:inf"]["same_answer"] == 1.0 and rows["hypic@auto:inf"]["kl"] < 1e-9
    assert "same_answer" in rows["pic"] and "same_answer" not in rows["full"]


def test_a_conversation_asks_its_earlier_turns_first_in_each_mode_and_continues_their_states(trained, monkeypatch):
    engine = Engine.from_pretrained(trained, min_cached_tokens=0)
    asked: list[str] = []
    chat = engine.chat

    def counted(messages, **kwargs):
        asked.append(kwargs["mode"])
        return chat(messages, **kwargs)

    monkeypatch.setattr(engine, "chat", counted)
    report = evaluate(
        engine, "conversation", ["full", "prefix", "hypic"], n=1, seed=2, max_new_tokens=4, log=lambda _: None
    )
    turns = len(make("conversation", 1, 2)[0].meta["turns"])
    assert asked == ["full"] + ["prefix"] * (turns + 1) + ["hypic"] * (turns + 1)
    results = report["results"]
    # the last turn restores the states its earlier turns kept: prefix runs only what is new, and still equals full
    assert results["prefix"]["recomputed_tokens"] < results["full"]["recomputed_tokens"] / 2
    assert results["prefix"]["kl"] < 1e-6
    assert results["hypic"]["recomputed_tokens"] < results["full"]["recomputed_tokens"]
