"""The peers' import formats at their edges (issue 15, issue 25): what each format's messages become, as a person
sees them after `POST /api/conversations/import/` (nodes, bubbles, branches, tool rounds, thoughts), and the clear
400 that changes nothing for a file a format cannot read.

The files are shaped as the products export them:
- LibreChat: the export menu's JSON (`conversationId`, `messages` flat with `parentMessageId`, or nested in
  `children`); an agent's answer keeps its parts in `content` as LibreChat's client code writes them
  (`{"type": "think", "think": …}`, `{"type": "text", "text": …}`, `{"type": "tool_call", "tool_call": {id, name,
  args, output, type, progress}}`; the Assistants endpoint's text part is `{"text": {"value", "annotations"}}`),
  see danny-avila/LibreChat client tests (`groupToolCalls`, `outcome`) and tests/fixtures/exports/librechat/.
- Claude.ai: `conversations.json`, a list of `{uuid, name, chat_messages: [{uuid, sender, text, content, attachments,
  files}]}` (tests/fixtures/exports/claude/), content blocks `text`, `thinking`, `tool_use`, `tool_result`.
- chatbot-ui: `{version, history, folders, prompts}`, or its first version's bare list of conversations
  (tests/fixtures/exports/chatbot-ui/).
- Open WebUI: a list of `{id, title, chat: {history: {currentId, messages: {id: {parentId, childrenIds, role,
  content, timestamp, output?}}}}}` (tests/fixtures/exports/openwebui/, Open WebUI's `exportChats`); before
  `output`, reasoning was a `<details type="reasoning">` block at the start of `content`.
"""

from __future__ import annotations

import io
import json
import threading

import pytest
from django.core.management import call_command
from django.db import connection, connections

from conversations import items as it
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.screen import path_bubbles
from conversations.selectors import node_path
from conversations.transfer import arbor_tree
from tests.conversations.helpers import answer, ask, head

pytestmark = pytest.mark.django_db

URL = "/api/conversations/import/"
ZERO = "00000000-0000-0000-0000-000000000000"  # LibreChat's parent of a first message


# --- helpers -----------------------------------------------------------------------------------------------


def _post(api, document):
    raw = document if isinstance(document, bytes) else json.dumps(document).encode()
    return api.post(URL, data=raw, content_type="application/json")


def _counts() -> dict[str, int]:
    return {"conversations": Conversation.objects.count(), "nodes": Node.objects.count(),
            "bubbles": Bubble.objects.count(), "approvals": ToolApproval.objects.count()}


def _imported(api, document) -> list[Conversation]:
    response = _post(api, document)
    assert response.status_code == 201, response.content
    return [Conversation.objects.get(pk=c["id"]) for c in response.json()["conversations"]]


def _one(api, document) -> Conversation:
    (conversation,) = _imported(api, document)
    return conversation


def _refused(api, document, needle: str) -> str:
    """The file gets a 400 `import_refused` naming `needle`, and nothing is created."""
    before = _counts()
    response = _post(api, document)
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "import_refused", error
    assert needle in error["message"], error["message"]
    assert _counts() == before, "a refused file creates nothing"
    return error["message"]


def _screen(conversation: Conversation) -> list[tuple[str, str, int]]:
    """What a person sees on the head's path: each bubble's role and text, and how many versions its turn has."""
    return [(v.bubble.role, v.bubble.content, v.branch.count) for v in path_bubbles(conversation=conversation)]


def _path(conversation: Conversation) -> list[Node]:
    """The nodes from the root to the head (T5)."""
    return [Node.objects.get(pk=p.id) for p in node_path(head(conversation).pk, owner=conversation.owner_id)]


def _tools(conversation: Conversation) -> list[tuple[str, str, str, bool]]:
    """The tool bubbles on the head's path: name, arguments, the result shown, and whether it is an error."""
    return [(v.bubble.data["name"], v.bubble.data["arguments"], v.bubble.data["result"], v.bubble.data["is_error"])
            for v in path_bubbles(conversation=conversation) if v.bubble.role == "tool"]


# --- LibreChat ---------------------------------------------------------------------------------------------


def _lc_user(key, parent, text, minute, **fields):
    return {"messageId": key, "parentMessageId": parent, "conversationId": "lc-1", "sender": "User", "text": text,
            "isCreatedByUser": True, "createdAt": f"2025-03-01T10:{minute:02d}:00.000Z", **fields}


def _lc_agent(key, parent, content, minute, text="", **fields):
    return {"messageId": key, "parentMessageId": parent, "conversationId": "lc-1", "sender": "Weather agent",
            "endpoint": "agents", "text": text, "isCreatedByUser": False, "content": content,
            "createdAt": f"2025-03-01T10:{minute:02d}:30.000Z", **fields}


def _lc_file(*messages, title="Weather agent", key="messages"):
    return {"conversationId": "lc-1", "title": title, "endpoint": "agents", "recursive": key == "messagesTree",
            key: list(messages)}


def _call(call_id, name, args, output=None):
    tool_call = {"id": call_id, "name": name, "args": args, "type": "tool_call", "progress": 1}
    if output is not None:
        tool_call["output"] = output
    return {"type": "tool_call", "tool_call": tool_call}


