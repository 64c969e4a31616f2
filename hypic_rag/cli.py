"""The ``hypic-rag`` command line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from importlib.metadata import version
from pathlib import Path
from typing import Any, NoReturn

from . import defaults as limits


def _csv(cast: type, minimum: float, what: str):
    """An argparse type: comma-separated ``cast`` values, each at least ``minimum``."""

    def parse(text: str) -> list:
        try:
            values = [cast(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text!r}") from None
        if not values or min(values) < minimum:
            raise argparse.ArgumentTypeError(f"{what} must be >= {minimum}")
        return values

    return parse


_lengths = _csv(int, 1, "token counts")


def _seam(text: str) -> int | float | str:
    """A seam as ``--seam`` takes it: ``auto``, ``blend``, a token count (>= 1) or a fraction (< 1); ``--seams``
    also takes ``auto:B`` and ``blend:B`` (under a budget of B tokens per boundary)."""
    if text.split(":")[0] in ("auto", "blend"):
        return text
    try:
        value = float(text)
    except ValueError:
        problem = f'a seam is a token count, a fraction, "auto" or "blend", got {text!r}'
        raise argparse.ArgumentTypeError(problem) from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"a seam must be >= 0, got {text!r}")
    return int(value) if value >= 1 or value == 0 else value


def _one_seam(text: str) -> int | float | str:
    """``--seam``: what ``_seam`` takes but a budget, which is a request's (``seam_budget``), not an engine's."""
    if ":" in text:
        name = text.split(":")[0]
        raise argparse.ArgumentTypeError(f"--seam takes {name!r} without a budget; compare budgets with --seams {text}")
    return _seam(text)


def _seams(text: str) -> list[int | float | str]:
    """Comma-separated seams (``0,4,8,16,32,auto``)."""
    values = [_seam(x) for x in text.split(",") if x]
    if not values:
        raise argparse.ArgumentTypeError("expected comma-separated seams")
    return values


_numbers = _csv(float, 0, "numbers")


def _write_json(data: dict, path: Path | None, bench: str | None = None) -> None:
    """A benchmark's report under its header (``write_report``), or an evaluation's as it is."""
    if bench is not None:
        from hypic_rag.eval.bench.common import write_report

        write_report(data, path, bench)
    elif path is not None:
        path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"wrote {path}")


# Every benchmark, run by name with its own flags (``hypic-rag bench NAME --help``; ``python -m
# hypic_rag.eval.bench.MODULE`` is the same): name -> its module under hypic_rag.eval.bench. Each writes its JSON
# through ``eval.bench.common.write_report``, under one header.
BENCH_MODULES = (
    "batching", "capture", "deviation", "engine_thread", "entry_bytes", "families", "fleet", "fleet_sim", "flood",
    "gpu", "grammar", "kernels", "measure", "peer", "profile", "server", "slo", "streams", "template_ids", "tiers",
    "turns", "workers", "open_names", "weights",
)  # fmt: skip
NAMED_BENCHES = {module.replace("_", "-"): module for module in BENCH_MODULES}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] in NAMED_BENCHES:
        import importlib

        module = importlib.import_module(f"hypic_rag.eval.bench.{NAMED_BENCHES[argv[1]]}")
        return int(module.main(argv[2:]) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    # a command's own errors print its own usage, not the top level's
    return COMMANDS[args.command](args.command_parser, args, argv)


class _Help(argparse.HelpFormatter):
    """An option's default after its help, where the help does not already say it (``--n``, ``--seed``: what a run
    does when they are left out)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if "default" in text or not action.option_strings or action.default in (None, False, [], argparse.SUPPRESS):
            return text
        return text + " (default: %(default)s)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hypic-rag", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version('hypic-rag')}")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_demo, _add_bench, _add_eval, _add_serve, _add_cache):
        add(sub)
    for command in sub.choices.values():
        command.set_defaults(command_parser=command)
        command.formatter_class = _Help
    return parser


def _add_demo(sub: Any) -> None:
    """``hypic-rag demo``: the main job on the bundled model."""
    demo = sub.add_parser("demo", help="the main job on the bundled default model, offline")
    demo.add_argument("--seed", type=int, default=0, help="the corpus and the questions (printed, to repeat a run)")
    demo.add_argument(
        "--facts", action="store_true", help="one fact per document instead of one profile per person (k=4)"
    )


