"""Every refusal of the importer (D5): a malformed or hostile file gets a clear error naming what is wrong, and
creates nothing (no conversation, node, bubble or approval). Also the few accepting branches the round trips in
`test_transfer.py` do not reach: ChatGPT's odd shapes, naive dates, a compaction root listed before its original,
and the Markdown and ChatGPT exports of a path with tools, a failure and a compaction (T8, F1, C2, C3)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
from django.core import mail

from config.errors import TooLarge
from conversations import items as it
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.screen import path_bubbles
from conversations.transfer import arbor_tree, chatgpt, importing, markdown
from conversations.transfer.plan import ImportRefused
from conversations.turns.detached import run_here
from conversations.turns.start import turn_compact, turn_decide
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db

URL = "/api/conversations/import/"
LONG = "x" * 51  # over the content limit the tests set (ARBOR_MAX_CONTENT_CHARS = 50)


# --- helpers -----------------------------------------------------------------------------------------------


def _counts() -> dict[str, int]:
    return {"conversations": Conversation.objects.count(), "nodes": Node.objects.count(),
            "bubbles": Bubble.objects.count(), "approvals": ToolApproval.objects.count()}


def _post(api, body):
    data = body if isinstance(body, bytes) else json.dumps(body)
    return api.post(URL, data=data, content_type="application/json")


def _assert_refused(api, body, needle: str, *, status: int = 400, code: str = "import_refused") -> None:
    """The file gets `status` with `code` and a message containing `needle`, and nothing is created."""
    before = _counts()
    response = _post(api, body)
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code, error
    assert needle in error["message"], error["message"]
    assert _counts() == before, "a refused file creates nothing"


def _node(key, parent=None, **fields):
    """A valid succeeded turn node of Arbor's file."""
    return {"id": key, "parent": parent, "kind": "turn", "status": "succeeded",
            "sent": [{"type": "user", "text": "q"}], "received": [{"type": "text", "text": "a"}], **fields}


def _root(key, original, **fields):
    """A valid compaction root: parentless, pointing at its original (C2, C3)."""
    return _node(key, **{"kind": "compaction", "compacted_from": original, "sent": [{"type": "summary", "text": "s"}],
                          "received": [], **fields})


def _tree(*nodes, head=1, bubbles=(), approvals=(), **conversation):
    """Arbor's file: one turn node (id 1) unless `nodes` are given."""
    return {"format": "arbor.tree", "version": 1,
            "conversation": {"title": "imported", "model": "", "instructions": "", "head": head, **conversation},
            "nodes": list(nodes or [_node(1)]), "bubbles": list(bubbles), "approvals": list(approvals)}


def _bubble(**fields):
    return {"node": 1, "role": "user", "content": "q", "data": {}, **fields}


RESULT = {"type": "tool_result", "call_id": "call_1", "name": "send_email", "content": "sent", "is_error": False}


def _approval(**fields):
    return {"node": 1, "call_id": "call_1", "approved": True, "result": None, **fields}


def _message(role, *parts):
    return {"author": {"role": role}, "content": {"content_type": "text", "parts": list(parts)}}


def _entry(parent, message=None):
    return {"parent": parent, "message": message}


def _chat(title="chat", **mapping):
    """One conversation of ChatGPT's conversations.json: a root entry and `mapping`'s entries."""
    return {"title": title, "mapping": {"root": _entry(None), **mapping}}


@pytest.fixture
def small_limits(settings):
    settings.ARBOR_MAX_CONTENT_CHARS = 50
    return settings


# --- the baseline ------------------------------------------------------------------------------------------


def test_the_valid_baseline_file_imports_so_each_refusal_below_is_its_mutation(api):
    document = _tree(_node(1), _node(2, parent=1), head=2, bubbles=[_bubble(), _bubble(node=2, role="assistant")],
                     approvals=[_approval(node=2, result=RESULT)])
    response = _post(api, document)
    assert response.status_code == 201, response.json()
    assert _counts() == {"conversations": 1, "nodes": 2, "bubbles": 2, "approvals": 1}


# --- Arbor's file: fields, references and shapes (D5, C2, C3) ------------------------------------------------