def test_issue_15_t4_c4_a_librechat_agents_answer_is_its_thoughts_text_and_tool_rounds_in_order(api, user):
    """T4, C4: an agent's answer whose `content` holds a thought, text, two tool calls each with its output and a
    closing text becomes the rounds the agent ran: the thought a reasoning item (shown, never sent), each call on
    the node that made it, its output in the next node's sent items and on the call's bubble; the text between
    them where it came. The args may be text or an object (both are LibreChat's)."""
    conversation = _one(api, _lc_file(
        _lc_user("u1", ZERO, "Weather in Paris and Rome?", 0),
        _lc_agent("a1", "u1", [
            {"type": "think", "think": "Two cities: the tool twice."},
            {"type": "text", "text": "Checking Paris first."},
            _call("toolu_1", "get_weather", '{"city": "Paris"}', "Paris: 18C, rain"),
            _call("toolu_2", "get_weather", {"city": "Rome"}, "Rome: 22C, sun"),
            {"type": "text", "text": "Paris is 18C with rain; Rome is 22C and sunny."},
        ], 0),
    ))
    assert conversation.title == "Weather agent"
    first, second, third = _path(conversation)
    assert first.sent == [{"type": "user", "text": "Weather in Paris and Rome?"}]
    reasoning, text, paris = first.received
    assert (reasoning["type"], reasoning["provider"], reasoning["text"]) == (
        "reasoning", "librechat", "Two cities: the tool twice.")
    assert text == {"type": "text", "text": "Checking Paris first."}
    assert (paris["type"], paris["id"], paris["name"]) == ("tool_call", "toolu_1", "get_weather")
    assert second.sent == [{"type": "tool_result", "call_id": "toolu_1", "name": "get_weather",
                            "content": "Paris: 18C, rain", "is_error": False}]
    (rome,) = second.received
    assert (rome["id"], json.loads(rome["arguments"])) == ("toolu_2", {"city": "Rome"})
    assert third.sent[0]["call_id"] == "toolu_2" and third.sent[0]["content"] == "Rome: 22C, sun"
    assert third.received == [{"type": "text", "text": "Paris is 18C with rain; Rome is 22C and sunny."}]
    assert _screen(conversation) == [
        ("user", "Weather in Paris and Rome?", 1), ("assistant", "Checking Paris first.", 1),
        ("tool", "get_weather", 1), ("tool", "get_weather", 1),
        ("assistant", "Paris is 18C with rain; Rome is 22C and sunny.", 1)]
    assert _tools(conversation) == [("get_weather", '{"city": "Paris"}', "Paris: 18C, rain", False),
                                    ("get_weather", '{"city": "Rome"}', "Rome: 22C, sun", False)]
    seen = answer(ask(conversation, "And Berlin?"))  # the offline model's digest of what it was sent
    assert "assistant:Checking Paris first." in seen and "tool:Rome: 22C, sun" in seen
    assert "Two cities" not in seen, "C4: the thought is shown, never sent to a model"


def test_issue_15_t4_a_librechat_call_answered_then_the_next_question_share_one_node(api, user):
    """T4: an answer that ends on a tool call with its output, followed by the person's next question: the output
    and the question are the next node's sent items, in that order, and the next answer goes on that node."""
    conversation = _one(api, _lc_file(
        _lc_user("u1", ZERO, "Search for Arbor.", 0),
        _lc_agent("a1", "u1", [{"type": "text", "text": "Searching."},
                               _call("call_s", "web_search", {"query": "Arbor"}, "3 results")], 1),
        _lc_user("u2", "a1", "Summarise them.", 2),
        _lc_agent("a2", "u2", [{"type": "text", "text": "All three are about trees."}], 3),
    ))
    first, second = _path(conversation)
    assert [i["type"] for i in first.received] == ["text", "tool_call"]
    assert second.sent == [
        {"type": "tool_result", "call_id": "call_s", "name": "web_search", "content": "3 results", "is_error": False},
        {"type": "user", "text": "Summarise them."}]
    assert second.received == [{"type": "text", "text": "All three are about trees."}]
    assert [(role, text) for role, text, _ in _screen(conversation)] == [
        ("user", "Search for Arbor."), ("assistant", "Searching."), ("tool", "web_search"),
        ("user", "Summarise them."), ("assistant", "All three are about trees.")]


