"""ChatGPT exports as they are today (issue 15), imported from real files (tests/fixtures/exports/SOURCES.md says
where each came from): nothing a person saw is dropped, nothing a person never saw becomes a question, code and its
output are tool calls and results (T4), thoughts are reasoning items (C4), files are placeholders, custom
instructions are the conversation's instructions, a BOM is accepted and an entry that cannot be read is skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conversations.models import Conversation, Node
from conversations.screen import path_bubbles
from conversations.selectors import node_path
from conversations.turns.seen import next_context
from tests.conversations.helpers import head

pytestmark = pytest.mark.django_db

FILES = Path(__file__).resolve().parent.parent / "fixtures" / "exports" / "chatgpt"
NEVER_SHOWN = {"user_editable_context", "model_editable_context", "reasoning_recap"}


def _post(api, raw: bytes):
    return api.post("/api/conversations/import/", data=raw, content_type="application/json")


def _entries(name: str) -> list[dict]:
    document = json.loads((FILES / name).read_text())
    return document if isinstance(document, list) else [document]


def _shown_texts(entry: dict) -> list[str]:
    """What a person saw in ChatGPT, read from the file on its own terms: each visible message's texts."""
    texts = []
    for value in entry["mapping"].values():
        message = value.get("message")
        if not message or message["author"]["role"] == "system":
            continue
        metadata, content = message.get("metadata") or {}, message["content"]
        if metadata.get("is_visually_hidden_from_conversation") or content["content_type"] in NEVER_SHOWN:
            continue
        texts += [p for p in content.get("parts") or [] if isinstance(p, str)]
        texts += [content[k] for k in ("text",) if isinstance(content.get(k), str)]
    return [t.strip() for t in texts if t.strip()]


def _item_texts(node: Node) -> list[str]:
    out = []
    for item in [*node.sent, *node.received]:
        kind = item["type"]
        if kind in ("user", "text", "reasoning"):
            out.append(item["text"])
        elif kind == "tool_result":
            out.append(item["content"])
        elif kind == "tool_call":
            out.append(json.loads(item["arguments"])["code"])
    return out


def _assert_nothing_lost_and_nothing_empty(conversation: Conversation, entry: dict) -> None:
    nodes = list(Node.objects.filter(conversation=conversation))
    every = "\n".join(t for n in nodes for t in _item_texts(n))
    missing = [t[:60] for t in _shown_texts(entry) if t not in every]
    assert missing == [], f"messages a person saw that the import dropped: {missing}"
    for node in nodes:
        assert _item_texts(node) and all(t.strip() for t in _item_texts(node)), f"an empty node: {node.sent}"
        assert all(i["text"] for i in node.sent if i["type"] == "user"), "no empty question"


@pytest.mark.parametrize("name", sorted(p.name for p in FILES.glob("*.json")))
def test_issue_15_every_message_a_person_saw_in_a_real_export_is_kept_and_no_node_is_empty(api, user, name):
    """Issue 15: 17 messages became 7 nodes and 45 became 21 (code, outputs, browsing dropped; hidden messages
    became empty questions). Every visible message's text is now in the imported tree, and no node is empty."""
    response = _post(api, (FILES / name).read_bytes())
    assert response.status_code == 201, response.json()
    readable = [e for e in _entries(name) if "mapping" in e]
    created = response.json()["conversations"]
    assert len(created) == len(readable)
    for entry, out in zip(readable, created, strict=True):
        _assert_nothing_lost_and_nothing_empty(Conversation.objects.get(pk=out["id"]), entry)


def test_issue_15_t4_code_interpreter_runs_become_tool_calls_and_results(api, user):
    """T4: each `code` message to python is a tool call, its `execution_output` the result in the next node's
    sent items, paired by call id; the model then sees a real tool round, not text glued to text."""
    response = _post(api, (FILES / "chatgpt2graph-code-interpreter-2023.json").read_bytes())
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    nodes = {n.pk: n for n in Node.objects.filter(conversation=conversation)}
    calls = [i for n in nodes.values() for i in n.received if i["type"] == "tool_call"]
    results = [(n, i) for n in nodes.values() for i in n.sent if i["type"] == "tool_result"]
    assert len(calls) == 11 and {c["name"] for c in calls} == {"python"}
    assert len(results) == 11
    for node, result in results:
        assert result["call_id"] in {i["id"] for i in nodes[node.parent_id].received if i["type"] == "tool_call"}
    bubbles = [v.bubble for v in path_bubbles(conversation=conversation)]
    tools = [b for b in bubbles if b.role == "tool"]
    assert len(tools) == 11 and all(b.data["status"] == "done" and b.data["result"] for b in tools)


def test_issue_15_custom_instructions_become_the_conversations_and_hidden_messages_are_no_questions(api, user):
    """A hidden `user_editable_context` message is the person's custom instructions: the conversation's
    instructions, never an empty question on screen or in the model's context. The file has a UTF-8 byte
    order mark, as some editors save it: accepted."""
    raw = "\ufeff".encode() + (FILES / "owi-importer-gpt-example-2025.json").read_bytes()
    response = _post(api, raw)
    assert response.status_code == 201, response.json()
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    assert "keep the initial response to 1 to 2 paragraphs" in conversation.instructions
    bubbles = [v.bubble for v in path_bubbles(conversation=conversation)]
    assert [b.role for b in bubbles] == ["user", "assistant"] * 5
    assert all(b.content.strip() for b in bubbles)


