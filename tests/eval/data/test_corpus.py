"""The demo's retrieval corpus: one fact per document, each question answered by its fact."""

from __future__ import annotations

import pytest

from hypic_rag.eval.data.corpus import corpus


def test_corpus_is_one_fact_per_document_and_each_question_has_its_fact():
    texts, qa = corpus(12, seed=3)
    assert len(texts) == len(qa) == 48 and len(set(texts)) == 48
    for text, (question, answer) in zip(texts, qa, strict=True):
        assert " ".join(text.split()[:2]) in question  # the fact is about the person asked about
        assert text.endswith((f" {answer}.", f" {answer} years old."))
    assert corpus(12, seed=3) == (texts, qa)
    with pytest.raises(ValueError, match="people must be between"):
        corpus(0, seed=3)