def test_issue_15_f1_a_librechat_call_with_no_output_is_shown_so_and_the_next_question_closes_it(api, user):
    """F1, C4: a tool call the file holds no output for (stopped while it ran) shows that on its bubble; when the
    person asked on, the call gets the result a stopped call gets, so the next call's context pairs every call
    with a result (T6). A call without id or name gets one; an empty `content` part list falls back to `text`."""
    conversation = _one(api, _lc_file(
        _lc_user("u1", ZERO, "Run the report.", 0),
        _lc_agent("a1", "u1", [{"type": "tool_call", "tool_call": {"args": None, "type": "tool_call"}}], 1),
        _lc_user("u2", "a1", "Never mind, just say hi.", 2),
        _lc_agent("a2", "u2", [], 3, text="Hi!"),
    ))
    first, second = _path(conversation)
    (call,) = first.received
    assert (call["id"], call["name"], call["arguments"]) == ("call_a1_0", "tool", "{}")
    assert second.sent == [
        {"type": "tool_result", "call_id": "call_a1_0", "name": "tool",
         "content": "not run: the conversation went on", "is_error": False},
        {"type": "user", "text": "Never mind, just say hi."}]
    assert second.received == [{"type": "text", "text": "Hi!"}]
    assert _tools(conversation) == [("tool", "{}", "not run: the conversation went on", False)]

    stopped = _one(api, _lc_file(_lc_user("u1", ZERO, "Run the report.", 0),
                                 _lc_agent("a1", "u1", [_call("c9", "report", "{}")], 1), title="Stopped"))
    assert _tools(stopped) == [("report", "{}", "(the file holds no output)", False)]


def test_issue_15_librechat_text_parts_of_every_shape_and_parts_that_show_nothing(api, user):
    """What a person saw of a LibreChat answer, whatever the part's shape: the Assistants endpoint's text part
    (`{"value", "annotations"}`) is its value; an error part, an empty text, an empty thought, a part that is no
    object and a tool_call part without its object show nothing, and an answer whose parts show nothing is its
    `text`."""
    conversation = _one(api, _lc_file(
        _lc_user("u1", ZERO, "Hello?", 0),
        _lc_agent("a1", "u1", [
            {"type": "text", "text": {"value": "Hello from the assistant.", "annotations": []}},
            {"type": "error", "error": "rate limited"},
            {"type": "text", "text": ""},
            {"type": "think", "think": ""},
            "stray",
            {"type": "tool_call", "tool_call": "not an object"},
            {"type": "text", "text": "Second paragraph."},
        ], 1),
        _lc_user("u2", "a1", "And now?", 2),
        _lc_agent("a2", "u2", [{"type": "error", "error": "timeout"}, {"type": "text", "text": ""}], 3,
                  text="Only the text field."),
    ))
    first, second = _path(conversation)
    assert first.received == [{"type": "text", "text": "Hello from the assistant."},
                              {"type": "text", "text": "Second paragraph."}]
    assert second.received == [{"type": "text", "text": "Only the text field."}]
    assert _screen(conversation) == [
        ("user", "Hello?", 1), ("assistant", "Hello from the assistant.\n\nSecond paragraph.", 1),
        ("user", "And now?", 1), ("assistant", "Only the text field.", 1)]


def test_issue_15_t8_a_librechat_recursive_export_keeps_regenerated_answers_as_siblings(api, user):
    """T8: the "recursive" export nests replies in `children`; two answers to one question (a regeneration) are
    sibling turns, and the newest reply's branch is the head, since the file does not say which was shown."""
    regenerated = _lc_agent("a2", "u1", [{"type": "text", "text": "Second try: 4."}], 5, children=[])
    first_try = _lc_agent("a1", "u1", [{"type": "text", "text": "First try: four."}], 1, children=[])
    question = _lc_user("u1", ZERO, "What is 2+2?", 0, children=[first_try, regenerated])
    conversation = _one(api, _lc_file(question, key="messagesTree"))
    assert _screen(conversation) == [("user", "What is 2+2?", 2), ("assistant", "Second try: 4.", 2)]
    assert Node.objects.filter(conversation=conversation).count() == 2


def test_issue_15_t8_a_librechat_answer_nobody_asked_on_keeps_a_later_question_on_its_own_branch(api, user):
    """T8: a question asked below an answer that came back empty (a stopped regeneration) while another answer to
    the same question exists: the later question hangs on a branch that repeats the first question without the
    other answer, never below that answer (the context it was asked in did not hold it)."""
    conversation = _one(api, _lc_file(
        _lc_user("u1", ZERO, "Name a tree.", 0),
        _lc_agent("a1", "u1", [{"type": "text", "text": "An oak."}], 1),
        _lc_agent("a2", "u1", [], 2),  # regenerated, stopped before a word came
        _lc_user("u2", "a2", "Just name one, please.", 3),
    ))
    assert _screen(conversation) == [("user", "Name a tree.", 2), ("user", "Just name one, please.", 1)]
    root, question = _path(conversation)
    assert (root.sent, root.received) == ([{"type": "user", "text": "Name a tree."}], [])
    assert question.sent == [{"type": "user", "text": "Just name one, please."}]
    oak = Node.objects.get(conversation=conversation, parent=None, received=[{"type": "text", "text": "An oak."}])
    assert oak.pk != root.pk and not Node.objects.filter(parent=oak).exists()