@pytest.mark.parametrize(("document", "needle"), [
    # the file and its conversation
    pytest.param({**_tree(), "version": 2}, "Unsupported version 2", id="wrong-version"),
    pytest.param({k: v for k, v in _tree().items() if k != "version"}, "Unsupported version None", id="no-version"),
    pytest.param({**_tree(), "conversation": []}, "`conversation` must be an object", id="conversation-a-list"),
    pytest.param({**_tree(), "nodes": {"1": _node(1)}}, "`nodes` a list", id="nodes-an-object"),
    pytest.param(_tree(title=7), "conversation.title: expected text", id="title-not-text"),
    pytest.param(_tree(title="t" * 201), "conversation.title: longer than 200", id="title-too-long"),
    pytest.param(_tree(model=["gpt"]), "conversation.model: expected text", id="model-not-text"),
    pytest.param(_tree(instructions="i" * 20001), "conversation.instructions: longer than 20000",
                 id="instructions-too-long"),
    # what is stored nests no deeper than a request may, however deep the file (LibreChat's) may nest
    pytest.param(_tree(_node(1, received=[{"type": "reasoning", "provider": "x", "text": "t",
                                           "data": json.loads("[" * 33 + "]" * 33)}])),
                 "nodes[0].received[0]: nests deeper than 32 levels", id="item-nesting-34"),
    pytest.param(_tree(bubbles=[_bubble(data=json.loads('{"a": ' * 33 + "1" + "}" * 33))]),
                 "nests deeper than 32 levels", id="bubble-data-nesting-33"),
    # a node's id, status, failure, usage and tokens
    pytest.param(_tree("not a node"), "nodes[0]: each node needs an `id`", id="node-not-an-object"),
    pytest.param(_tree({"parent": None, "kind": "turn", "status": "succeeded"}), "nodes[0]: each node needs an `id`",
                 id="node-without-id"),
    pytest.param(_tree(_node(True)), "nodes[0]: each node needs an `id`", id="bool-id"),
    pytest.param(_tree(_node(1.5)), "nodes[0]: each node needs an `id`", id="float-id"),
    pytest.param(_tree(_node(1), _node(1)), "nodes[1]: the id 1 is used twice", id="duplicate-ids"),
    pytest.param(_tree(_node(1, status="done")), "nodes[0].status: 'done' is not one of", id="bad-status"),
    pytest.param(_tree(_node(1, status=None)), "nodes[0].status: None is not one of", id="no-status"),
    pytest.param(_tree(_node(1, status="failed")), "nodes[0]: a failure reason goes with status failed",
                 id="failed-without-reason"),
    pytest.param(_tree(_node(1, failure_reason="timeout")), "nodes[0]: a failure reason goes with status failed",
                 id="reason-without-failed-status"),
    pytest.param(_tree(_node(1, status="failed", failure_reason="boom")),
                 "nodes[0].failure_reason: 'boom' is not one of", id="unknown-failure-reason"),
    pytest.param(_tree(_node(1, usage=[1, 2])), "nodes[0].usage: expected an object", id="usage-not-an-object"),
    pytest.param(_tree(_node(1, usage="lots")), "nodes[0].usage: expected an object", id="usage-text"),
    pytest.param(_tree(_node(1, tokens=-1)), "nodes[0].tokens: expected a whole number", id="negative-tokens"),
    pytest.param(_tree(_node(1, tokens=True)), "nodes[0].tokens: expected a whole number", id="bool-tokens"),
    pytest.param(_tree(_node(1, tokens="5")), "nodes[0].tokens: expected a whole number", id="text-tokens"),
    pytest.param(_tree(_node(1, kind="chat")), "nodes[0].kind: 'chat' is not one of", id="unknown-kind"),
    # a node's text fields and dates
    pytest.param(_tree(_node(1, failure_message=3)), "nodes[0].failure_message: expected text",
                 id="failure-message-not-text"),
    pytest.param(_tree(_node(1, provider="p" * 65)), "nodes[0].provider: longer than 64", id="provider-too-long"),
    pytest.param(_tree(_node(1, model="m" * 201)), "nodes[0].model: longer than 200", id="node-model-too-long"),
    pytest.param(_tree(_node(1, instructions=LONG)), "nodes[0].instructions: longer than 50",
                 id="node-instructions-too-long"),
    pytest.param(_tree(_node(1, failure_message=LONG, status="failed", failure_reason="timeout")),
                 "nodes[0].failure_message: longer than 50", id="failure-message-too-long"),
    pytest.param(_tree(_node(1, finished_at="yesterday")), "nodes[0].finished_at: not an ISO date-time",
                 id="bad-iso-date"),
    pytest.param(_tree(_node(1, finished_at=1700000000)), "nodes[0].finished_at: not an ISO date-time",
                 id="date-a-number"),
    # a node's items
    pytest.param(_tree(_node(1, sent="hello")), "nodes[0].sent: expected a list of items", id="sent-not-a-list"),
    pytest.param(_tree(_node(1, received={"type": "text"})), "nodes[0].received: expected a list of items",
                 id="received-an-object"),
    pytest.param(_tree(_node(1, sent=["hello"])), "nodes[0].sent[0]: not an item", id="item-not-an-object"),
    pytest.param(_tree(_node(1, sent=[{"type": "image", "url": "u"}])), "nodes[0].sent[0]: not an item",
                 id="unknown-item-type"),
    pytest.param(_tree(_node(1, sent=[{"text": "no type"}])), "nodes[0].sent[0]: not an item", id="item-without-type"),
    pytest.param(_tree(_node(1, sent=[{"type": "user"}])), "nodes[0].sent[0].text: missing, or not str",
                 id="item-missing-a-field"),
    pytest.param(_tree(_node(1, received=[{"type": "tool_call", "id": "c", "name": "n", "arguments": {}}])),
                 "nodes[0].received[0].arguments: missing, or not str", id="item-field-of-wrong-type"),
    pytest.param(_tree(_node(1, sent=[{"type": "tool_result", "call_id": "c", "name": "n", "content": "r",
                                       "is_error": "no"}])),
                 "nodes[0].sent[0].is_error: missing, or not bool", id="item-bool-field-not-bool"),
    pytest.param(_tree(_node(1, sent=[{"type": "user", "text": LONG}])), "nodes[0].sent[0].text: longer than 50",
                 id="over-long-item-text"),
    pytest.param(_tree(_node(1, received=[{"type": "reasoning", "provider": "p", "text": LONG}])),
                 "nodes[0].received[0].text: longer than 50", id="over-long-optional-item-text"),
    # references (dangling, or not a reference at all)
    pytest.param(_tree(_node(1, parent=9)), "node 1: its parent 9 is not in the file", id="dangling-parent"),
    pytest.param(_tree(_node(1), _node(2, parent=True)), "node 2: its parent True is not in the file",
                 id="bool-parent"),
    pytest.param(_tree(_node(1), _root(2, 9), head=2), "node 2: its compacted_from 9 is not in the file",
                 id="dangling-compacted-from"),
    pytest.param(_tree(_node(1), _root(2, 1, summary_call=9), head=2), "node 2: its summary_call 9 is not in the file",
                 id="dangling-summary-call"),
    # the shapes of C2 and C3
    pytest.param(_tree(_node(1), _node(2, parent=1, kind="compaction", compacted_from=1)),
                 "node 2: only a parentless compaction node points at an original",
                 id="non-root-compaction-with-original"),
    pytest.param(_tree(_node(1), _node(2, compacted_from=1)),
                 "node 2: only a parentless compaction node points at an original", id="turn-with-original"),
    pytest.param(_tree(_node(1, kind="compaction")),
                 "node 1: only a parentless compaction node points at an original", id="root-without-original"),
    pytest.param(_tree(_node(1), _node(2, parent=1, summary_call=1)),
                 "node 2: only a parentless compaction node points at an original", id="turn-with-summary-call"),
    pytest.param(_tree(_node(1, parent=2), _node(2, parent=1)), "The nodes' parents form a cycle",
                 id="parent-cycle"),
    pytest.param(_tree(_node(1, parent=1)), "The nodes' parents form a cycle", id="own-parent"),
    # the head
    pytest.param(_tree(head=9), "conversation.head 9 is not in the file", id="head-not-in-file"),
    pytest.param(_tree(head=True), "conversation.head True is not in the file", id="bool-head"),
    pytest.param(_tree(head=[1]), "conversation.head [1] is not in the file", id="list-head"),
    # bubbles
    pytest.param(_tree(bubbles=[_bubble(node=9)]), "bubbles[0]: its node is not in the file", id="bubble-dangling"),
    pytest.param(_tree(bubbles=[_bubble(node=True)]), "bubbles[0]: its node is not in the file", id="bubble-bool-node"),
    pytest.param(_tree(bubbles=["hello"]), "bubbles[0]: its node is not in the file", id="bubble-not-an-object"),
    pytest.param(_tree(bubbles=[_bubble(), _bubble(data=["x"])]), "bubbles[1].data: expected an object",
                 id="bubble-data-not-an-object"),
    pytest.param(_tree(bubbles=[_bubble(role="system")]), "bubbles[0].role: 'system' is not one of",
                 id="bad-bubble-role"),
    pytest.param(_tree(bubbles=[_bubble(content=LONG)]), "bubbles[0].content: longer than 50",
                 id="over-long-bubble"),
    pytest.param(_tree(bubbles=[_bubble(content=None)]), "bubbles[0].content: expected text",
                 id="bubble-content-not-text"),
    # approvals
    pytest.param(_tree(approvals=[_approval(node=9)]), "approvals[0]: needs a node in the file",
                 id="approval-dangling"),
    pytest.param(_tree(approvals=[7]), "approvals[0]: needs a node in the file", id="approval-not-an-object"),
    pytest.param(_tree(approvals=[_approval(approved="yes")]), "approvals[0]: needs a node in the file and `approved`",
                 id="approved-not-bool"),
    pytest.param(_tree(approvals=[{"node": 1, "call_id": "c"}]), "`approved` true or false",
                 id="approved-missing"),
    pytest.param(_tree(approvals=[_approval(call_id="")]), "approvals[0].call_id: expected non-empty text",
                 id="empty-call-id"),
    pytest.param(_tree(approvals=[{"node": 1, "approved": False}]), "approvals[0].call_id: expected non-empty text",
                 id="missing-call-id"),
    pytest.param(_tree(approvals=[_approval(call_id="c" * 201)]), "approvals[0].call_id: longer than 200",
                 id="over-long-call-id"),
])
def test_d5_a_malformed_arbor_file_is_refused_naming_the_field_and_creates_nothing(api, small_limits, document,
                                                                                    needle):
    _assert_refused(api, document, needle)


