"""The peers' export formats (issue 15): Open WebUI, LibreChat, Claude.ai and chatbot-ui files import with every
message a person saw, on the branch it was on (T8), from real files (tests/fixtures/exports/SOURCES.md)."""

from __future__ import annotations

import html
import json
import re
import sys
from pathlib import Path

import pytest

from conversations.models import Conversation, Node
from conversations.screen import path_bubbles
from conversations.selectors import node_path
from tests.conversations.helpers import head

pytestmark = pytest.mark.django_db

EXPORTS = Path(__file__).resolve().parent.parent / "fixtures" / "exports"


def _post(api, document):
    raw = document if isinstance(document, bytes) else json.dumps(document).encode()
    return api.post("/api/conversations/import/", data=raw, content_type="application/json")


def _load(path: Path):
    return json.loads(path.read_text())


def _openwebui_texts(document) -> list[str]:
    chats = document if isinstance(document, list) else [document]
    texts = []
    for chat in chats:
        inner = chat.get("chat", chat)
        for message in inner["history"]["messages"].values():
            output = message.get("output")
            if output:
                texts += [p["text"] for item in output if item["type"] == "message" for p in item["content"]]
            else:
                texts.append(html.unescape(re.sub(r"<details.*?</details>", "", message["content"], flags=re.S)))
    return texts


def _librechat_texts(document) -> list[str]:
    texts, stack = [], list(document.get("messages") or document.get("messagesTree"))
    while stack:
        message = stack.pop()
        texts.append(message["text"])
        stack += message.get("children") or []
    return texts


def _claude_texts(document) -> list[str]:
    conversations = document if isinstance(document, list) else [document]
    return [b["text"] for c in conversations for m in c["chat_messages"] for b in m["content"] if b["type"] == "text"]


def _chatbotui_texts(document) -> list[str]:
    return [m["content"] for c in document["history"] for m in c["messages"]]


SHOWN = {"openwebui": _openwebui_texts, "librechat": _librechat_texts, "claude": _claude_texts,
         "chatbot-ui": _chatbotui_texts}
PEER_FILES = sorted(p for kind in SHOWN for p in (EXPORTS / kind).glob("*.json"))


def _texts(node: Node) -> str:
    return "\n".join(i.get("text") or i.get("content") or "" for i in [*node.sent, *node.received])


@pytest.mark.parametrize("path", PEER_FILES, ids=[f"{p.parent.name}/{p.name}" for p in PEER_FILES])
def test_issue_15_a_peers_export_imports_with_every_message_a_person_saw(api, user, path):
    """Every message's text is in the imported nodes, no node is empty, and each node's question is a question.
    Only a conversation with no message at all is skipped, and named (issue 26: no empty conversation is made)."""
    response = _post(api, path.read_bytes())
    assert response.status_code == 201, response.json()
    assert all(s["error"].endswith("it holds no message that could be read.") for s in response.json()["skipped"])
    ids = [c["id"] for c in response.json()["conversations"]]
    nodes = list(Node.objects.filter(conversation_id__in=ids))
    every = "\n".join(_texts(n) for n in nodes)
    missing = [t.strip()[:60] for t in SHOWN[path.parent.name](_load(path)) if t.strip() and t.strip() not in every]
    assert missing == []
    assert all(_texts(n).strip() for n in nodes)


def test_issue_15_t8_librechat_branches_stay_siblings_and_the_newest_reply_is_the_head(api, user):
    """T8: LibreChat's siblings (two replies to "thanks", and "lol" beside "thanks") are sibling nodes; the file
    does not say which branch was shown, so the head is the newest reply's."""
    response = _post(api, (EXPORTS / "librechat" / "librechat-tree-branches.json").read_bytes())
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    views = [(v.bubble.role, v.bubble.content[:4], v.branch.count) for v in path_bubbles(conversation=conversation)]
    assert views == [("user", "How ", 1), ("assistant", "It l", 1), ("user", "lol", 3), ("assistant", "It l", 3)]
    assert Node.objects.filter(conversation=conversation).count() == 5


def test_issue_15_t8_open_webui_current_id_is_the_head_and_a_call_is_a_tool_round(api, user):
    """Open WebUI's `history.currentId` is the head; an answer's `output` function call and its output are a tool
    round (T4) whose bubble shows the result."""
    response = _post(api, (EXPORTS / "openwebui" / "librechat-openwebui-export.json").read_bytes())
    titles = {c["title"]: c["id"] for c in response.json()["conversations"]}
    tool_chat = Conversation.objects.get(pk=titles["Chat with tool call"])
    first, second = (Node.objects.get(pk=p.id) for p in node_path(head(tool_chat).pk, owner=tool_chat.owner_id))
    (call,) = [i for i in first.received if i["type"] == "tool_call"]
    assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
    assert second.sent == [{"type": "tool_result", "call_id": call["id"], "name": "get_weather",
                            "content": "Paris: 18C, rain", "is_error": False}]
    assert second.received == [{"type": "text", "text": "The weather in Paris is 18C with rain."}]
    reasoning_chat = Conversation.objects.get(pk=titles["Chat with reasoning"])
    (answer,) = [Node.objects.get(pk=p.id) for p in node_path(head(reasoning_chat).pk, owner=reasoning_chat.owner_id)]
    assert [i["type"] for i in answer.received] == ["reasoning", "text"] and answer.received[1]["text"] == "255"