def test_issue_15_d5_librechat_entries_it_cannot_read_are_skipped_and_named(api, user):
    """D5: in a file of several conversations, an entry that is no object and one with neither `messages` nor
    `messagesTree` are skipped and named; the readable one imports."""
    response = _post(api, [_lc_file(_lc_user("u1", ZERO, "hi", 0), _lc_agent("a1", "u1", [], 1, text="hello")),
                           "not a conversation", {"conversationId": "lc-3", "title": "no messages"}])
    assert response.status_code == 201, response.content
    assert response.json()["skipped"] == [
        {"index": 1, "error": "conversations[1]: not a LibreChat conversation."},
        {"index": 2, "error": "conversations[2].messages: expected a list."}]
    (created,) = response.json()["conversations"]
    assert _screen(Conversation.objects.get(pk=created["id"])) == [("user", "hi", 1), ("assistant", "hello", 1)]


@pytest.mark.parametrize(("document", "needle"), [
    pytest.param({"conversationId": "lc", "messages": {"m1": {}}}, "conversations[0].messages: expected a list.",
                 id="messages-an-object"),
    pytest.param({"conversationId": "lc", "messages": [], "messagesTree": None},
                 "conversations[0].messagesTree: expected a list.", id="messagesTree-null"),
    pytest.param({"conversationId": "lc", "messages": [{"text": "hi", "isCreatedByUser": True}]},
                 "a message without a messageId", id="no-messageId"),
    pytest.param({"conversationId": "lc", "messages": [{"messageId": 7, "text": "hi"}]},
                 "a message without a messageId", id="messageId-a-number"),
    pytest.param({"conversationId": "lc", "messagesTree": [
        {"messageId": "m1", "text": "hi", "isCreatedByUser": True, "children": "m2"}]},
        "a message without a messageId", id="children-text"),
    pytest.param({"conversationId": "lc", "messagesTree": [
        {"messageId": "m1", "text": "hi", "isCreatedByUser": True, "children": [{"text": "reply"}]}]},
        "a message without a messageId", id="child-without-id"),
    pytest.param({"conversationId": "lc", "messages": [
        {"messageId": "m1", "parentMessageId": "m2", "text": "a", "isCreatedByUser": True},
        {"messageId": "m2", "parentMessageId": "m1", "text": "b"}]},
        "not reachable from a root (a cycle)", id="cycle"),
])
def test_issue_25_d5_a_librechat_file_it_cannot_read_is_refused_whole_and_creates_nothing(api, user, document,
                                                                                           needle):
    """D5: a LibreChat conversation whose messages are not a list, whose message has no text id, or whose parent
    links go round in a circle gets a 400 naming the place, and nothing is created."""
    message = _refused(api, document, needle)
    assert message.startswith("Nothing in this LibreChat file could be imported: conversations[0]")


# --- Claude.ai ---------------------------------------------------------------------------------------------


def _human(uuid, text, **fields):
    return {"uuid": uuid, "sender": "human", "text": text, "content": [{"type": "text", "text": text}],
            "attachments": [], "files": [], "created_at": "2025-06-01T10:00:00Z", **fields}


def _assistant(uuid, content, **fields):
    return {"uuid": uuid, "sender": "assistant", "text": "", "content": content, "attachments": [], "files": [],
            "created_at": "2025-06-01T10:00:05Z", **fields}


def _claude(*messages, name="Claude chat", uuid="cl-1", **fields):
    return {"uuid": uuid, "name": name, "created_at": "2025-06-01T10:00:00Z", "chat_messages": list(messages),
            **fields}


def test_issue_15_t4_a_claude_tool_result_given_as_text_and_as_an_error_is_the_next_nodes_output(api, user):
    """T4: claude.ai's tool_result content may be plain text (not a list of blocks), and may be an error: the
    output is the next node's sent item, with its error flag, and the call's bubble shows it as an error. A call
    without a name or an id gets one; a result with nothing in it says so."""
    conversation = _one(api, [_claude(
        _human("h1", "Look it up."),
        _assistant("a1", [
            {"type": "tool_use", "name": "web_search", "input": {"query": "arbor"}},
            {"type": "tool_result", "name": "web_search", "content": "503 Service Unavailable", "is_error": True},
            {"type": "tool_use", "input": {}},
            {"type": "tool_result", "content": []},
            {"type": "text", "text": "The search failed."},
        ]),
    )])
    first, second, third = _path(conversation)
    (search,) = first.received
    assert (search["id"], search["name"], json.loads(search["arguments"])) == (
        "call_a1_0", "web_search", {"query": "arbor"})
    assert second.sent == [{"type": "tool_result", "call_id": "call_a1_0", "name": "web_search",
                            "content": "503 Service Unavailable", "is_error": True}]
    assert third.sent[0]["content"] == "(no output)"
    assert _tools(conversation) == [("web_search", '{"query": "arbor"}', "503 Service Unavailable", True),
                                    ("tool", "{}", "(no output)", False)]
    assert _screen(conversation)[-1] == ("assistant", "The search failed.", 1)