def _add_bench(sub: Any) -> None:
    """``hypic-rag bench``: TTFT of the modes, and the benchmarks with their own flags."""
    bench = sub.add_parser(
        "bench",
        help="TTFT of each mode and of transformers on one checkpoint, side by side "
        f"(or a benchmark by name, with its own flags: {', '.join(NAMED_BENCHES)})",
        description="Without --runtime: TTFT of the modes on a warm, reordered prompt (the standard case). "
        "With --runtime: our plain prefill against transformers' forward at --lengths.",
    )
    # Only for its help and its error: a benchmark named here runs before this parser (``main``).
    bench.add_argument(
        "name",
        nargs="?",
        choices=list(NAMED_BENCHES),
        metavar="NAME",
        help=f"a benchmark with its own flags (hypic-rag bench NAME --help): {', '.join(NAMED_BENCHES)}",
    )
    bench.add_argument("--runtime", action="store_true", help="compare the runtime's prefill with transformers")
    bench.add_argument(
        "--slo", action="store_true", help="max QPS under a P90 TTFT SLO (Zipf documents, Poisson arrivals)"
    )
    bench.add_argument(
        "--server",
        action="store_true",
        help="max QPS under a P90 TTFT SLO over HTTP on a live `hypic-rag serve`, beside the simulator's prediction",
    )
    bench.add_argument(
        "--bundled",
        action="store_true",
        help="TTFT of full, prefix and hypic on the bundled model with its defaults: reordered one-fact "
        "and few-sentence documents (--repeats rounds, default 20)",
    )
    bench.add_argument(
        "--modes",
        default=None,
        help="comma-separated, full among them (default: full,prefix,hypic,transformers; with --bundled: "
        "full,prefix,hypic); for the TTFT benchmarks only",
    )
    bench.add_argument("--segments", type=int, default=8, help="documents in the TTFT prompt")
    bench.add_argument("--segment-tokens", type=int, default=1024, help="tokens of each document")
    bench.add_argument("--query-tokens", type=int, default=64, help="tokens of the question after them")
    bench.add_argument("--lengths", type=_lengths, default=[4096, 16384], help="--runtime prompt lengths")
    bench.add_argument(
        "--layers", type=int, default=None, help="decoder layers of the benchmark model (default: 2 with --slo, else 4)"
    )
    bench.add_argument(
        "--repeats", type=int, default=None, help="runs per case, the best kept (default: 3 with --runtime, else 2)"
    )
    bench.add_argument(
        "--sweep",
        choices=["length", "segments", "hits", "seam", "cold", "memory", "flood"],
        help="TTFT across one dimension; flood: pool hit ratio and TTFT of LRU against the value policy under one-off "
        "documents (eval/bench/flood.py)",
    )
    bench.add_argument("--values", type=_numbers, default=None, help="the swept values (default: the sweep's own)")
    bench.add_argument(
        "--total-tokens", type=int, default=8192, help="context tokens of the segments, hits, seam and cold sweeps"
    )
    bench.add_argument("--plot", type=Path, default=None, help="with --sweep: write a PNG plot here")
    bench.add_argument("--json", type=Path, default=None, help="write the results here")


