from __future__ import annotations

from hypic_rag.eval.bench.template_ids import STYLES, run
from hypic_rag.testing.synthetic import TEMPLATES as SYNTHETIC_TEMPLATES

TEMPLATES = SYNTHETIC_TEMPLATES


def test_cuts_at_line_boundaries_keep_the_ids_and_spaced_parts_do_not(tmp_path):
    report = run([TEMPLATES / "chatml.jinja"], n=5, log=lambda _: None)
    assert set(report["results"]) == {"bundled", "chatml.jinja"}
    rows = {r["style"]: r for r in report["results"]["chatml.jinja"]}
    assert set(rows) == set(STYLES)
    # Cuts at paragraph and part boundaries fall where the byte-level pre-tokenizer splits anyway...
    assert rows["flat_rag"]["prompts_differing"] == 0 and rows["explicit_parts"]["prompts_differing"] == 0
    # ...but a part that ends in a space loses the merge of that space into the next word.
    assert rows["explicit_spaced"]["prompts_differing"] == 5 and rows["explicit_spaced"]["extra_tokens"] > 0
    # The bundled tokenizer isolates whitespace, so no cut ever changes its ids.
    assert all(r["prompts_differing"] == 0 for r in report["results"]["bundled"])