def test_issue_15_claude_older_answers_without_blocks_and_senders_it_does_not_know(api, user):
    """An older export's answer has no `content` blocks, only `text`: that is the answer. A message from a sender
    that is neither the person nor the assistant shows nothing; an attachment without a file name is no file; a
    tool_result with no call before it is dropped (it answers nothing)."""
    conversation = _one(api, [_claude(
        {"uuid": "h1", "sender": "human", "text": "Old question", "content": [],
         "attachments": [{"file_name": "", "extracted_content": "pasted"}, "junk"],
         "files": [{"file_name": "notes.txt"}]},
        {"uuid": "s1", "sender": "system", "text": "internal", "content": [{"type": "text", "text": "internal"}]},
        {"uuid": "a1", "sender": "assistant", "text": "Old answer", "content": []},
        _human("h2", "Next"),
        _assistant("a2", [{"type": "tool_result", "content": "orphan"}, {"type": "text", "text": "Done."}]),
    )])
    assert _screen(conversation) == [("user", "Old question\n[file: notes.txt]", 1), ("assistant", "Old answer", 1),
                                     ("user", "Next", 1), ("assistant", "Done.", 1)]
    assert "orphan" not in json.dumps([n.sent + n.received for n in _path(conversation)])


def test_issue_15_claude_a_viewers_wrapper_is_read_and_an_entry_without_messages_is_skipped(api, user):
    """A Claude viewer's file wraps the export's list in `{"conversations": [...]}`: it reads the same. An entry of
    the list without `chat_messages` (a project, say) is skipped and named; the conversations import."""
    response = _post(api, {"conversations": [
        _claude(_human("h1", "Hi"), _assistant("a1", [{"type": "text", "text": "Hello!"}])),
        {"uuid": "p1", "name": "A project", "docs": []},
    ]})
    assert response.status_code == 201, response.content
    assert response.json()["skipped"] == [
        {"index": 1, "error": "conversations[1]: not a Claude conversation (it has no chat_messages)."}]
    (created,) = response.json()["conversations"]
    conversation = Conversation.objects.get(pk=created["id"])
    assert conversation.title == "Claude chat"
    assert _screen(conversation) == [("user", "Hi", 1), ("assistant", "Hello!", 1)]


def test_issue_25_d5_a_claude_message_that_is_no_object_refuses_the_file_and_creates_nothing(api, user):
    """D5: a chat message that is not an object gets a 400 naming it, and nothing is created."""
    _refused(api, [_claude(_human("h1", "Hi"), "oops")], "conversations[0].chat_messages[1]: expected an object.")


def test_issue_15_c4_a_claude_human_who_asks_on_while_a_call_waits_closes_it(api, user):
    """F1, C4: a tool_use with no tool_result, followed by the person's next question (linked by
    `parent_message_uuid`, as claude.ai's web app serves a conversation): the call gets the result a stopped call
    gets, on the next node, before the question; the current leaf is the head."""
    conversation = _one(api, [_claude(
        _human("h1", "Draw a chart.", parent_message_uuid=ZERO),
        _assistant("a1", [{"type": "text", "text": "Drawing."},
                          {"type": "tool_use", "id": "toolu_9", "name": "repl", "input": {"code": "plot()"}}],
                   parent_message_uuid="h1"),
        _human("h2", "Stop, a table is fine.", parent_message_uuid="a1"),
        _assistant("a2", [{"type": "text", "text": "| a | b |"}], parent_message_uuid="h2"),
        current_leaf_message_uuid="a2")])
    first, second = _path(conversation)
    assert second.sent == [{"type": "tool_result", "call_id": "toolu_9", "name": "repl",
                            "content": "not run: the conversation went on", "is_error": False},
                           {"type": "user", "text": "Stop, a table is fine."}]
    assert [role for role, _, _ in _screen(conversation)] == ["user", "assistant", "tool", "user", "assistant"]


# --- chatbot-ui --------------------------------------------------------------------------------------------


def _chatbotui_conversation(name, *messages, prompt="You are terse."):
    return {"id": f"id-{name}", "name": name, "messages": list(messages),
            "model": {"id": "gpt-4", "name": "GPT-4", "maxLength": 24000, "tokenLimit": 8000},
            "prompt": prompt, "temperature": 1, "folderId": None}


