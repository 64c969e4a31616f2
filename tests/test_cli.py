from __future__ import annotations

import json

import pytest

from hypic_rag.cli import NAMED_BENCHES, main


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "demo" in out and "bench" in out


def test_bad_bench_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--lengths", "4k"])
    assert "comma-separated token counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--layers", "0"])
    for other in (["--slo"], ["--server"], ["--runtime"], ["--sweep", "flood"]):  # --modes is refused, not ignored
        with pytest.raises(SystemExit):
            main(["bench", *other, "--modes", "full,hypic"])
        assert "--modes applies to the TTFT benchmarks" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--bundled", "--modes", "full,transformers"])  # honoured: checked before the model loads
    assert "modes come from full, prefix, pic, hypic" in capsys.readouterr().err


def test_cache_stats_and_clear(tmp_path, capsys):
    import json

    from hypic_rag.cache import DiskCacheTier

    tier = DiskCacheTier(tmp_path)
    tier.set("a", b"x" * 100)
    tier.set("b", b"y" * 50_000)
    tier.close()
    assert main(["cache", "stats", "--cache-dir", str(tmp_path)]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["entries"] == 2 and stats["bytes"] >= 50_100
    assert main(["cache", "clear", "--cache-dir", str(tmp_path)]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert DiskCacheTier(tmp_path).stats()["entries"] == 0


def test_cache_command_needs_an_existing_directory(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["cache", "stats", "--cache-dir", str(tmp_path / "missing")])
    assert "no segment cache at" in capsys.readouterr().err


def test_bad_sweep_and_eval_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--sweep", "speed"])
    assert "invalid choice" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "--sweep", "hits", "--values", "0.5,x"])
    assert "comma-separated numbers" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--workload", "memory", "--seams", "8,wide"])
    assert 'a seam is a token count, a fraction, "auto" or "blend"' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--workload", "memory", "--seam", "-2"])
    assert "a seam must be >= 0" in capsys.readouterr().err


def test_an_unknown_benchmark_is_refused_with_the_names(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "bogus"])
    err = capsys.readouterr().err
    assert err.startswith("usage: hypic-rag bench") and "invalid choice: 'bogus'" in err
    assert all(repr(name) in err for name in NAMED_BENCHES)


def test_a_bad_workload_or_mode_is_the_eval_commands_error_before_anything_loads(capsys, monkeypatch):
    import hypic_rag.engine as engine_module

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded for a run that cannot go")

    monkeypatch.setattr(engine_module.Engine, "from_pretrained", no_loading)
    for argv, problem in (
        (["eval", "--workload", "single_doc,bogus"], "not 'bogus'"),
        (["eval", "--workload", "single_doc", "--modes", "full,fast"], "modes must come from full, prefix, pic, hypic"),
    ):
        with pytest.raises(SystemExit) as exited:
            main(argv)
        out, err = capsys.readouterr()
        assert exited.value.code == 2 and out == "", out  # no line of a run that never started
        assert err.startswith("usage: hypic-rag eval") and problem in err


def test_command_help_gives_each_options_default(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for line in ("--n N examples of each workload (default: 100)", "(default: full,hypic)", "--seed SEED draws"):
        assert line in out


def test_version_imports_neither_torch_nor_the_engine():
    import subprocess
    import sys

    code = "import sys; from hypic_rag.cli import main\ntry: main(['--version'])\nexcept SystemExit: pass\n"
    code += "print(sorted(m for m in ('torch', 'hypic_rag.engine', 'fastapi') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "[]", out


def test_bad_serve_arguments_are_refused(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--max-queue", "0"])
    assert "--max-queue and --max-active must be >= 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--cache-url", "memcached://127.0.0.1:1"])  # refused before anything loads or listens
    assert "cache_url must be redis://" in capsys.readouterr().err