def _real_export(conversation, settings) -> dict:
    """Arbor's own export of a path with a tool round, a refused outward action, a failure and a compaction."""
    _eventful(conversation, settings)
    return arbor_tree.export_tree(conversation)


def _at(document, kind="compaction", root=True) -> dict:
    return next(n for n in document["nodes"] if n["kind"] == kind and (n["parent"] is None) == root)


@pytest.mark.parametrize(("mutate", "needle"), [
    pytest.param(lambda d: d["nodes"].remove(_at(d, "compaction", root=False)),
                 "its summary_call", id="summarising-call-left-out"),
    pytest.param(lambda d: _at(d).update(compacted_from=None), "only a parentless compaction node points at",
                 id="root-without-its-original"),
    pytest.param(lambda d: d["conversation"].update(head=_at(d, root=False)["id"]), "a head can rest on",
                 id="head-on-the-summarising-call"),
    pytest.param(lambda d: d["approvals"][0].update(node=-1), "approvals[0]: needs a node in the file",
                 id="approval-outside-the-file"),
    pytest.param(lambda d: d["bubbles"][-1].update(node=-1), "its node is not in the file",
                 id="bubble-outside-the-file"),
    pytest.param(lambda d: d["approvals"].append(dict(d["approvals"][0], approved=None)), "`approved` true or false",
                 id="approval-undecided"),
    pytest.param(lambda d: d["nodes"][1].update(id=d["nodes"][0]["id"]), "is used twice", id="ids-repeated"),
])
def test_d5_a_tampered_arbor_export_is_refused_and_creates_nothing(api, conversation, settings, mutate, needle):
    document = _real_export(conversation, settings)
    mutate(document)
    _assert_refused(api, document, needle)