def test_issue_15_chatbot_ui_first_versions_bare_list_imports_and_a_system_message_shows_nothing(api, user):
    """chatbot-ui's first export was the bare list of conversations: it imports, each with its `prompt` as the
    instructions; a `system` message is no bubble; an entry that is not a conversation is skipped and named."""
    response = _post(api, [
        _chatbotui_conversation("Greeting", {"role": "system", "content": "ignored"},
                                {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."},
                                {"role": "user", "content": ""}),
        {"id": "id-broken", "messages": [{"role": "user", "content": "no name"}]},
    ])
    assert response.status_code == 201, response.content
    assert response.json()["skipped"] == [
        {"index": 1, "error": "history[1]: not a chatbot-ui conversation (name and messages)."}]
    conversation = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    assert (conversation.title, conversation.instructions) == ("Greeting", "You are terse.")
    assert _screen(conversation) == [("user", "Hi", 1), ("assistant", "Hello.", 1)]


def test_issue_25_d5_a_chatbot_ui_export_with_no_readable_conversation_is_refused(api, user):
    """D5: an export whose only entry has messages that are not objects with a role gets a 400 naming it, and
    nothing is created."""
    _refused(api, {"version": 4, "history": [{"name": "x", "messages": ["hello"]}], "folders": [], "prompts": []},
             "history[0]: not a chatbot-ui conversation")


# --- Open WebUI --------------------------------------------------------------------------------------------


def _owi_message(key, parent, role, content, timestamp, **fields):
    return {"id": key, "parentId": parent, "childrenIds": [], "role": role, "content": content,
            "timestamp": timestamp, **fields}


def _owi_chat(current, *messages, title="Open WebUI chat", key="chat-1"):
    by_id = {m["id"]: m for m in messages}
    for message in messages:
        if message.get("parentId") in by_id:
            by_id[message["parentId"]]["childrenIds"].append(message["id"])
    return {"id": key, "user_id": "u1", "title": title,
            "chat": {"title": title, "models": ["gpt-4o"], "history": {"currentId": current, "messages": by_id}},
            "created_at": 1700000000, "updated_at": 1700000100, "share_id": None, "archived": False}


def test_issue_15_c4_an_older_open_webui_answer_keeps_its_details_reasoning_and_drops_the_tool_block(api, user):
    """C4: before `output`, Open WebUI kept an answer's reasoning as a `<details type="reasoning">` block at the
    start of `content` (HTML-escaped, quoted with `>`): it becomes a reasoning item, shown and never sent; a
    `tool_calls` block whose result is in its attributes shows nothing; the rest is the answer. A `system`
    message is no bubble."""
    content = ('<details type="reasoning" done="true" duration="3">\n<summary>Thought for 3 seconds</summary>\n'
               '&gt; 15 * 17 = 150 + 105\n&gt; = 255\n</details>\n'
               '<details type="tool_calls" done="true" id="c1" name="calc" arguments="{}" result="255">\n'
               '<summary>Tool Executed</summary>\n</details>\nThe answer is 255.')
    conversation = _one(api, [_owi_chat(
        "m3",
        _owi_message("m0", None, "system", "You are a calculator.", 1700000000),
        _owi_message("m1", "m0", "user", "What is 15 * 17?", 1700000001),
        _owi_message("m3", "m1", "assistant", content, 1700000005, model="deepseek-r1"),
    )])
    (node,) = _path(conversation)
    assert node.received == [{"type": "reasoning", "provider": "openwebui", "text": "> 15 * 17 = 150 + 105\n> = 255",
                              "data": None}, {"type": "text", "text": "The answer is 255."}]
    assert _screen(conversation) == [("user", "What is 15 * 17?", 1), ("assistant", "The answer is 255.", 1)]


def test_issue_15_t4_open_webui_parallel_calls_their_outputs_and_output_items_it_does_not_know(api, user):
    """T4: an answer's `output` with two function calls, then both outputs, then its text: both calls are one
    node's, both outputs the next node's sent items (the results of one round), and each call's bubble shows its
    own output. An output of a call not in this answer is shown as text (a person saw it); an empty one, an item
    of an unknown type and an item that is no object show nothing."""
    conversation = _one(api, [_owi_chat(
        "m2",
        _owi_message("m1", None, "user", "Weather in Paris, time in Rome?", 1700000001),
        _owi_message("m2", "m1", "assistant", "", 1700000009, output=[
            {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "get_weather",
             "arguments": '{"city":"Paris"}', "status": "completed"},
            {"type": "function_call", "id": "fc_2", "call_id": "c2", "name": "get_time",
             "arguments": '{"city":"Rome"}', "status": "completed"},
            {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "18C"}],
             "status": "completed"},
            {"type": "function_call_output", "call_id": "c2", "output": "10:00", "status": "completed"},
            {"type": "function_call_output", "call_id": "elsewhere", "output": "shown anyway"},
            {"type": "function_call_output", "call_id": "elsewhere", "output": ""},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            "stray",
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "18C; 10:00."}]},
        ]),
    )])
    first, second = _path(conversation)
    assert [(i["type"], i.get("id")) for i in first.received] == [("tool_call", "c1"), ("tool_call", "c2")]
    assert second.sent == [
        {"type": "tool_result", "call_id": "c1", "name": "get_weather", "content": "18C", "is_error": False},
        {"type": "tool_result", "call_id": "c2", "name": "get_time", "content": "10:00", "is_error": False}]
    assert second.received == [{"type": "text", "text": "shown anyway"}, {"type": "text", "text": "18C; 10:00."}]
    assert _tools(conversation) == [("get_weather", '{"city":"Paris"}', "18C", False),
                                    ("get_time", '{"city":"Rome"}', "10:00", False)]


def test_issue_15_open_webui_skips_an_entry_that_is_no_chat(api, user):
    """D5: in a list of chats, an entry that is no object is skipped and named; the chat imports."""
    response = _post(api, [_owi_chat("m1", _owi_message("m1", None, "user", "hi", 1)), 42])
    assert response.status_code == 201, response.content
    assert response.json()["skipped"] == [{"index": 1, "error": "chats[1]: not an Open WebUI chat."}]