def test_issue_15_an_entry_that_cannot_be_read_is_skipped_and_named_while_the_others_import(api, user):
    """API.md: `skipped: [{index, error}]`. The maintainers' modern-export fixture holds an entry with no
    `mapping`: it was refused whole ("Unknown file"); now it is named and the two others import."""
    response = _post(api, (FILES / "librechat-chatgpt-modern-export-HANDMADE.json").read_bytes())
    assert response.status_code == 201, response.json()
    body = response.json()
    assert [c["title"] for c in body["conversations"]] == ["Deploying the staging cluster", "Weeknight pasta"]
    assert body["skipped"] == [{"index": 1, "error": "conversations[1]: not a ChatGPT conversation (it has no "
                                                     "mapping)."}]


def test_issue_15_nothing_readable_is_a_400_naming_why_and_creates_nothing(api, user):
    response = _post(api, json.dumps([{"title": "a", "mapping": []}, {"title": "b"}]).encode())
    assert response.status_code == 400
    assert "conversations[0].mapping: expected an object" in response.json()["error"]["message"]
    assert "conversations[1]: not a ChatGPT conversation" in response.json()["error"]["message"]
    assert Conversation.objects.count() == 0


def test_issue_15_t8_a_real_branched_export_keeps_its_branches_and_its_current_one(api, user):
    """T8: the regenerated answer and the edited question are sibling versions; the head is `current_node`."""
    (entry,) = _entries("librechat-chatgpt-tree.json")
    response = _post(api, (FILES / "librechat-chatgpt-tree.json").read_bytes())
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    current = entry["mapping"][entry["current_node"]]["message"]["content"]["parts"][0]
    assert it_answer(head(conversation)) == current
    versions = [(v.bubble.role, v.branch.count) for v in path_bubbles(conversation=conversation)]
    assert sum(1 for _, count in versions if count == 2) >= 2, versions


def it_answer(node: Node) -> str:
    return "\n\n".join(i["text"] for i in node.received if i["type"] == "text")


def _message(key, parent, role, content, **extra):
    return key, {"id": key, "parent": parent, "children": [],
                 "message": {"id": key, "author": {"role": role, "name": extra.pop("name", None)},
                             "content": content, "metadata": extra.pop("metadata", {}),
                             "recipient": extra.pop("recipient", "all")}}


def _conversation(*messages):
    mapping = {"client-created-root": {"id": "client-created-root", "parent": None, "children": [], "message": None}}
    for key, entry in messages:
        mapping[key] = entry
        mapping[entry["parent"]]["children"].append(key)
    return {"title": "today", "mapping": mapping, "current_node": messages[-1][0]}


def test_issue_15_c4_thoughts_are_reasoning_items_and_images_are_placeholders(api, user):
    """C4: `thoughts` (reasoning models) become a reasoning item of the answer's node, kept and never sent to a
    model as text; the recap ("Thought for 7 seconds") is no message; an uploaded image and a generated one are
    placeholders naming the file. Shapes as in chboishabba/ITIR-suite and chboishabba/reverse-engineered-chatgpt
    (2025-26 files not copied: see SOURCES.md)."""
    image = {"content_type": "image_asset_pointer", "asset_pointer": "sediment://file_abc", "width": 1024,
             "height": 768, "metadata": {"dalle": {"prompt": "a red kite"}}}
    document = _conversation(
        _message("u", "client-created-root", "user", {"content_type": "multimodal_text",
                                                      "parts": [{**image, "metadata": {}}, "What is this?"]}),
        _message("t", "u", "assistant", {"content_type": "thoughts", "thoughts": [
            {"summary": "Looking at the image", "content": "It shows a bird of prey.", "chunks": [],
             "finished": True}], "source_analysis_msg_id": "x"}),
        _message("r", "t", "assistant", {"content_type": "reasoning_recap", "content": "Thought for 7 seconds"}),
        _message("a", "r", "assistant", {"content_type": "text", "parts": ["A kite."]}),
        _message("c", "a", "assistant", {"content_type": "code", "language": "json", "text": '{"prompt": "kite"}'},
                 recipient="t2uay3k.sj1i4kz"),
        _message("o", "c", "tool", {"content_type": "multimodal_text", "parts": [image]}, name="t2uay3k.sj1i4kz"),
        _message("f", "o", "assistant", {"content_type": "text", "parts": ["Here it is."]}),
    )
    response = _post(api, json.dumps([document]).encode())
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    path = node_path(head(conversation).pk, owner=conversation.owner_id)
    first, second = (Node.objects.get(pk=p.id) for p in path)
    assert first.sent == [{"type": "user", "text": "[image 1024x768: sediment://file_abc]\nWhat is this?"}]
    reasoning, answer, call = first.received
    assert reasoning == {"type": "reasoning", "provider": "chatgpt", "data": None,
                         "text": "Looking at the image\nIt shows a bird of prey."}
    assert answer == {"type": "text", "text": "A kite."} and call["name"] == "t2uay3k.sj1i4kz"
    (result,) = second.sent
    assert result["call_id"] == call["id"]
    assert result["content"] == "[image 1024x768: sediment://file_abc] (made from: a red kite)"
    assert second.received == [{"type": "text", "text": "Here it is."}]
    seen = json.dumps(next_context(conversation))
    assert "bird of prey" not in seen, "ChatGPT's thoughts are never sent to a model (C4)"