def test_d5_an_import_whose_compaction_originals_form_a_cycle_is_refused_and_creates_nothing(api):
    """C3: two compaction roots, each the other's original. Both are parentless, so ordering by parent
    accepts them; only following the originals finds the cycle."""
    document = _tree(_root(1, 2), _root(2, 1))
    _assert_refused(api, document, "its parents and originals lead back to it (a cycle)")


def test_d5_an_import_whose_summarising_call_hangs_below_its_own_root_is_refused_and_creates_nothing(api):
    """C3: the root's summarising call is a child of that root: parent -> root -> summary_call -> parent."""
    document = _tree(_node(1), _root(2, 1, summary_call=3), _node(3, parent=2, kind="compaction"), head=2)
    _assert_refused(api, document, "node 3: its parents and originals lead back to it (a cycle)")


@pytest.mark.parametrize(("head_node", "why"), [
    pytest.param(_node(2, parent=1, kind="title"), "a title call (R4)", id="title-call"),
    pytest.param(_node(2, parent=1, kind="playbook"), "a playbook draft", id="playbook-call"),
    pytest.param(_node(2, parent=1, status="pending"), "a call under way (T3)", id="pending"),
    pytest.param(_node(2, parent=1, status="failed", failure_reason="context_overflow"), "an overflow (F2)",
                 id="overflow"),
    pytest.param(_node(2, parent=1, kind="compaction"), "a summarising call (C3)", id="summarising-call"),
    pytest.param(_root(2, 1, window_root=True), "a window's root (C3)", id="window-root"),
])
def test_f2_c3_an_import_whose_head_is_a_node_a_head_cannot_rest_on_is_refused_and_creates_nothing(
        api, head_node, why):
    """The head check runs after the rows are inserted; refusing it rolls the whole import back."""
    _assert_refused(api, _tree(_node(1), head_node, head=2, bubbles=[_bubble(node=2)], approvals=[_approval()]),
                    "conversation.head must be a turn or a compaction node that a head can rest on")


def test_c3_a_compaction_root_listed_before_its_original_and_summarising_call_imports(api):
    """Order in the file is free: a root first, whose original and summarising call share a path, is accepted
    (the cycle check meets the original twice and knows it ends), with string ids."""
    document = _tree(_root("c", "t2", summary_call="s"), _node("t1"), _node("t2", parent="t1"),
                     _node("s", parent="t2", kind="compaction"), _node("after", parent="c", tokens=3), head="after")
    response = _post(api, document)
    assert response.status_code == 201, response.json()
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    after = head(copy)
    root = after.parent
    # C1: counts are the import's own (the file's 3 is not trusted); a path starts afresh at its root
    assert (root.kind, root.parent_id, root.path_tokens) == ("compaction", None, root.tokens)
    assert after.path_tokens == root.tokens + after.tokens
    assert root.compacted_from.parent.parent_id is None and root.summary_call.parent_id == root.compacted_from_id


def test_an_imported_date_without_a_zone_is_read_in_the_servers_zone_and_one_with_a_zone_is_kept(api, settings):
    settings.TIME_ZONE = "Europe/Berlin"
    document = _tree(_node(1, finished_at="2024-05-06T07:08:09"), _node(2, parent=1,
                                                                        finished_at="2024-05-06T07:08:09+02:00"),
                     head=2)
    response = _post(api, document)
    assert response.status_code == 201, response.json()
    first, second = Node.objects.order_by("id")
    assert first.finished_at == second.finished_at == datetime(2024, 5, 6, 5, 8, 9, tzinfo=UTC)