@pytest.mark.parametrize(("document", "needle"), [
    pytest.param({"chat": {"title": "t", "history": {"currentId": None, "messages": []}}},
                 "chats[0].chat.history.messages: expected an object.", id="messages-a-list"),
    pytest.param({"chat": {"title": "t", "history": "none"}}, "chats[0].chat.history.messages: expected an object.",
                 id="history-text"),
    pytest.param({"chat": {"history": {"currentId": "m1", "messages": {"m1": "hello"}}}},
                 "chats[0].chat.history.messages['m1']: expected an object.", id="message-text"),
])
def test_issue_25_d5_an_open_webui_chat_it_cannot_read_is_refused_and_creates_nothing(api, user, document, needle):
    """D5: a chat whose messages are not an object of objects gets a 400 naming the place; nothing is created."""
    _refused(api, document, needle)


# --- import_check ------------------------------------------------------------------------------------------


def test_issue_15_import_check_names_what_a_chatgpt_round_trip_cannot_keep_a_failed_call(conversation, tmp_path):
    """F1: ChatGPT's format has no failed calls, so a conversation whose last call failed (its error bubble on the
    head's path) does not come back the same through it; `import_check` says so for the ChatGPT round trip, and
    the Arbor JSON round trip, which keeps statuses, loses nothing. Everything is rolled back."""
    ask(conversation, "hello")
    ask(conversation, "again #fail")
    assert head(conversation).status == Node.Status.FAILED
    assert "error" in [role for role, _, _ in _screen(conversation)]
    path = tmp_path / "failed.json"
    path.write_text(json.dumps(arbor_tree.export_tree(conversation)))
    before = _counts()
    out = io.StringIO()
    call_command("import_check", str(path), stdout=out)
    (row,) = out.getvalue().splitlines()[2:]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "failed.json" and cells[7] == "none"
    assert "head path shows other bubbles" in cells[8]
    assert _counts() == before


# --- exports of what was imported (issue 13) ---------------------------------------------------------------


def _export(api, conversation: Conversation, export_format: str):
    response = api.get(f"/api/conversations/{conversation.pk}/export/?format={export_format}")
    assert response.status_code == 200
    return response


def test_issue_13_t8_a_long_imported_conversation_exports_in_parts_and_imports_back_the_same(api, user):
    """Issue 13, T8: a conversation longer than one part of an export's body (64 KiB) is handed on in several parts
    that make one valid file, in Arbor's JSON and in ChatGPT's format, and each imports back showing the same."""
    answers = [f"answer {n}: " + "lorem ipsum " * 1000 for n in range(8)]  # 12,000 characters each
    original = _one(api, {"version": 4, "history": [_chatbotui_conversation("Long", *[
        m for n, answer in enumerate(answers)
        for m in ({"role": "user", "content": f"question {n}"}, {"role": "assistant", "content": answer})])],
        "folders": [], "prompts": []})
    shown = _screen(original)
    assert len(shown) == 16
    for export_format in ("json", "chatgpt"):
        parts = list(_export(api, original, export_format).streaming_content)
        assert len(parts) > 1, "handed on in parts, not whole"
        assert _screen(_one(api, b"".join(parts))) == shown


@pytest.mark.django_db(transaction=True)
def test_issue_13_a_chatgpt_export_on_postgresql_links_and_writes_from_one_snapshot(api, user):
    """Issue 13: ChatGPT's export reads the tree twice (once to link the messages, once to write them); on
    PostgreSQL, outside any transaction as in production, both passes read one snapshot, so an answer that
    completes while the export streams is not half in it: the file shows the question as it was when the export
    began, every child it names is in it, and it imports."""
    if connection.vendor != "postgresql":
        pytest.skip("a snapshot across queries is PostgreSQL's; SQLite exports read as they go")
    conversation = _one(api, {"version": 4, "history": [_chatbotui_conversation(
        "Snapshot", {"role": "user", "content": "first"}, {"role": "assistant", "content": "one"})],
        "folders": [], "prompts": []})
    pending = Node.objects.create(parent_id=conversation.head_id, conversation=conversation,
                                  sent=[it.user("a question under way")])  # T3: pending, the head not on it yet
    parts = iter(_export(api, conversation, "chatgpt").streaming_content)
    text = next(parts)  # the links are made: every node has been read once

    def complete_meanwhile():
        try:
            Node.objects.filter(pk=pending.pk).update(status="succeeded", received=[it.text("the late answer")])
        finally:
            connections.close_all()

    writer = threading.Thread(target=complete_meanwhile)
    writer.start()
    writer.join()
    (entry,) = json.loads(text + b"".join(parts))
    mapping = entry["mapping"]
    texts = [p for m in mapping.values() if m["message"] for p in m["message"]["content"].get("parts", [])]
    assert "a question under way" in texts and "the late answer" not in texts
    assert all(child in mapping for m in mapping.values() for child in m["children"])
    assert Node.objects.get(pk=pending.pk).received == [it.text("the late answer")]


# --- Arbor's own file: where a star may rest ---------------------------------------------------------------


def _arbor_node(key, parent=None, **fields):
    return {"id": key, "parent": parent, "kind": "turn", "status": "succeeded",
            "sent": [{"type": "user", "text": f"q{key}"}], "received": [{"type": "text", "text": f"a{key}"}], **fields}