def _add_eval(sub: Any) -> None:
    """``hypic-rag eval``: a workload scored in several modes."""
    ev = sub.add_parser("eval", help="score a workload in several modes, with fidelity against full")
    ev.add_argument(
        "--workload",
        required=True,
        help="single_doc, multi_hop, aggregate, tool_call, memory, FILE.jsonl, a comma-separated list, or all",
    )
    ev.add_argument("--modes", default="full,hypic", help="comma-separated, from full, prefix, pic, hypic")
    ev.add_argument("--n", type=int, default=100, help="examples of each workload")
    ev.add_argument("--seed", type=int, default=0, help="draws the examples (the same seed, the same examples)")
    ev.add_argument(
        "--model", default=None, help="checkpoint directory or hub id, as serve takes (default: the bundled model)"
    )
    ev.add_argument("--max-new-tokens", type=int, default=48, help="the longest answer")
    ev.add_argument(
        "--seam", type=_one_seam, default=None, help='seam tokens (>= 1), fraction (< 1), "auto" or "blend"'
    )
    ev.add_argument("--min-cached-tokens", type=int, default=None, help="shorter segments skip the cache")
    ev.add_argument("--entry-dtype", default=None, help="cache entries kept in float32, bfloat16 or float16")
    ev.add_argument("--weights", choices=limits.WEIGHTS, default="float32", help="what decode steps read (as serve)")
    ev.add_argument(
        "--seams",
        type=_seams,
        default=[],
        help="also run hypic at each of these seams (e.g. 0,4,8,16,32,auto,blend; auto:B, blend:B: a budget of B"
        " tokens per boundary)",
    )
    ev.add_argument("--report", type=Path, default=None, help="write report.md and PNG plots in this folder")
    ev.add_argument("--json", type=Path, default=None, help="write the results here")
    ev.add_argument(
        "--compare",
        default=None,
        metavar="A,B",
        help="two mode labels (e.g. hypic@auto:10,hypic@w16): their gap and KL difference with paired bootstrap"
        " intervals, printed and written to the JSON",
    )


def _add_serve(sub: Any) -> None:
    """``hypic-rag serve``: the OpenAI API on one engine, or on a fleet."""
    srv = sub.add_parser(
        "serve",
        help="the OpenAI chat-completions API on the engine (needs the server extra)",
        description="POST /v1/chat/completions and /v1/completions, GET /v1/models, /health and /metrics (Prometheus).",
    )
    srv.add_argument("--model", default=None, help="checkpoint directory or hub id (default: the bundled model)")
    srv.add_argument("--served-model-name", default=None, help="the name clients ask for (default: --model)")
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000)
    srv.add_argument("--cache-dir", default=None, help="add a persistent segment tier here")
    srv.add_argument("--cache-url", default=None, help="a shared remote segment tier")
    srv.add_argument(
        "--cache-secret",
        default=None,
        help="seals the disk and shared tiers' entries, so that who can write them cannot change answers "
        "(default: $HYPIC_CACHE_SECRET, else none; 16 bytes or more)",
    )
    srv.add_argument("--mode", default="hypic", help="for requests that do not set hypic.mode")
    srv.add_argument("--max-queue", type=int, default=limits.MAX_QUEUE, help="requests that may wait; past that, 429")
    srv.add_argument(
        "--max-active", type=int, default=limits.MAX_ACTIVE, help="requests decoded together, in one forward a step"
    )
    srv.add_argument(
        "--queue-timeout",
        type=float,
        default=limits.QUEUE_TIMEOUT_S,
        help="seconds a request may wait for the engine; past that, 429",
    )
    srv.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=limits.MAX_NUM_BATCHED_TOKENS,
        help="a step's token budget: a decode token per running request plus the prompts admitted",
    )
    srv.add_argument("--prefill-workers", type=int, default=0, help="Ray actors that prefill cold segments")
    srv.add_argument("--dtype", default="float32")
    srv.add_argument(
        "--entry-dtype", default="float32", help="what cache entries are kept in: float32, bfloat16 or float16"
    )
    srv.add_argument("--device", default="cpu")
    srv.add_argument(
        "--weights",
        choices=limits.WEIGHTS,
        default="float32",
        help="what decode steps read: int8, 8-bit copies of the projections (a quarter of the bytes), or bfloat16 "
        "(half, on a CPU with native bfloat16 products; float32 elsewhere); prompts still run in float32",
    )
    srv.add_argument(
        "--no-pack-head",
        dest="pack_head",
        action="store_false",
        help="keep no packed copy of the LM head (saves its size in memory; batched decode on CPU is slower)",
    )
    srv.add_argument(
        "--no-pack-weights",
        dest="pack_weights",
        action="store_false",
        help="keep no packed copy of the decoder's projections (saves their size in memory; CPU decode is slower)",
    )
    srv.add_argument("--log-level", default="info")
    srv.add_argument(
        "--api-key", default=None, help="the Bearer token /v1 routes ask for (default: $HYPIC_API_KEY, else none)"
    )
    srv.add_argument(
        "--allowed-origins",
        type=lambda s: [o for o in s.split(",") if o],
        default=[],
        help="CORS origins, comma-separated ('*': any)",
    )
    srv.add_argument(
        "--fidelity-budget",
        type=float,
        default=None,
        help="deviation estimate past which a request widens its seams or runs exactly (default: no guard)",
    )
    srv.add_argument(
        "--no-keep-states",
        action="store_true",
        help="keep no composed request states (a conversation's next turn then composes every earlier turn again)",
    )
    srv.add_argument(
        "--shadow-rate", type=float, default=0.0, help="share of requests also run in full when idle, KL exported"
    )
    fleet = srv.add_argument_group("fleet", "N engine replicas on Ray Serve behind one ingress (needs the ray extra)")
    fleet.add_argument(
        "--replicas", type=int, default=None, help="run a fleet of this many replicas (the most, with --autoscale)"
    )
    fleet.add_argument(
        "--autoscale", action="store_true", help="let Ray Serve scale between --min-replicas and --replicas"
    )
    fleet.add_argument("--min-replicas", type=int, default=1)
    fleet.add_argument(
        "--target-ongoing-requests",
        type=float,
        default=None,
        help="requests in flight per replica Ray Serve scales toward (default: half of --max-active)",
    )
    fleet.add_argument(
        "--routing",
        choices=["affinity", "round_robin", "random"],
        default="affinity",
        help="affinity: to the replica holding most of a request's segments, within a bounded load",
    )
    fleet.add_argument(
        "--routing-epsilon",
        type=float,
        default=0.5,
        help="the load bound's slack: over a replica's fair share of recent requests, and then over the mean in flight",
    )
    fleet.add_argument(
        "--routing-burst",
        type=float,
        default=1.0,
        help="the slack over the mean in flight of a replica within its share (--routing-epsilon: every replica's)",
    )
    fleet.add_argument("--threads-per-replica", type=int, default=None, help="default: the cores / --replicas")


