"""`make demo` must keep working: an LCEL chain over MiniLM retrieval on the bundled model, every mode."""

from __future__ import annotations

from hypic_rag import Engine
from hypic_rag.integrations.demo import DEMO_MODES, questions, run


def test_demo_runs_every_mode_and_hypic_hits_reordered_documents():
    lines: list[str] = []
    assert run(Engine.from_pretrained(min_cached_tokens=1), people=12, count=4, log=lines.append)
    table = {line.split()[0]: line.split() for line in lines if line.split() and line.split()[0] in DEMO_MODES}
    assert set(table) == set(DEMO_MODES)
    hits, total = map(int, table["hypic"][3].split("/"))
    assert hits == total == 4 * 3  # profiles, k=3, all cached when indexed
    assert table["full"][3].startswith("0/")  # full never reads the cache
    assert all(table[m][5].endswith("/4") for m in DEMO_MODES)  # answers right, of 4
    assert "Indexing cached the 12 profiles for hypic once" in "\n".join(lines)
    assert sum(line.startswith("Q: ") for line in lines) == 4
    assert "seed 0 (the same run again: hypic-rag demo --seed 0)" in lines


def test_demo_with_one_fact_per_document():
    lines: list[str] = []
    assert run(Engine.from_pretrained(min_cached_tokens=1), people=6, count=2, k=4, profiles=False, log=lines.append)
    assert lines[0].startswith("hypic-rag demo: 24 facts of 6 people")


def test_questions_come_in_pairs_about_the_same_people():
    qa = [(f"q{p}{k}", f"a{p}{k}") for p in range(6) for k in range(4)]
    asked = questions(qa, 6, 4, seed=0)
    assert len(asked) == 4 and asked[0][0][1] == asked[3][0][1] and asked[1][0][1] == asked[2][0][1]