def _arbor_file(*nodes, head):
    return {"format": "arbor.tree", "version": 1,
            "conversation": {"title": "starred", "model": "", "instructions": "", "head": head},
            "nodes": list(nodes), "bubbles": [], "approvals": []}


@pytest.mark.parametrize(("nodes", "needle"), [
    pytest.param([_arbor_node(1, starred=True), _arbor_node(2, 1, starred=True)],
                 "nodes: 2 nodes are starred; a conversation has one star at most.", id="two-stars"),
    pytest.param([_arbor_node(1), _arbor_node(2, 1, status="failed", failure_reason="context_overflow", starred=True)],
                 "nodes[1].starred: only a turn the conversation can open on is starred.", id="overflowed"),
    pytest.param([_arbor_node(1), _arbor_node(2, 1, kind="playbook", starred=True)],
                 "nodes[1].starred: only a turn", id="playbook-draft"),
])
def test_issue_25_f2_p2_an_arbor_file_starring_where_no_conversation_opens_is_refused(api, user, nodes, needle):
    """F2, P2: a conversation opens on its starred branch, so a file may star one node only, and only one the
    conversation can open on: not a call that overflowed (F2 leaves the head before it), not a playbook draft
    (P2: drafts never enter the conversation). Refused with a 400, nothing created."""
    _refused(api, _arbor_file(*nodes, head=1), needle)


def test_issue_25_an_arbor_file_starring_one_turn_opens_on_it(api, user):
    """The one starred turn of a file is starred after the import (the branch the conversation opens on)."""
    conversation = _one(api, _arbor_file(_arbor_node(1), _arbor_node(2, 1, starred=True), _arbor_node(3, 1), head=3))
    assert list(Node.objects.filter(conversation=conversation, starred=True).values_list("sent", flat=True)) == [
        [{"type": "user", "text": "q2"}]]


# --- issue 26: found while covering the readers, fixed ------------------------------------------------------


_TYPED_WRONG = [
    pytest.param({"conversationId": "lc", "messagesTree": [
        {"messageId": "m1", "text": "hi", "isCreatedByUser": True, "children": 5}]}, id="librechat-children-number"),
    pytest.param({"conversationId": "lc", "messages": [
        {"messageId": "m1", "parentMessageId": ["m0"], "text": "hi", "isCreatedByUser": True}]},
        id="librechat-parent-list"),
    pytest.param({"chat": {"history": {"currentId": "a", "messages": {
        "a": {"role": "user", "content": "hi", "parentId": None, "files": 5}}}}}, id="openwebui-files-number"),
    pytest.param({"chat": {"history": {"currentId": ["a"], "messages": {
        "a": {"role": "user", "content": "hi", "parentId": None}}}}}, id="openwebui-currentId-list"),
    pytest.param({"chat": {"history": {"currentId": "b", "messages": {
        "a": {"role": "user", "content": "hi", "parentId": None, "timestamp": 1700000000},
        "b": {"role": "assistant", "content": "yo", "parentId": "a", "timestamp": "2024-01-01"}}}}},
        id="openwebui-timestamps-mixed"),
    pytest.param([_claude({"uuid": "h1", "sender": "human", "text": "hi", "content": 5})], id="claude-content-number"),
    pytest.param([_claude(_human("h1", "hi"), _assistant("a1", [{"type": "text", "text": 5}]))],
                 id="claude-text-number"),
    pytest.param([_claude(_human("h1", "hi", attachments=5))], id="claude-attachments-number"),
]


@pytest.mark.parametrize("document", _TYPED_WRONG)
def test_issue_25_d5_a_peers_field_of_the_wrong_type_is_refused_with_a_400_not_a_server_error(api, user, document):
    """D5: a field of the wrong type (a number where a list goes, a list where an id goes, a number where text
    goes, timestamps of two kinds) gets a 400 naming what is wrong, and nothing is created."""
    before = _counts()
    response = _post(api, document)
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "import_refused"
    assert _counts() == before


def test_issue_15_t4_parallel_calls_survive_a_round_trip_through_chatgpts_format(api, user):
    """T4: a round with two tool calls (Open WebUI's `output`, or any model that calls two tools at once),
    exported as ChatGPT's conversations.json and imported back, shows each call with its own output and no
    output as the assistant's text."""
    original = _one(api, [_owi_chat(
        "m2",
        _owi_message("m1", None, "user", "Weather in Paris, time in Rome?", 1700000001),
        _owi_message("m2", "m1", "assistant", "", 1700000009, output=[
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call", "call_id": "c2", "name": "get_time", "arguments": '{"city":"Rome"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "18C"},
            {"type": "function_call_output", "call_id": "c2", "output": "10:00"},
            {"type": "message", "content": [{"type": "output_text", "text": "18C; 10:00."}]}]))])
    copy = _one(api, b"".join(_export(api, original, "chatgpt").streaming_content))
    assert _tools(copy) == _tools(original)
    assert _screen(copy) == _screen(original)