def test_serve_replicas_checks_its_arguments_then_runs_the_fleet(capsys, monkeypatch):
    for argv, message in (
        (["--replicas", "0"], "--replicas must be >= 1"),
        (["--replicas", "2", "--min-replicas", "3", "--autoscale"], "--min-replicas in 1..--replicas"),
        (["--replicas", "2", "--prefill-workers", "2"], "--prefill-workers and --replicas do not mix"),
        (["--replicas", "2", "--routing", "nearest"], "invalid choice: 'nearest'"),
        (["--replicas", "2", "--routing-epsilon", "0"], "epsilon must be a number > 0"),
        (["--replicas", "2", "--routing-burst", "nan"], "burst must be a number > 0"),
    ):
        with pytest.raises(SystemExit):
            main(["serve", *argv])
        assert message in capsys.readouterr().err, argv
    import hypic_rag.fleet.launch as launch

    seen: list[tuple] = []
    monkeypatch.setattr(launch, "serve_fleet", lambda model, **kwargs: seen.append((model, kwargs)))
    monkeypatch.setenv("HYPIC_API_KEY", "sk-env")
    assert main(["serve", "--replicas", "3", "--port", "8199", "--max-active", "8", "--autoscale"]) == 0
    ((model, kwargs),) = seen
    assert model is None and kwargs["replicas"] == 3 and kwargs["port"] == 8199 and kwargs["api_key"] == "sk-env"
    assert kwargs["policy"] == "affinity" and kwargs["max_active"] == 8 and kwargs["pack_weights"] is True
    assert (kwargs["epsilon"], kwargs["burst"]) == (0.5, 1.0)
    assert kwargs["autoscaling"] == {"min_replicas": 1, "max_replicas": 3, "target_ongoing_requests": 4}
    assert kwargs["keep_states"] is True  # a conversation's next turn restores the state its last turn kept
    assert main(["serve", "--replicas", "2", "--no-keep-states"]) == 0
    assert seen[-1][1]["keep_states"] is False


def test_a_benchmark_runs_by_name_with_its_own_flags(capsys, tmp_path):
    out = tmp_path / "sim.json"
    argv = ["bench", "fleet-sim", "--replicas", "2", "--documents", "160", "--requests", "400", "--warmup", "100"]
    argv += ["--closed-replicas", "2"]
    assert main([*argv, "--tier-share", "0.1", "--json", str(out)]) == 0
    assert "clustered      2 replicas: oracle" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"independent/2", "clustered/2", "fixed_order/2"}
    assert set(report["closed"]) == {"independent/2", "clustered/2", "one_topic/2"}
    with pytest.raises(SystemExit):
        main(["bench", "fleet", "--replicas", "0"])
    assert "--replicas, --clients and --layers must be >= 1" in capsys.readouterr().err


