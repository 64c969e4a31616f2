"""The tail a stream holds back (hypic_rag.tags), against its definition."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from hypic_rag.tags import partial_suffix


def _partial_suffix_by_definition(text: str, tags) -> int:
    """The longest tail of ``text`` that is a proper prefix of a tag, tried length by length."""
    return max(
        (n for tag in tags for n in range(1, min(len(tag) - 1, len(text)) + 1) if text.endswith(tag[:n])), default=0
    )


@given(
    st.text(alphabet="ab<", max_size=30),
    st.lists(st.text(alphabet="ab<", min_size=1, max_size=12), min_size=1, max_size=4),
)
def test_partial_suffix_is_the_longest_tail_that_begins_a_tag(text, tags):
    assert partial_suffix(text, tags) == _partial_suffix_by_definition(text, tags)