def test_issue_15_t8_a_claude_conversation_with_parent_links_keeps_its_current_leaf(api, user):
    """claude.ai's web conversation has `parent_message_uuid` and `current_leaf_message_uuid`: the head is the
    current leaf's node."""
    document = _load(EXPORTS / "claude" / "osteele-claude-web-api-conversation-2024.json")
    response = _post(api, document)
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    leaf = next(m for m in document["chat_messages"] if m["uuid"] == document["current_leaf_message_uuid"])
    assert leaf["content"][0]["text"] in _texts(head(conversation))


def test_issue_15_c4_a_claude_answer_with_thinking_a_tool_and_its_result_is_a_tool_round(api, user):
    """A claude.ai answer holds its thinking, a tool_use, the tool_result claude.ai's tool gave back and more
    text, in one message, with no ids (the shape of idanmashaal/Now2ai-Claude-Export-Processor data/
    conversations.json and yaleman/anthropic-data tests/data/conversations.json): the thinking is a reasoning item
    (C4), the call and its result a tool round (T4); a file is a placeholder."""
    document = [{"uuid": "c1", "name": "artifacts", "chat_messages": [
        {"uuid": "h1", "sender": "human", "text": "", "content": [{"type": "text", "text": "Summarise this."}],
         "attachments": [{"file_name": "paper.pdf", "file_type": "pdf", "extracted_content": "..."}],
         "files": [{"file_name": "paper.pdf"}]},
        {"uuid": "a1", "sender": "assistant", "text": "", "content": [
            {"type": "thinking", "thinking": "The user wants a summary.", "summaries": [], "cut_off": False},
            {"type": "text", "text": "Here is the summary:"},
            {"type": "tool_use", "name": "artifacts", "input": {"id": "summary", "command": "create"}},
            {"type": "tool_result", "name": "artifacts", "content": [{"type": "text", "text": "OK"}],
             "is_error": False},
            {"type": "text", "text": "Done."}]},
    ]}]
    response = _post(api, document)
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    first, second = (Node.objects.get(pk=p.id) for p in node_path(head(conversation).pk, owner=conversation.owner_id))
    (question,) = first.sent
    assert question["text"] == "Summarise this.\n[file (pdf): paper.pdf]", "the file named once"
    assert [(f["name"], f["kind"]) for f in question["files"]] == [("paper.pdf.txt", "document")], \
        "what claude.ai read of it, as the importer's file"
    reasoning, text, call = first.received
    assert (reasoning["type"], reasoning["provider"]) == ("reasoning", "claude.ai")
    assert text["text"] == "Here is the summary:"
    assert second.sent[0]["call_id"] == call["id"] and second.sent[0]["content"] == "OK"
    assert second.received == [{"type": "text", "text": "Done."}]


def test_issue_15_chatbot_ui_prompt_becomes_the_instructions(api, user):
    document = _load(EXPORTS / "chatbot-ui" / "librechat-chatbotui-export-v4.json")
    response = _post(api, document)
    created = [Conversation.objects.get(pk=c["id"]) for c in response.json()["conversations"]]
    assert [c.instructions for c in created] == [c["prompt"] for c in document["history"]]


@pytest.mark.parametrize("count", [240, 1500])
def test_issue_15_t8_a_long_librechat_recursive_export_imports_though_it_nests_two_levels_a_message(api, user,
                                                                                                   count):
    """LibreChat's "recursive" export nests each reply in its message's `children`: a 240-message conversation
    nests about 480 levels deep, which the API's 32-level limit refused; 1,500 messages nest about 3,000, past what
    json's decoder may recurse (issue 28: 500 were refused). It imports, every message in order on one branch;
    what is stored still nests no deeper than a request may. Built by repeating the real file's messages
    (librechat-export-recursive-messagesTree.json, see SOURCES.md) down one chain."""
    document = _load(EXPORTS / "librechat" / "librechat-export-recursive-messagesTree.json")
    first = document["messagesTree"][0]
    asked, answered = dict(first), dict(first["children"][0])
    chain, parent = [], "00000000-0000-0000-0000-000000000000"
    for n in range(count):
        template = asked if n % 2 == 0 else answered
        chain.append({**{k: v for k, v in template.items() if k != "children"}, "messageId": f"m{n}",
                      "parentMessageId": parent, "text": f"message {n}", "createdAt": f"2024-04-09T14:{n // 60:02d}"
                      f":{n % 60:02d}.000Z"})
        parent = f"m{n}"
    for message, reply in zip(chain, chain[1:], strict=False):
        message["children"] = [reply]
    chain[-1]["children"] = []
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(20_000)  # json.dumps recurses a level at a time: only the test's writing of the file
    try:
        raw = json.dumps({**document, "messagesTree": [chain[0]]}).encode()
    finally:
        sys.setrecursionlimit(limit)
    response = _post(api, raw)
    assert response.status_code == 201, response.json()
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    assert [v.bubble.content for v in path_bubbles(conversation=conversation)] == [f"message {n}" for n in range(count)]


