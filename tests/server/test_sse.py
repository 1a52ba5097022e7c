"""Server-sent event framing: one event is one line to any line splitter, whatever text the model wrote."""

import json

from pagedllm.entrypoints.server.sse import event

TEXT = "a\u2028b\x85c\u2029d \u00e9 \x1c\x0b\x0c\r\n end"  # every line end str.splitlines knows, and non-ASCII


def test_an_event_is_one_line_even_where_the_text_holds_line_ends_of_other_kinds():
    """httpx's iter_lines splits as str.splitlines does: on U+2028, U+2029 and U+0085 too, which JSON leaves raw."""
    framed = event({"text": TEXT})
    assert framed.endswith("\n\n") and framed.splitlines() == [framed[:-2], ""]
    assert json.loads(framed.removeprefix("data: ")) == {"text": TEXT}
    assert "\u00e9" in framed  # other non-ASCII text stays as it is


def test_an_ascii_event_is_plain_compact_json():
    assert event({"a": [1, "x"]}) == 'data: {"a":[1,"x"]}\n\n'