# --- sizes and the raw upload (D5) ---------------------------------------------------------------------------


def test_d5_an_arbor_file_with_too_many_nodes_is_413_and_creates_nothing(api, settings):
    settings.ARBOR_IMPORT_MAX_NODES = 2
    _assert_refused(api, _tree(_node(1), _node(2, parent=1), _node(3, parent=2), head=3),
                    "The file holds 3 nodes; at most 2 are imported", status=413, code="too_large")


def test_d5_a_chatgpt_file_with_too_many_messages_is_413_and_creates_nothing(api, settings):
    settings.ARBOR_IMPORT_MAX_NODES = 2
    _assert_refused(api, [_chat(q=_entry("root", _message("user", "hi")), a=_entry("q", _message("assistant", "yo")))],
                    "The file holds 3 nodes; at most 2", status=413, code="too_large")


def test_d5_a_file_over_the_byte_limit_is_413_and_creates_nothing(api, settings):
    body = json.dumps(_tree())
    settings.ARBOR_IMPORT_MAX_BYTES = len(body) - 1
    _assert_refused(api, body.encode(), f"larger than {len(body) - 1} bytes", status=413, code="too_large")
    settings.ARBOR_IMPORT_MAX_BYTES = len(body)
    assert _post(api, body.encode()).status_code == 201, "exactly at the limit is fine"


@pytest.mark.parametrize(("body", "needle"), [
    pytest.param(b'{"format": "arbor.tree", "title": "caf\xe9"}', "not UTF-8", id="latin-1"),
    pytest.param(b"\xff\xfe{\x00}\x00", "not UTF-8", id="utf-16"),
    pytest.param("", "not valid JSON", id="empty"),
    pytest.param("{'single': 'quotes'}", "not valid JSON", id="not-json"),
    pytest.param('{"a": [1, 2}', "not valid JSON", id="unbalanced"),
    # Issue 28: a file may nest two levels a node it may hold (ARBOR_IMPORT_MAX_NODES, 100,000): deeper is refused
    # before it is decoded; anything up to it is read, without recursion.
    pytest.param("[" * 200_009 + "]" * 200_009, "nests deeper than 200008 levels. A conversation file nests at most",
                 id="nesting-200009"),
    pytest.param('{"a": ' * 200_009 + "1" + "}" * 200_009, "nests deeper than 200008 levels", id="objects-nesting"),
    pytest.param("[" * 5000 + "]" * 5000, "Unknown file", id="nesting-5000-is-read"),
    pytest.param(json.dumps({"text": "[" * 100 + '\\"{' * 50}), "Unknown file", id="brackets-in-strings-do-not-nest"),
])
def test_d5_an_upload_that_is_not_utf8_json_or_nests_too_deep_is_refused_and_creates_nothing(api, body, needle):
    _assert_refused(api, body if isinstance(body, bytes) else body.encode(), needle)


@pytest.mark.parametrize("document", [
    pytest.param({"something": "else"}, id="other-object"),
    pytest.param({"format": "other.tree", "version": 1, "nodes": []}, id="other-format"),
    pytest.param([], id="empty-list"),
    pytest.param("conversations", id="a-string"),
    pytest.param(42, id="a-number"),
    pytest.param(None, id="null"),
])
def test_d5_an_unknown_format_is_refused_and_creates_nothing(api, document):
    _assert_refused(api, document, "Unknown file: expected Arbor's tree export, or an export of ChatGPT, Open "
                                   "WebUI, LibreChat, Claude.ai or chatbot-ui")


def test_d5_the_import_functions_raise_their_refusals_directly(user, settings):
    """The same checks without the API: `parse` for the bytes, `import_any` for the document."""
    with pytest.raises(ImportRefused, match="not UTF-8"):
        importing.parse(b"\xc3\x28")
    settings.ARBOR_IMPORT_MAX_BYTES = 3
    with pytest.raises(TooLarge, match="larger than 3 bytes"):
        importing.parse(b"[1,2]")
    with pytest.raises(ImportRefused, match=r"nodes\[0\]\.status"):
        importing.import_any(owner=user, document=_tree(_node(1, status="ok")))
    assert _counts() == {"conversations": 0, "nodes": 0, "bubbles": 0, "approvals": 0}


# --- ChatGPT's conversations.json (D5) ------------------------------------------------------------------------


