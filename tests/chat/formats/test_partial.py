"""Calls as far as they are written (hypic_rag.chat.formats.partial): whatever the model's spacing and escapes, and
wherever the text is cut, what is certain of a call's arguments begins their final canonical text."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hypic_rag.chat.formats.partial import CallSoFar, json_call, json_prefix

# no subnormals: an engine in the same process flushes them to zero (``flush_denormals``), which Hypothesis refuses
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**12), 10**12)
    | st.floats(allow_nan=False, allow_infinity=False, allow_subnormal=False)
)
VALUES = st.recursive(
    SCALARS | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
STYLES = [{"separators": (",", ":")}, {}, {"ensure_ascii": True}, {"indent": 2, "ensure_ascii": False}]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.text(max_size=6), VALUES, max_size=4), st.sampled_from(STYLES))
def test_every_cut_of_an_object_gives_a_prefix_of_its_canonical_text(value, style):
    written, final = json.dumps(value, **style), json.dumps(value, ensure_ascii=False)
    for cut in range(len(written)):
        prefix, end = json_prefix(written[:cut])
        assert final.startswith(prefix) and end is None, (written[:cut], prefix)
    assert json_prefix(written + " tail") == (final, len(written))


def test_numbers_and_literals_wait_for_their_end_and_escapes_for_their_whole():
    assert json_prefix('{"n": 1.5') == ('{"n": ', None)  # may yet be 1.57
    assert json_prefix('{"n": 1.50,') == ('{"n": 1.5, ', None)
    assert json_prefix('{"b": tru') == ('{"b": ', None)
    assert json_prefix('{"s": "caf\\u00') == ('{"s": "caf', None)
    assert json_prefix('{"s": "\\ud83d') == ('{"s": "', None)  # half of a pair: nothing of it yet
    pair = '{"s": "\\ud83d\\ude00"}'
    assert json_prefix(pair) == ('{"s": "\U0001f600"}', len(pair))


def test_a_call_gives_its_name_once_whole_in_either_key_order():
    assert json_call("no call") is None and json_call("  ") is None
    assert json_call('{"name": "get_wea') == CallSoFar(None, "")
    assert json_call('{"name": "get_weather", "arguments": {"city": "Os') == CallSoFar(
        "get_weather", '{"city": "Os', ("city",)
    )
    # the bundled model sorts its keys: a "name" inside the arguments is not the call's
    assert json_call('{"arguments":{"name":"Bo"},"na') == CallSoFar(None, '{"name": "Bo"}', ("name",))
    whole = '{"arguments":{"name":"Bo"},"name":"f"} after'
    assert json_call(whole) == CallSoFar("f", '{"name": "Bo"}', ("name",), whole.index(" after"))
    # the keys written whole so far, the top level's only
    assert json_call('{"arguments":{"a":{"b":1},"c":[{"d":2}],"e') == CallSoFar(
        None, '{"a": {"b": 1}, "c": [{"d": 2}], "e', ("a", "c")
    )
    string_form = '{"name": "f", "arguments": "{\\"x\\": 1}"}'
    assert json_call(string_form) == CallSoFar("f", "", (), len(string_form))  # string form: sent at the end
