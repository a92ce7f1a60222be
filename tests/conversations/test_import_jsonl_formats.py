"""Issue 28: files people bring that used to bounce off as "Unknown file" or "not valid JSON: Extra data": SillyTavern
chats (JSON Lines, swipes as sibling answers) and ShareGPT data (function calls and their outputs as tool rounds).
Real files from public repositories: tests/fixtures/exports/SOURCES.md."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conversations import items as it
from conversations.models import Conversation, Node
from conversations.screen import path_bubbles
from conversations.selectors import node_path
from conversations.transfer.importing import parse
from conversations.transfer.plan import ImportRefused
from tests.conversations.helpers import head

pytestmark = pytest.mark.django_db

EXPORTS = Path(__file__).resolve().parent.parent / "fixtures" / "exports"
MEGUMIN = EXPORTS / "sillytavern" / "sillytavern-megumin-2023.jsonl"
GLAIVE = EXPORTS / "sharegpt" / "llamafactory-glaive-toolcall-demo-2-of-300.json"


def _post(api, raw: bytes):
    return api.post("/api/conversations/import/", data=raw, content_type="application/json")


def _imported(response) -> list[Conversation]:
    assert response.status_code == 201, response.json()
    return [Conversation.objects.get(pk=c["id"]) for c in response.json()["conversations"]]


def _shown(conversation) -> list[tuple[str, str]]:
    return [(v.bubble.role, v.bubble.content) for v in path_bubbles(conversation=conversation)]


def test_issue_28_a_real_sillytavern_chat_imports_with_its_greeting_question_and_answer(api):
    """Issue 28, T8: SillyTavern's JSON Lines file (header line, then messages): the character's greeting, the
    person's question and the answer, in order, titled after the character; the header is no message."""
    (conversation,) = _imported(_post(api, MEGUMIN.read_bytes()))
    lines = [json.loads(line) for line in MEGUMIN.read_text().splitlines()]
    assert conversation.title == "Chat with Megumin"
    assert _shown(conversation) == [("assistant", lines[1]["mes"]), ("user", lines[2]["mes"]),
                                    ("assistant", lines[3]["mes"])]
    assert Node.objects.filter(conversation=conversation).count() == 2


def _swiped_chat() -> bytes:
    """The Megumin chat with swipes as SillyTavern writes them: the last answer has three, the second shown, and a
    thought in `extra.reasoning`; a system note the model never saw."""
    lines = [json.loads(line) for line in MEGUMIN.read_text().splitlines()]
    last = lines[3]
    last["swipes"] = ["First try.", last["mes"], "Third try."]
    last["swipe_id"] = 1
    last["extra"] = {"reasoning": "She wants a test."}
    note = {"name": "System", "is_user": False, "is_system": True, "send_date": "x", "mes": "[narrator note]"}
    lines.insert(3, note)
    lines.append({"name": "You", "is_user": True, "is_name": True, "send_date": "y", "mes": "Ready!"})
    return "\n".join(json.dumps(line) for line in lines).encode()


def test_issue_28_t8_swipes_are_sibling_answers_and_the_chat_goes_on_from_the_shown_one(api):
    """Issue 28, T8, C4: a message's swipes are the other answers the model gave there: siblings of the shown
    one, which the conversation goes on from; its thought is kept as reasoning (never sent to a model); a system
    note is left out."""
    (conversation,) = _imported(_post(api, _swiped_chat()))
    lines = [json.loads(line) for line in MEGUMIN.read_text().splitlines()]
    shown = _shown(conversation)
    assert shown[-3:] == [("user", lines[2]["mes"]), ("assistant", lines[3]["mes"]), ("user", "Ready!")]
    assert all("narrator note" not in text for _, text in shown)
    path = node_path(head(conversation).pk, owner=conversation.owner_id)
    answered = path[-2]
    assert it.answer_text(answered.received) == lines[3]["mes"]
    assert [i["type"] for i in answered.received] == ["reasoning", "text"]
    siblings = Node.objects.filter(parent_id=answered.parent_id).exclude(pk=answered.id)
    assert sorted(it.answer_text(n.received) for n in siblings) == ["First try.", "Third try."]
    assert all(n.sent == answered.sent for n in siblings), "each swipe answers the same question"