def test_issue_28_x1_a_claude_attachments_text_becomes_the_importers_file_sent_with_its_question(api, other_api,
                                                                                               user, settings):
    """claude.ai keeps the text it read of a pasted text or an uploaded document (`attachments[].extracted_content`,
    beside `file_name`, `file_size`, `file_type`: the shape claude.ai's web API serves and its export keeps; the
    real conversation here holds only an image, so the test adds a document to its first question). That text
    becomes a file of the importer's, on the question as the person sent it, and every later call sends it again
    (X1); an attachment with no text, and the image whose bytes no export holds, stay placeholders."""
    from files.models import StoredFile

    document = _load(EXPORTS / "claude" / "osteele-claude-web-api-conversation-2024.json")
    first = document["chat_messages"][0]
    settings.ARBOR_FILE_MAX_BYTES = 100  # bounded as an upload is: a longer text stays a placeholder
    first["attachments"] = [
        {"file_name": "plan.pdf", "file_size": 120, "file_type": "pdf",
         "extracted_content": "Budget: 40 euros. Venue: the old mill."},
        {"file_name": "empty.txt", "file_size": 0, "file_type": "txt", "extracted_content": ""},
        {"file_name": "long.txt", "file_size": 150, "file_type": "txt", "extracted_content": "x" * 150}]
    response = _post(api, document)
    assert response.status_code == 201, response.json()
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])

    (stored,) = StoredFile.objects.all()
    assert (stored.owner, stored.name, stored.kind, stored.status) == (user, "plan.pdf.txt", "document", "ready")
    assert stored.text == "Budget: 40 euros. Venue: the old mill."
    opening = Node.objects.get(pk=node_path(head(conversation).pk, owner=conversation.owner_id)[0].id)
    (question,) = [item for item in opening.sent if item["type"] == "user"]
    assert [ref["id"] for ref in question["files"]] == [stored.pk]
    assert "[file (pdf): plan.pdf]" in question["text"] and "[file (txt): empty.txt]" in question["text"]
    assert "[file (txt): long.txt]" in question["text"]
    assert "[file (image): image]" in question["text"], "an image the export holds no bytes of"
    (bubble,) = [v.bubble for v in path_bubbles(conversation=conversation) if v.bubble.role == "user"][:1]
    assert [f["id"] for f in bubble.data["files"]] == [stored.pk]
    seen = json.dumps(api.get(f"/api/conversations/{conversation.pk}/context/").json())
    assert "Budget: 40 euros. Venue: the old mill." in seen, "the next call sends the file's text"

    other_api.post("/api/conversations/import/", data=json.dumps(document), content_type="application/json")
    assert StoredFile.objects.count() == 2 and StoredFile.objects.exclude(owner=user).get().text == stored.text, \
        "another importer's is their own"


def test_issue_28_d5_a_claude_attachment_whose_text_begins_like_a_picture_stays_a_placeholder(api):
    """Text is typed by its bytes on upload: text that begins like a GIF or a ZIP would be kept as one (or refuse
    the whole import); it stays a placeholder, and the conversation imports."""
    from files.models import StoredFile

    document = _load(EXPORTS / "claude" / "osteele-claude-web-api-conversation-2024.json")
    document["chat_messages"][0]["attachments"] = [
        {"file_name": "odd.txt", "file_type": "txt", "extracted_content": "GIF89a then some words"},
        {"file_name": "zip.txt", "file_type": "txt", "extracted_content": "PK\u0003\u0004 and more"}]
    response = _post(api, document)
    assert response.status_code == 201, response.json()
    assert not StoredFile.objects.exists()
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    opening = Node.objects.get(pk=node_path(head(conversation).pk, owner=conversation.owner_id)[0].id)
    (question,) = [item for item in opening.sent if item["type"] == "user"]
    assert "files" not in question and "[file (txt): odd.txt]" in question["text"]