def _add_cache(sub: Any) -> None:
    """``hypic-rag cache``: a persistent segment cache inspected or emptied."""
    cache = sub.add_parser("cache", help="inspect or empty a persistent segment cache")
    cache.add_argument("action", choices=["stats", "clear"])
    cache.add_argument("--cache-dir", type=Path, default=None, help="default: $HYPIC_CACHE_DIR or ~/.cache/hypic-rag")


def _run_demo(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    """The demo's exit status: 0 when every answer is right."""
    from hypic_rag.integrations.demo import run

    return 0 if run(seed=args.seed, profiles=not args.facts, k=4 if args.facts else 3) else 1


def _run_bench(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    """One benchmark by its flags, its report written as JSON."""
    if (args.layers is not None and args.layers < 1) or (args.repeats is not None and args.repeats < 1):
        parser.error("--layers and --repeats must be >= 1")
    layers = args.layers or (2 if args.slo or args.server else 4)
    modes = args.modes.split(",") if args.modes is not None else None
    if modes is not None and (args.server or args.slo or args.runtime or args.sweep == "flood"):
        parser.error("--modes applies to the TTFT benchmarks (the default, --bundled and --sweep) only")
    modes = modes or ["full", "prefix", "hypic", "transformers"]
    if args.server:
        from hypic_rag.eval.bench.server import run as run_server

        _write_json(run_server(layers=layers, repeats=args.repeats or 3), args.json, "server")
        return 0
    if args.bundled:
        from hypic_rag.eval.bench.bundled import run as run_bundled

        try:
            chosen = {"modes": args.modes.split(",")} if args.modes is not None else {}
            report = run_bundled(rounds=args.repeats or 20, **chosen)
        except ValueError as exc:
            parser.error(str(exc))
        _write_json(report, args.json, "bundled")
        return 0
    if args.slo:
        from hypic_rag.eval.bench.slo import run as run_slo

        _write_json(run_slo(layers=layers), args.json, "slo")
        return 0
    if args.sweep == "flood":
        from hypic_rag.eval.bench import flood

        report = flood.run(layers=layers)
        _write_json(report, args.json, "flood")
        if args.plot is not None:
            print(f"wrote {flood.plot(report, args.plot)}")
        return 0
    if args.sweep:
        from hypic_rag.eval.bench.sweeps import plot, sweep

        try:
            report = sweep(
                args.sweep,
                args.values,
                modes,
                args.total_tokens,
                args.query_tokens,
                layers,
                args.repeats or 1,
            )
        except ValueError as exc:
            parser.error(str(exc))
        _write_json(report, args.json, f"sweep-{args.sweep}")
        if args.plot is not None:
            print(f"wrote {plot(report, args.plot)}")
        return 0
    if args.runtime:
        from hypic_rag.eval.bench.runtime import run as run_runtime

        _write_json(run_runtime(args.lengths, layers, args.repeats or 3), args.json, "runtime")
        return 0
    from hypic_rag.eval.bench.ttft import run as run_ttft

    try:
        report = run_ttft(
            args.segments,
            args.segment_tokens,
            args.query_tokens,
            modes,
            args.repeats or 2,
            layers,
        )
    except ValueError as exc:
        parser.error(str(exc))
    _write_json(report, args.json, "ttft")
    return 0


def _run_eval(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    """The workloads scored, compared and written."""
    from hypic_rag import Engine
    from hypic_rag.eval.data.workloads import WORKLOADS
    from hypic_rag.eval.harness import check_workload, evaluate, evaluate_many, mode_labels
    from hypic_rag.eval.intervals import check_pair, compare, format_comparison
    from hypic_rag.eval.report import write_report

    if args.n < 1:
        parser.error("--n must be >= 1")
    modes = args.modes.split(",")
    pair = [label.strip() for label in args.compare.split(",")] if args.compare is not None else None
    try:
        if pair is not None:  # checked before the run, so a typo costs nothing
            check_pair(pair, mode_labels(modes, args.seams))
            if args.n < 2:
                raise ValueError("--compare needs --n 2 or more: one example has no spread")
        options = {}
        if args.seam is not None:
            options["seam"] = args.seam
        if args.min_cached_tokens is not None:
            options["min_cached_tokens"] = args.min_cached_tokens
        if args.entry_dtype is not None:
            options["entry_dtype"] = args.entry_dtype
        options["weights"] = args.weights
        workloads = list(WORKLOADS) if args.workload == "all" else args.workload.split(",")
        for workload in workloads:  # a typo is refused before the model loads or anything prints
            check_workload(workload)
        mode_labels(modes, args.seams)
        engine = Engine.from_pretrained(args.model, **options)
        if len(workloads) == 1:
            print(f"{args.workload}: n={args.n}, seed={args.seed}, modes {args.modes}")
            report = evaluate(engine, workloads[0], modes, args.n, args.seed, args.max_new_tokens, seams=args.seams)
        else:
            report = evaluate_many(engine, workloads, modes, args.n, args.seed, args.max_new_tokens, seams=args.seams)
    except ValueError as exc:
        parser.error(str(exc))
    failed = None
    if pair is not None:
        try:
            report["comparison"] = compare(report, *pair)
            print("\n".join(format_comparison(report["comparison"])))
        except ValueError as exc:  # e.g. a workload file with a single example
            failed = str(exc)
    _write_json(report, args.json)  # the run is kept whatever the comparison says
    if failed is not None:
        parser.error(failed)
    if args.report is not None:
        command = "hypic-rag " + " ".join(argv)
        for path in write_report(report, args.report, command):
            print(f"wrote {path}")
    return 0


def _run_serve(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    """The server, until interrupted."""
    if min(args.max_queue, args.max_active) < 1 or not 0 < args.port < 65536:
        parser.error("--max-queue and --max-active must be >= 1, --port in 1..65535")
    if args.max_num_batched_tokens < args.max_active:
        parser.error("--max-num-batched-tokens must be at least --max-active")
    try:  # a bad setting, on one process or a fleet, is a usage error before anything starts
        if args.replicas is not None:
            return _serve_fleet(parser, args)
        _serve_one(parser, args)
    except ValueError as exc:
        parser.error(str(exc))
    return 0


def _missing_extra(parser: argparse.ArgumentParser, exc: ImportError, advice: str) -> NoReturn:
    """An extra's package is missing: say which extra to install. A module of hypic-rag itself missing is a broken
    install, which installing an extra would not mend, so it is raised as it is."""
    if (exc.name or "").split(".")[0] == "hypic_rag":
        raise exc
    parser.error(f"{advice} ({exc})")


def _serve_one(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``serve``: one process."""
    try:
        from hypic_rag.server import serve
    except ImportError as exc:
        _missing_extra(parser, exc, "the server needs its extra: pip install 'hypic-rag[server]'")
    serve(
        args.model,
        mode=args.mode,
        log_level=args.log_level,
        prefill_workers=args.prefill_workers,
        **_server_options(args),
    )


def _run_cache(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: list[str]) -> int:
    """The cache's stats, or the cache emptied."""
    from .cache import DiskCacheTier, default_cache_dir

    directory = args.cache_dir or default_cache_dir()
    try:
        tier = DiskCacheTier(directory, sweep=args.action == "clear")  # an inspection removes nothing
    except ValueError as exc:
        parser.error(str(exc))
    if not tier.folder.is_dir():
        parser.error(f"no segment cache at {directory}")
    try:
        if args.action == "clear":
            print(f"removed {tier.clear()} entries from {directory}")
        else:
            print(json.dumps(tier.stats(), indent=2))
    except Exception as exc:  # a damaged index, an unreadable folder: say so, never a traceback
        if args.action == "stats":
            parser.error(f"cannot read the segment cache at {directory}: {type(exc).__name__}: {exc}")
        try:
            removed = tier.reset()
        except OSError as err:
            parser.error(f"cannot clear the segment cache at {directory}: {err}")
        print(f"the index at {directory} was unreadable ({type(exc).__name__}): rebuilt it, removed {removed} files")
    finally:
        tier.close()
    return 0


def _server_options(args: argparse.Namespace) -> dict[str, Any]:
    """What ``serve`` and ``serve --replicas`` both take from the command line: the server's and the engine's."""
    return {
        "name": args.served_model_name,
        "host": args.host,
        "port": args.port,
        "max_queue": args.max_queue,
        "max_active": args.max_active,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "queue_timeout_s": args.queue_timeout,
        "api_key": args.api_key or os.environ.get("HYPIC_API_KEY") or None,
        "allowed_origins": args.allowed_origins,
        "shadow_rate": args.shadow_rate,
        "cache_dir": args.cache_dir,
        "cache_url": args.cache_url,
        "cache_secret": args.cache_secret or os.environ.get("HYPIC_CACHE_SECRET") or None,
        "dtype": args.dtype,
        "entry_dtype": args.entry_dtype,
        "device": args.device,
        "pack_head": args.pack_head,
        "pack_weights": args.pack_weights,
        "weights": args.weights,
        "fidelity_budget": args.fidelity_budget,
        "keep_states": not args.no_keep_states,
    }


def _serve_fleet(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``serve --replicas N``: the same server options, on a Ray Serve fleet (a ``ValueError`` is the caller's
    usage error)."""
    if args.replicas < 1 or not 1 <= args.min_replicas <= args.replicas:
        parser.error("--replicas must be >= 1 and --min-replicas in 1..--replicas")
    if args.prefill_workers:
        parser.error("--prefill-workers and --replicas do not mix: each replica prefills its own cold segments")
    try:
        from hypic_rag.fleet.deployment import default_autoscaling
        from hypic_rag.fleet.launch import serve_fleet
    except ImportError as exc:
        _missing_extra(parser, exc, "the fleet needs its extras: pip install 'hypic-rag[server,ray]'")
    from hypic_rag.fleet.routing import make_policy

    make_policy(args.routing, args.routing_epsilon, burst=args.routing_burst)  # the router's slacks, checked first
    autoscaling = None
    if args.autoscale:
        autoscaling = default_autoscaling(args.replicas, args.max_active)
        autoscaling["min_replicas"] = args.min_replicas
        if args.target_ongoing_requests is not None:
            autoscaling["target_ongoing_requests"] = args.target_ongoing_requests
    serve_fleet(
        args.model,
        replicas=args.replicas,
        autoscaling=autoscaling,
        threads=args.threads_per_replica,
        policy=args.routing,
        epsilon=args.routing_epsilon,
        burst=args.routing_burst,
        default_mode=args.mode,
        **_server_options(args),
    )
    return 0


# ``hypic-rag COMMAND``: the function that runs it (its parser is ``_add_COMMAND``'s)
COMMANDS = {"demo": _run_demo, "bench": _run_bench, "eval": _run_eval, "serve": _run_serve, "cache": _run_cache}


if __name__ == "__main__":
    sys.exit(main())
