"""The demo's retrieval corpus: one fact per document or one profile per person, each question answered."""

from __future__ import annotations

import re

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


def test_profiles_hold_each_persons_four_facts_in_one_document():
    facts, qa = corpus(12, seed=3)
    profiles, same_qa = corpus(12, seed=3, profiles=True)
    assert same_qa == qa and len(profiles) == 12
    for person, profile in enumerate(profiles):
        sentences = facts[4 * person : 4 * person + 4]
        assert sorted(re.split(r"(?<=\.) ", profile)) == sorted(sentences)
        for question, answer in qa[4 * person : 4 * person + 4]:
            assert " ".join(profile.split()[:2]) in question and answer in profile
    assert any(profile != " ".join(facts[4 * p : 4 * p + 4]) for p, profile in enumerate(profiles))  # shuffled
    assert corpus(12, seed=3, profiles=True) == (profiles, qa)