def test_issue_28_a_real_sharegpt_file_imports_its_function_calls_as_tool_rounds(api):
    """Issue 28, T4: ShareGPT data (LLaMA-Factory's glaive tool-call demo): each entry a conversation; a
    `function_call` is a call the model made and the `observation` after it that call's output, sent in the next
    node; the answers follow. Nothing is lost: every value is shown."""
    document = json.loads(GLAIVE.read_text())
    plain, tools = _imported(_post(api, GLAIVE.read_bytes()))
    assert [t for _, t in _shown(plain)] == [m["value"] for m in document[0]["conversations"]]
    path = node_path(head(tools).pk, owner=tools.owner_id)
    calls = [c for node in path for c in it.tool_calls(node.received)]
    assert [json.loads(c["arguments"])["shape"] for c in calls] == ["rectangle", "circle", "square"]
    assert {c["name"] for c in calls} == {"calculate_area"}
    results = [r for node in path for r in node.sent if r["type"] == "tool_result"]
    assert [r["content"] for r in results] == ['{"area": 15}', '{"area": 50.24}', '{"area": 49}']
    assert [r["call_id"] for r in results] == [c["id"] for c in calls], "each output answers its call (C4)"
    answers = [it.answer_text(node.received) for node in path if it.answer_text(node.received)]
    assert answers == [m["value"] for m in document[1]["conversations"] if m["from"] == "gpt"]


def test_issue_28_sharegpt_as_json_lines_imports_one_conversation_a_line(api):
    """Issue 28: fine-tuning data often comes as JSON Lines, one ShareGPT conversation a line."""
    document = json.loads(GLAIVE.read_text())
    raw = "\n".join(json.dumps(entry) for entry in document).encode()
    assert len(_imported(_post(api, raw))) == 2


@pytest.mark.parametrize(("raw", "message"), [
    pytest.param(b'{"user_name": "You"}\n{"mes": "hi", "is_user": true}\n{oops', "line 3 is not valid JSON",
                 id="a-bad-line"),
    pytest.param(b'{"a": 1} {"b": 2}', "not valid JSON: Extra data", id="two-values-on-one-line"),
    pytest.param(b'{"a": 1}\n{"b": "\\u0000"}', "line 2:", id="a-nul-on-a-line"),
    pytest.param(b'not json\n{"a": 1}', "not valid JSON", id="not-json-lines"),
])
def test_issue_28_d5_json_lines_are_read_as_strictly_as_a_whole_file(raw, message):
    """Issue 28, D5: a JSON Lines file is read line by line with the same strictness; a bad line is named."""
    with pytest.raises(ImportRefused, match=message):
        parse(raw)


def test_issue_28_d5_a_jsonl_file_of_no_known_shape_is_refused_and_creates_nothing(api):
    """Issue 28, D5: JSON Lines that are neither a SillyTavern chat nor ShareGPT: refused, named, nothing made."""
    response = _post(api, b'{"a": 1}\n{"b": 2}\n')
    assert response.status_code == 400 and "a SillyTavern chat (.jsonl) or ShareGPT data" in response.json()[
        "error"]["message"]
    assert not Conversation.objects.exists()


def test_issue_28_sharegpt_odd_turns_are_kept_as_far_as_they_can_be_read(api):
    """Issue 28, D5: a call whose value is not JSON keeps it as its arguments; an output with no call before it is
    shown as the tool's words; the entry's `system` and a system turn become the instructions; an empty value and
    an unknown speaker are left out; an entry that is no conversation is skipped and named."""
    document = [
        {"system": "Be brief.", "conversations": [
            {"from": "system", "value": "Answer in French."},
            {"from": "observation", "value": "stray output"},
            {"from": "human", "value": "q1"},
            {"from": "function_call", "value": "lookup(x)"},
            {"from": "observation", "value": "42"},
            {"from": "function_call", "value": "[1, 2]"},
            {"from": "observation", "value": "list"},
            {"from": "function_call", "value": '{"arguments": "{\\"a\\": 1}"}'},
            {"from": "observation", "value": "named"},
            {"from": "narrator", "value": "ignored"},
            {"from": "gpt", "value": ""},
            {"from": "gpt", "value": "a1"}]},
        {"conversations": [{"from": "human"}]},
    ]
    response = _post(api, json.dumps(document).encode())
    (conversation,) = _imported(response)
    assert [s["index"] for s in response.json()["skipped"]] == [1]
    assert conversation.instructions == "Be brief.\n\nAnswer in French."
    path = node_path(head(conversation).pk, owner=conversation.owner_id)
    calls = [c for node in path for c in it.tool_calls(node.received)]
    assert [(c["name"], c["arguments"]) for c in calls] == [
        ("function", "lookup(x)"), ("function", "[1, 2]"), ("function", '{"a": 1}')]
    assert it.question_of(path[0].sent) == "[tool output] stray output"
    assert it.answer_text(path[-1].received) == "a1"
    assert all("ignored" not in t for _, t in _shown(conversation))


def test_issue_28_a_sillytavern_message_whose_text_is_not_text_refuses_the_chat(api):
    """Issue 28, D5: `mes` must be text: the chat is refused, named, and nothing is created."""
    raw = b'{"user_name": "You", "character_name": "X"}\n{"name": "You", "is_user": true, "mes": 42}'
    response = _post(api, raw)
    assert response.status_code == 400 and "`mes` is not text" in response.json()["error"]["message"]
    assert not Conversation.objects.exists()