def test_version_is_the_packages(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0 and capsys.readouterr().out == f"hypic-rag {version('hypic-rag')}\n"


def test_demo_runs_with_the_seed_it_is_given(monkeypatch):
    import hypic_rag.integrations.demo as demo

    seen: list[dict] = []
    monkeypatch.setattr(demo, "run", lambda **kwargs: seen.append(kwargs) or True)
    assert main(["demo", "--seed", "5"]) == 0 and main(["demo"]) == 0 and main(["demo", "--facts"]) == 0
    assert seen == [
        {"seed": 5, "profiles": True, "k": 3},
        {"seed": 0, "profiles": True, "k": 3},
        {"seed": 0, "profiles": False, "k": 4},
    ]


def test_swept_seams_take_auto_and_blend_with_a_budget():
    from hypic_rag.cli import _seams

    assert _seams("8,0.25,auto,auto:11,blend,blend:8") == [8, 0.25, "auto", "auto:11", "blend", "blend:8"]


def test_a_single_seam_with_a_budget_is_refused_before_anything_loads(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--workload", "single_doc", "--seam", "auto:11"])
    assert "--seam takes 'auto' without a budget; compare budgets with --seams auto:11" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(NAMED_BENCHES))
def test_every_benchmark_runs_by_name_and_describes_its_flags(name, capsys):
    with pytest.raises(SystemExit) as done:
        main(["bench", name, "--help"])
    assert done.value.code == 0
    assert "usage:" in capsys.readouterr().out


def test_every_benchmark_module_is_registered_and_writes_through_the_one_writer():
    from pathlib import Path

    bench = Path(__file__).resolve().parents[1] / "eval" / "bench"
    with_main = {p.stem for p in bench.glob("*.py") if "\ndef main(" in p.read_text()}
    assert with_main == set(NAMED_BENCHES.values())
    for stem in with_main:  # no benchmark writes its JSON by hand
        text = (bench / f"{stem}.py").read_text()
        assert "write_report(" in text and "args.json.write_text" not in text, stem


def test_a_report_opens_with_the_run_header(tmp_path, capsys):
    import torch

    from hypic_rag.eval.bench.common import write_report

    out = tmp_path / "r.json"
    write_report({"ratio": 1.5}, out, "ttft")
    report = json.loads(out.read_text())
    assert list(report) == ["run", "ratio"] and report["ratio"] == 1.5
    run = report["run"]
    assert (
        run["benchmark"] == "ttft" and run["threads"] == torch.get_num_threads() and run["torch"] == torch.__version__
    )
    assert set(run) == {"benchmark", "hypic_rag", "revision", "python", "torch", "device", "threads", "argv"}
    assert f"wrote {out}" in capsys.readouterr().out
    write_report({"x": 1}, None, "ttft")  # no path: nothing written


def test_a_missing_extra_is_named_and_a_missing_module_of_ours_is_not_blamed_on_one(capsys, monkeypatch):
    """``serve --replicas`` without Ray asks for the extras; with hypic-rag's own fleet module missing (a broken
    install), it says so instead."""
    import sys

    monkeypatch.delitem(sys.modules, "hypic_rag.fleet.deployment", raising=False)
    monkeypatch.delitem(sys.modules, "hypic_rag.fleet.launch", raising=False)
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(SystemExit):
        main(["serve", "--replicas", "1"])
    assert "the fleet needs its extras: pip install 'hypic-rag[server,ray]'" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "hypic_rag.fleet.deployment", None)
    with pytest.raises(ImportError) as missing:
        main(["serve", "--replicas", "1"])
    assert missing.value.name == "hypic_rag.fleet.deployment"


def test_a_busy_port_is_refused_before_the_model_loads(capsys, monkeypatch):
    """``serve`` and ``serve --replicas`` refuse a port another process holds at once, not after loading."""
    import socket

    import hypic_rag.engine as engine_module
    import hypic_rag.fleet.launch as launch

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded for a port that cannot be had")

    monkeypatch.setattr(engine_module.Engine, "from_pretrained", no_loading)
    monkeypatch.setattr(launch, "running_fleet", no_loading)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = str(held.getsockname()[1])
        for argv in (["serve", "--port", port], ["serve", "--port", port, "--replicas", "1"]):
            with pytest.raises(SystemExit):
                main(argv)
            assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err, argv


def test_serve_names_a_cache_tier_it_cannot_reach_as_it_starts(capsys, monkeypatch):
    import hypic_rag.fleet.launch as launch
    from hypic_rag.testing.server import free_port

    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    monkeypatch.setattr(launch, "running_fleet", lambda *a, **k: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert main(["serve", "--replicas", "1", "--port", str(free_port()), "--cache-url", url]) == 0
    err = capsys.readouterr().err
    shown = url.replace(":hunter2@", ":***@")
    assert f"warning: the shared cache tier {shown} cannot be reached" in err and "hunter2" not in err
    assert f"warning: the shared cache tier {shown} is not sealed" in err
    secret = ["--cache-secret", "0123456789abcdef0123"]
    assert main(["serve", "--replicas", "1", "--port", str(free_port()), "--cache-url", url, *secret]) == 0
    assert "is not sealed" not in capsys.readouterr().err
    import uvicorn

    served: list = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(sockets))
    assert main(["serve", "--port", str(free_port()), "--cache-url", url]) == 0
    err = capsys.readouterr().err
    assert f"warning: the shared cache tier {shown} cannot be reached" in err and "hunter2" not in err
    assert len(served) == 1 and served[0][0].getsockname()[0] == "127.0.0.1"  # the socket bound before loading
    served[0][0].close()
