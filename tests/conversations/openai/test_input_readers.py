"""The Responses input readers (issues 17, 27, 29) on their own: what each kind of input item becomes, and the
refusal each malformed one gets (a 400 naming the item), before anything reaches the tree."""

from __future__ import annotations

import pytest

from config.errors import BadInput
from conversations.openai.shapes import history_messages, input_items


def test_instructions_messages_read_text_parts_and_refuse_other_parts():
    items = input_items([{"role": "developer", "content": [{"type": "input_text", "text": "Be brief."},
                                                             {"type": "text", "text": "Cite."}]},
                         {"role": "user", "content": "hi"}])
    assert items == [{"type": "system", "text": "Be brief.\nCite."}, {"type": "user", "text": "hi"}]
    for content, error in (([{"type": "input_image", "image_url": "data:,"}], r"input\[0\].content\[0\]: only text"),
                           (5, r"input\[0\].content: expected text or a list")):
        with pytest.raises(BadInput, match=error):
            input_items([{"role": "system", "content": content}, {"role": "user", "content": "hi"}])
    with pytest.raises(BadInput, match=r"input\[0\].role: expected user, system or developer"):
        input_items([{"type": "message", "content": "no role"}])


def test_a_resent_history_passes_reasoning_over_and_joins_an_answers_text_and_calls():
    messages, positions = history_messages([
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "weather", "arguments": "{}"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Looking."}]},
        {"type": "function_call_output", "call_id": "c1", "output": "sun"},
        {"type": "message", "role": "system", "content": "Be brief."},
        {"role": "user", "content": "Thanks"}])
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "system", "user"]
    assert messages[1]["content"] == "Looking." and messages[1]["tool_calls"][0]["id"] == "c1"
    assert positions == [0, 2, 4, 5, 6], "each message says where in `input` it began"
    answered_first = history_messages([{"role": "assistant", "content": "Earlier."},
                                       {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"}])
    assert answered_first[0] == [{"role": "assistant", "content": "Earlier.", "tool_calls": [
        {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]
    for entry, error in (({"type": "function_call", "call_id": "c", "name": "f"}, "a function_call has a call_id"),
                         ({"type": "web_search_call", "role": None}, "this server reads messages, function calls")):
        with pytest.raises(BadInput, match=error):
            history_messages([{"role": "assistant", "content": "x"}, entry])