@pytest.mark.parametrize(("document", "needle"), [
    pytest.param({"mapping": []}, "conversations[0].mapping: expected an object", id="mapping-a-list"),
    pytest.param([{"mapping": None}], "conversations[0].mapping: expected an object", id="mapping-null"),
    pytest.param({"mapping": {}}, "conversations[0].mapping: expected exactly one root message, found 0",
                 id="empty-mapping"),
    pytest.param({"mapping": {"a": _entry("b"), "b": _entry("a")}}, "expected exactly one root message, found 0",
                 id="no-root"),
    pytest.param({"mapping": {"a": _entry(None), "b": _entry(None)}}, "expected exactly one root message, found 2",
                 id="two-roots"),
    pytest.param(_chat(q="hello"), "conversations[0].mapping['q']: expected an object", id="entry-not-an-object"),
    pytest.param(_chat(q=_entry("nowhere", _message("user", "hi"))),
                 "conversations[0].mapping['q']: its parent 'nowhere' is not in the file", id="parent-missing"),
    pytest.param(_chat(q=_entry("root", {"author": {"role": "user"}, "content": "hi"})),
                 "conversations[0].mapping['q'].message.content: expected an object", id="content-not-an-object"),
    pytest.param(_chat(q=_entry("root", {"author": {"role": "user"}})),
                 "conversations[0].mapping['q'].message.content: expected an object", id="content-missing"),
    pytest.param(_chat(q=_entry("root", {"author": {"role": "user"}, "content": {"parts": "hi"}})),
                 "conversations[0].mapping['q'].message.content.parts: expected a list", id="parts-not-a-list"),
    pytest.param(_chat(q=_entry("a", _message("user", "hi")), a=_entry("q", _message("assistant", "yo"))),
                 "conversations[0]: some messages are not reachable from a root (a cycle)",
                 id="unreachable-cycle"),
    pytest.param(_chat(title="t" * 201), "conversations[0].title: longer than 200", id="title-too-long"),
])
def test_d5_a_malformed_chatgpt_file_is_refused_naming_the_entry_and_creates_nothing(api, small_limits, document,
                                                                                      needle):
    _assert_refused(api, document, needle)


def test_a_chatgpt_greeting_system_message_two_answers_and_an_open_question_import_with_the_newest_as_head(api):
    """An answer with no question (a greeting) is a turn of its own; system messages are skipped; a question's
    two answers become sibling turns (T8); a question with no answer is a turn without one; a file is a visible
    placeholder; a tool's output with no call before it is shown as part of the answer (issue 15: nothing is
    dropped); without `current_node` the newest node is the head."""
    document = {"title": 12, "mapping": {
        "root": _entry(None),
        "hello": _entry("root", _message("assistant", "Welcome.")),
        "sys": _entry("hello", _message("system", "be brief")),
        "q": _entry("sys", _message("user", "Hi?", {"asset_pointer": "file-1"})),
        "a1": _entry("q", _message("assistant", "Hello.")),
        "a2": _entry("q", _message("assistant", "Hey.")),
        "tool": _entry("a2", _message("tool", "ignored")),
        "open": _entry("tool", _message("user", "Still there?")),
    }}
    response = _post(api, document)
    assert response.status_code == 201, response.json()
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    views = path_bubbles(conversation=copy)
    assert [(v.bubble.role, v.bubble.content) for v in views] == [
        ("assistant", "Welcome."), ("user", "Hi?\n[file: file-1]"), ("assistant", "Hey.\n\n[tool] ignored"),
        ("user", "Still there?")]
    question = views[1]
    assert (question.branch.index, question.branch.count) == (2, 2)
    assert head(copy).received == [] and head(copy).sent == [{"type": "user", "text": "Still there?"}]
    assert copy.title == "" and Node.objects.count() == 4


def test_a_chatgpt_current_node_that_names_no_turn_falls_back_to_the_newest(api):
    document = {"current_node": "root", "mapping": {
        "root": _entry(None), "q": _entry("root", _message("user", "one")),
        "a": _entry("q", _message("assistant", "")), "q2": _entry("a", _message("user", "two")),
        "a2": _entry("q2", _message("assistant", "2")),
    }}
    response = _post(api, document)
    assert response.status_code == 201, response.json()
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    assert [(v.bubble.role, v.bubble.content) for v in path_bubbles(conversation=copy)] == [
        ("user", "one"), ("user", "two"), ("assistant", "2")], "an empty answer leaves no bubble"


def test_issue_26_a_chatgpt_file_of_nothing_readable_is_refused_and_creates_nothing(api):
    """Issue 26 (the README's promise): conversations with no message that can be read make no empty
    conversation; a file of only such is refused, naming each, and creates nothing."""
    response = _post(api, [_chat(), _chat(title="second")])
    assert response.status_code == 400
    assert "conversation 0: it holds no message that could be read" in response.json()["error"]["message"]
    assert Conversation.objects.count() == 0 and Node.objects.count() == 0


# --- exports of a path with tools, a failure and a compaction (T8, F1, F3, C2) -------------------------------


