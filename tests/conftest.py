from __future__ import annotations

import argparse
import os

# Under pytest-xdist (`make test`) each worker is one of several processes sharing the cores: one torch thread
# each, and for every process it starts (servers, Ray's workers), or oversubscribed threads make small prefills
# many times slower. Set before anything imports torch.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
# Triton kernels read this when they are decorated, so it is set before anything imports them; the
# kernels run only where a test forces backend="triton".
os.environ.setdefault("TRITON_INTERPRET", "1")
# Our cache folder (weight digests, the default disk tier) goes to a scratch folder, not the user's home,
# made only when the caller named none and removed when the run ends (a run leaves nothing in /tmp).
if "HYPIC_CACHE_DIR" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["HYPIC_CACHE_DIR"] = tempfile.mkdtemp(prefix="hypic-test-cache-")
    atexit.register(shutil.rmtree, os.environ["HYPIC_CACHE_DIR"], ignore_errors=True)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from _pytest.nodeid import coerce_node_id  # noqa: E402
from hypothesis import settings  # noqa: E402

# Property tests draw the same examples on every run (a red CI run is then a real regression, reproducible
# here); HYPOTHESIS_PROFILE=explore searches afresh.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("explore", deadline=None, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from hypic_rag.testing.parity import load_reference  # noqa: E402
from hypic_rag.testing.synthetic import TEMPLATES, build_checkpoint  # noqa: E402
from hypic_rag.training.train import TRAIN_MIX  # noqa: E402

# Folders whose every test belongs to a slow tier (pyproject.toml's markers; `make test-fast` leaves them out).
TIER_FOLDERS = {Path(__file__).parent / "training": "training", Path(__file__).parent / "eval" / "bench": "bench"}


def pytest_itemcollected(item: pytest.Item) -> None:
    for folder, tier in TIER_FOLDERS.items():
        if item.path.is_relative_to(folder):
            item.add_marker(tier)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` the tests of one ``xdist_group`` run on one worker, one after another; tests that
    start a local Ray cluster (marked ``ray``) form the group ``ray``: two clusters at once would share /tmp/ray
    and oversubscribe the cores. xdist names an item's group by a suffix of its node id, which xdist 3.8 writes
    where pytest 9 no longer reads it (``item._nodeid``), so the suffix is written here, after xdist's own hook,
    where pytest 9 reads it."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        groups = {str(mark.args[0]) for mark in item.iter_markers("xdist_group")}
        if item.get_closest_marker("ray"):
            groups.add("ray")
        suffix = "@" + "_".join(sorted(groups))
        if groups and not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(item.nodeid + suffix)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory):
    """``checkpoint(kind)`` -> directory of a saved tiny random checkpoint, built once per session."""
    built: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in built:
            built[kind] = build_checkpoint(kind, tmp_path_factory.mktemp(kind))
        return built[kind]

    return get


@pytest.fixture(scope="session")
def reference():
    return load_reference


@pytest.fixture(scope="session")
def chat_checkpoint(checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random ``qwen3_5_text`` checkpoint with a Qwen-style tokenizer, chat template
    (hypic_rag/testing/templates/qwen3.jinja) and generation config, as a real checkpoint ships them."""
    import shutil

    from hypic_rag.testing.synthetic import add_chat_files

    path = tmp_path_factory.mktemp("chat") / "qwen-style"
    shutil.copytree(checkpoint("qwen3_5_text"), path)
    template = (TEMPLATES / "qwen3.jinja").read_text()
    return add_chat_files(path, template)


@pytest.fixture
def decode_rows(monkeypatch):
    """``decode_rows(engine)`` -> a list that gets the number of rows of each of ``engine``'s batched decode steps."""

    def record(engine) -> list[int]:
        seen: list[int] = []
        real = engine.model.decode_batch

        def recording(tokens, states):
            seen.append(len(tokens))
            return real(tokens, states)

        monkeypatch.setattr(engine.model, "decode_batch", recording)
        return seen

    return record


def _train_args(out) -> argparse.Namespace:
    return argparse.Namespace(
        out=str(out), steps=3, seed=0, examples=30, eval_examples=2, eval_every=3, vocab=400, hidden=64,
        layers="linear_attention,full_attention", max_len=640, batch=2, lr=3e-3, warmup=2, questions=2,
        context_loss=0.3, threads=0, device="cpu", attn_head_dim=32, curriculum=0.0, recall=0.25,
        init=None, grow=False, drills=0, drill_spaces=False, mix=",".join(TRAIN_MIX), broad_recall=False,
        phrase_recall=True, conv_kernel=4, sentences=0.0, sentence_lists=False, open_names=0.0, copy=0.0,
    )  # fmt: skip


@pytest.fixture(scope="session")
def train_args():
    """``train_args(out)`` -> the training script's arguments for a 3-step run of a tiny model into ``out``."""
    return _train_args


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Work goes to the workers a module at a time (an ``xdist_group`` at a time where one is named), largest
    first: a module's fixtures (its engines, its checkpoints, its server) are then built once, by the worker
    that runs it, instead of by every worker that gets one of its tests. xdist's own ``LoadGroupScheduling``
    hands out single tests; this is its scope rule with the module in place of the test."""
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    class FirstOut(OrderedDict):
        """The work queue, with ``FIRST_OUT``'s scopes moved to its front as they are put in."""

        def __setitem__(self, key: str, value: dict[str, bool]) -> None:
            super().__setitem__(key, value)
            if key in FIRST_OUT:
                self.move_to_end(key, last=False)

    class ModulesAndGroups(LoadScopeScheduling):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.workqueue = FirstOut()

        def _split_scope(self, nodeid: str) -> str:
            if "@" in nodeid:
                return nodeid.rsplit("@", 1)[-1]
            return nodeid.split("::", 1)[0]

    return ModulesAndGroups(config, log)


# Scopes handed out before the largest: a long set-up that a test elsewhere waits on (the wheel's install, which the
# Ray group's fleet-of-one test uses) starts at once, beside the Ray group, instead of last.
FIRST_OUT = ("tests/test_wheel.py",)