def _eventful(conversation, settings):
    """A path with a tool that ran, a refused outward action, a failure and a compaction, then a question."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    ask(conversation, "first")
    ask(conversation, '#tool sql_query {"sql": "select count(*) as n from customers"}')
    ask(conversation, '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}')
    (call,) = head(conversation).received
    pending = markdown.export_markdown(conversation)
    run_here(turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"], approve=False))
    ask(conversation, "#fail")
    turn_compact(user=conversation.owner, conversation_id=conversation.pk)
    ask(conversation, "after the compaction")
    conversation.refresh_from_db()
    return pending


def test_t8_the_markdown_export_shows_tool_calls_failures_and_the_compaction_marker(conversation, settings):
    pending = _eventful(conversation, settings)
    assert "**Tool `send_email`** (" in pending
    assert pending.rstrip().endswith("```"), "a call awaiting its decision shows its arguments and no result"
    text = markdown.export_markdown(conversation)
    assert text.startswith("# t\n\n## Question\n\nfirst\n")
    assert '**Tool `sql_query`** (done)\n\n```json\n{"sql": "select count(*) as n from customers"}\n```' in text
    assert '```\n{"columns": ["n"]' in text, "a tool's result follows its arguments"
    assert "**Tool `send_email`** (refused)" in text and "refused: the user did not approve" in text
    assert "> The call failed (provider_error): " in text
    assert "---\n*Earlier messages were compacted" in text
    assert text.endswith("## Question\n\nafter the compaction\n\n## Answer\n\necho: after the compaction\n"
                         "seen: user:summary of 11 messages: tool:{ | user:#fail | user:after the compaction\n")


def test_the_chatgpt_export_keeps_tool_calls_and_results_and_leaves_an_opaque_summary_out(api, conversation,
                                                                                          settings):
    """Tool calls are assistant messages to the tool, results are tool messages; a provider-native summary
    (no text, C3) has nothing a person could read, so the compaction root adds no message."""
    _eventful(conversation, settings)
    document = chatgpt.export_chatgpt(conversation)
    messages = [e["message"] for e in document["mapping"].values() if e["message"]]
    calls = [m for m in messages if m["recipient"] != "all"]
    assert [m["recipient"] for m in calls] == ["sql_query", "send_email"]
    assert all(m["metadata"]["arbor_call_id"] and m["author"]["role"] == "assistant" for m in calls)
    results = [m for m in messages if m["author"]["role"] == "tool"]
    assert [m["author"]["name"] for m in results] == ["sql_query", "send_email"]
    assert [m["metadata"]["arbor_call_id"] for m in results] == [m["metadata"]["arbor_call_id"] for m in calls]
    assert not [m for m in messages if m["author"]["role"] == "system"]
    current = document["mapping"][document["current_node"]]["message"]
    assert current["content"]["parts"][0].startswith("echo: after the compaction")

    response = _post(api, [document])
    assert response.status_code == 201, response.json()
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    assert [v.bubble.content for v in path_bubbles(conversation=copy) if v.bubble.role == "user"][-1] == (
        "after the compaction")


def test_c2_the_chatgpt_export_gives_a_compaction_root_only_its_summary_below_its_original(api):
    """A compaction root's kept questions are already in the export as themselves: only its summary is added,
    as a system message hung below the last message of its original; its summarising call is left out."""
    document = _tree(_node(1, sent=[{"type": "user", "text": "old question"}]),
                     _node(2, parent=1, kind="compaction", sent=[{"type": "user", "text": "summarise"}]),
                     _root(3, 1, summary_call=2, sent=[{"type": "summary", "text": "the gist"},
                                                       {"type": "user", "text": "kept question"}]),
                     _node(4, parent=3, sent=[{"type": "user", "text": "new question"}]), head=4)
    response = _post(api, document)
    assert response.status_code == 201, response.json()
    copy = Conversation.objects.get(pk=response.json()["conversations"][0]["id"])
    exported = chatgpt.export_chatgpt(copy)
    mapping = exported["mapping"]
    texts = {key: e["message"]["content"]["parts"][0] for key, e in mapping.items() if e["message"]}
    assert sorted(texts.values()) == ["a", "a", "new question", "old question", "the gist"]
    (summary,) = [key for key, text in texts.items() if text == "the gist"]
    assert mapping[summary]["message"]["author"]["role"] == "system"
    assert texts[mapping[summary]["parent"]] == "a" and texts[mapping[mapping[summary]["parent"]]["parent"]] == (
        "old question")
    assert texts[mapping[exported["current_node"]]["parent"]] == "new question"


# --- hardening (issue 14): what an imported file may not do ------------------------------------------------

EMAIL_CALL = {"type": "tool_call", "id": "call_1", "name": "send_email",
              "arguments": '{"to": "a@example.com", "subject": "s", "body": "b"}'}


def _waiting_for_approval(**approval):
    """A file whose head asked for `send_email` (an action on the outside world, F3), with one approval entry."""
    return _tree(_node(1, received=[EMAIL_CALL]), approvals=[_approval(**approval)])


def test_d4_an_imported_approval_without_its_result_authorizes_nothing(api):
    """D4, F3 (issue 14, High 1): `approved: true` with no stored result is dropped, so the call waits for a
    person on this server; the next question is refused and no email is sent."""
    response = _post(api, _waiting_for_approval(approved=True, result=None))
    assert response.status_code == 201, response.content
    conversation_id = response.json()["conversations"][0]["id"]
    assert not ToolApproval.objects.exists(), "an imported decision without its result is not kept"
    asked = api.post(f"/api/conversations/{conversation_id}/turns/", {"content": "go on"}, format="json")
    assert asked.status_code == 409 and asked.json()["error"]["code"] == "approval_pending"
    assert mail.outbox == []


def test_d4_an_imported_decision_with_its_result_is_history_and_runs_nothing_again(api):
    """D4: a decision imported with its stored result is replayed as that result; the action never runs here."""
    response = _post(api, _waiting_for_approval(approved=True, result=RESULT))
    assert response.status_code == 201, response.content
    conversation_id = response.json()["conversations"][0]["id"]
    asked = api.post(f"/api/conversations/{conversation_id}/turns/", {"content": "go on"}, format="json")
    assert asked.status_code == 201, asked.content
    assert mail.outbox == [], "the stored result went to the model; no email was sent again"
    sent = Node.objects.get(pk=asked.json()["nodes"][0]["id"]).sent
    assert sent[0] == RESULT


@pytest.mark.parametrize(("result", "needle"), [
    pytest.param({"sent": True}, "approvals[0].result: not an item", id="not-an-item"),
    pytest.param({**RESULT, "is_error": "no"}, "approvals[0].result.is_error: missing, or not bool", id="bad-field"),
    pytest.param({"type": "text", "text": "hi"}, "expected the tool_result of call 'call_1'", id="not-a-result"),
    pytest.param({**RESULT, "call_id": "other"}, "expected the tool_result of call 'call_1'", id="other-call"),
])
def test_d4_d5_an_imported_result_of_the_wrong_shape_is_refused_and_creates_nothing(api, result, needle):
    """Issue 14, High 1: a malformed stored result would break the conversation for good; it is refused."""
    _assert_refused(api, _waiting_for_approval(result=result), needle)


def test_d5_a_call_decided_twice_in_a_file_is_refused_and_creates_nothing(api):
    document = _waiting_for_approval(result=RESULT)
    document["approvals"].append(_approval(result=RESULT, approved=False))
    _assert_refused(api, document, "is decided twice")


@pytest.mark.parametrize(("document", "needle"), [
    pytest.param(_tree(_node(1, usage={"total_tokens": "12"})), "nodes[0].usage.total_tokens: expected a whole",
                 id="usage-text-count"),
    pytest.param(_tree(_node(1, usage={"cost_usd": float("inf")})), "nodes[0].usage.cost_usd", id="usage-inf-cost"),
    pytest.param(_tree(_node(1, usage={"hidden": 1})), "nodes[0].usage: unknown field 'hidden'", id="usage-unknown"),
    pytest.param(_tree(_node(1, usage=[])), "nodes[0].usage: expected an object", id="usage-empty-list"),
    pytest.param(_tree(_node(1, tokens=10**30)), "nodes[0].tokens: expected a whole number", id="huge-tokens"),
    pytest.param(_tree(_node(1, sent=[{"type": ["user"], "text": "q"}])), "nodes[0].sent[0]: not an item",
                 id="unhashable-item-type"),
    pytest.param(_tree(_node(1, status="failed", failure_reason=["x"])), "nodes[0].failure_reason",
                 id="unhashable-reason"),
    pytest.param(_tree(bubbles=[_bubble(data=[])]), "bubbles[0].data: expected an object", id="bubble-data-list"),
    pytest.param({**_tree(), "bubbles": 7}, "`bubbles` must be a list", id="bubbles-not-a-list"),
    pytest.param({**_tree(), "approvals": "x"}, "`approvals` must be a list", id="approvals-not-a-list"),
])
def test_d5_imported_values_of_the_wrong_type_or_range_are_refused_not_a_server_error(api, document, needle):
    """Issue 14, Medium 5 and Low: every imported value's type and range is checked; none gives a 500 or 503."""
    _assert_refused(api, document, needle)


@pytest.mark.parametrize(("mapping", "needle"), [
    pytest.param({"r": {"parent": None}, "a": {"parent": ["r"]}}, "its parent ['r'] is not in the file",
                 id="unhashable-parent"),
    pytest.param({"r": {"parent": None}, "a": {"parent": "r", "message": {"author": "user"}}}, "",
                 id="author-not-an-object"),
])
def test_d5_odd_chatgpt_entries_are_refused_or_skipped_never_a_server_error(api, mapping, needle):
    response = _post(api, [{"title": "t", "mapping": mapping}])
    assert response.status_code in (201, 400), response.content
    if response.status_code == 400:
        assert needle in response.json()["error"]["message"]


def test_a_chatgpt_message_id_that_looks_like_a_turn_key_does_not_overwrite_that_turn(api):
    """Turn keys are made from message ids (`question->answer`); a message named like one must not replace it."""
    mapping = {
        "r": {"parent": None, "message": None},
        "q": {"parent": "r", "message": _message("user", "first question")},
        "a": {"parent": "q", "message": _message("assistant", "first answer")},
        "q->a": {"parent": "a", "message": _message("user", "second question")},
        "b": {"parent": "q->a", "message": _message("assistant", "second answer")},
    }
    response = _post(api, [{"title": "t", "mapping": mapping}])
    assert response.status_code == 201, response.content
    questions = sorted(it.question_of(n.sent) for n in Node.objects.all())
    assert questions == ["first question", "second question"]
