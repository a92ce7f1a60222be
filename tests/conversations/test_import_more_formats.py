"""Issue 28: more files people bring: DeepSeek's data export (a `mapping` of messages made of fragments, thoughts as
THINK), Grok's (`prod-grok-backend.json`, responses chained by `parent_response_id`) and Google AI Studio prompt
files (`chunkedPrompt.chunks`, thoughts as `isThought`, `systemInstruction`). Branches become siblings (T8), the
branch the app shows ends at the head (T2), thoughts are reasoning items (C4), and a file that cannot be read is
refused whole, named, and creates nothing (D5). Where each file came from: tests/fixtures/exports/SOURCES.md."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest

from conversations import items as it
from conversations.models import Conversation, Node
from conversations.screen import path_bubbles
from conversations.selectors import node_path
from tests.conversations.helpers import head

pytestmark = pytest.mark.django_db

EXPORTS = Path(__file__).resolve().parent.parent / "fixtures" / "exports"
DEEPSEEK = EXPORTS / "deepseek" / "deepseek-export-regenerated-HANDMADE.json"
GROK = EXPORTS / "grok" / "grok-backend-branches-HANDMADE.json"
AISTUDIO = EXPORTS / "aistudio" / "export-unshitter-hi-2025.json"


def _post(api, raw: bytes):
    return api.post("/api/conversations/import/", data=raw, content_type="application/json")


def _imported(response) -> list[Conversation]:
    assert response.status_code == 201, response.json()
    return [Conversation.objects.get(pk=c["id"]) for c in response.json()["conversations"]]


def _refused(api, document, message: str) -> None:
    response = _post(api, json.dumps(document).encode())
    assert response.status_code == 400, response.json()
    assert message in response.json()["error"]["message"]
    assert not Conversation.objects.exists() and not Node.objects.exists()


def _skipped_one(api, document, index: int, message: str) -> Conversation:
    """The file imports, but its entry `index` is skipped and named (its error is `message`): only the readable
    conversation is created."""
    response = _post(api, json.dumps(document).encode())
    assert response.status_code == 201, response.json()
    assert response.json()["skipped"] == [{"index": index, "error": message}]
    (conversation,) = _imported(response)
    assert Conversation.objects.count() == 1
    return conversation


def _shown(conversation) -> list[tuple[str, str]]:
    return [(v.bubble.role, v.bubble.content) for v in path_bubbles(conversation=conversation)]


def _types(node) -> list[str]:
    return [item["type"] for item in node.received]


def _nodes(conversation) -> int:
    return Node.objects.filter(conversation=conversation).count()


# --- DeepSeek ---------------------------------------------------------------------------------------------


def test_issue_28_t8_t2_deepseek_regenerated_answer_is_a_sibling_and_the_newest_tip_is_the_head(api):
    """Issue 28, T8, T2: DeepSeek's export (read as DeepSeek, not as ChatGPT, whose files also have a `mapping`):
    the two answers to one question are sibling nodes that both sent it; the conversation goes on from the newer
    one, and the newest tip is the head, so the screen shows that branch."""
    document = json.loads(DEEPSEEK.read_text())
    regenerated, plain = _imported(_post(api, DEEPSEEK.read_bytes()))
    mapping = document[0]["mapping"]
    text = {key: [f["content"] for f in mapping[key]["message"]["fragments"]][-1] for key in "12345"}
    assert regenerated.title == "Boiling point at altitude"
    assert _nodes(regenerated) == 3
    assert _shown(regenerated) == [("user", text["1"]), ("assistant", text["3"]), ("user", text["4"]),
                                   ("assistant", text["5"])]
    first, last = node_path(head(regenerated).pk, owner=regenerated.owner_id)
    siblings = Node.objects.filter(conversation=regenerated, parent_id=None).exclude(pk=first.id)
    assert [it.answer_text(n.received) for n in siblings] == [text["2"]]
    assert all(n.sent == first.sent for n in siblings), "each answer answers the same question"
    assert it.answer_text(last.received) == text["5"]
    assert _nodes(plain) == 1 and _shown(plain) == [("user", "Say hello."), ("assistant", "Hello!")]


def test_issue_28_c4_deepseek_think_fragments_are_reasoning_not_text(api):
    """Issue 28, C4, T8: a THINK fragment is the answer's reasoning item (kept and shown as thoughts, never as the
    answer's text, never sent to another model); each regenerated answer keeps its own."""
    document = json.loads(DEEPSEEK.read_text())
    thoughts = {key: document[0]["mapping"][key]["message"]["fragments"][0]["content"] for key in "23"}
    regenerated, _ = _imported(_post(api, DEEPSEEK.read_bytes()))
    answers = Node.objects.filter(conversation=regenerated, parent_id=None).order_by("id")
    assert [_types(n) for n in answers] == [["reasoning", "text"], ["reasoning", "text"]]
    assert [n.received[0]["text"] for n in answers] == [thoughts["2"], thoughts["3"]]
    assert {n.received[0]["provider"] for n in answers} == {"deepseek"}
    assert all(thoughts["2"] not in content for _, content in _shown(regenerated))


@pytest.mark.parametrize(("change", "message"), [
    pytest.param(lambda m: m["2"]["message"].update(fragments="hi"), "fragments: expected a list", id="fragments"),
    pytest.param(lambda m: m["4"].update(parent="gone"), "its parent 'gone' is not in the file", id="parent"),
    pytest.param(lambda m: m["5"]["message"]["fragments"][0].update(content=7), "content: expected text",
                 id="content"),
])
def test_issue_28_d5_a_deepseek_conversation_that_cannot_be_read_is_refused_whole(api, change, message):
    """Issue 28, D5: fragments that are not a list, a parent the file does not hold, content that is not text:
    the conversation is refused, the error names the place, and nothing is created."""
    document = json.loads(DEEPSEEK.read_text())[:1]
    change(document[0]["mapping"])
    _refused(api, document, message)


def test_issue_28_d5_an_entry_that_is_no_deepseek_conversation_is_skipped_and_named(api):
    """Issue 28, D5: in a DeepSeek file of several, an entry that is no conversation (no mapping of messages made
    of fragments) is skipped and named by its place; the others import, and nothing is made of it."""
    document = json.loads(DEEPSEEK.read_text())[1:] + [{"title": "Lost", "mapping": {"root": {"message": None}}}]
    conversation = _skipped_one(api, document, 1, "conversations[1]: not a DeepSeek conversation (a mapping of "
                                                  "messages made of fragments).")
    assert conversation.title == "Say hello" and _shown(conversation) == [("user", "Say hello."),
                                                                           ("assistant", "Hello!")]


def test_issue_28_d5_a_deepseek_message_that_is_not_an_object_is_refused_whole(api):
    """Issue 28, D5: a `mapping` entry that is not an object: the conversation is refused, the error names the
    message, and nothing is created."""
    document = json.loads(DEEPSEEK.read_text())[:1]
    document[0]["mapping"]["6"] = "deleted"
    _refused(api, document, "conversations[0].mapping['6']: expected an object.")


def test_issue_28_deepseek_search_results_and_empty_fragments_are_left_out(api):
    """Issue 28, C4: a SEARCH fragment (results the app drew around the answer) and a fragment with no content
    are no part of the answer: the node holds only the thoughts and the answer's text."""
    document = json.loads(DEEPSEEK.read_text())[:1]
    fragments = document[0]["mapping"]["5"]["message"]["fragments"]
    fragments[:0] = [{"type": "SEARCH", "content": "3 results: boiling point, altitude, pasta"},
                     {"type": "THINK", "content": ""}, {"type": "RESPONSE"}]
    (conversation,) = _imported(_post(api, json.dumps(document).encode()))
    node = head(conversation)
    assert _types(node) == ["text"] and it.answer_text(node.received) == fragments[-1]["content"]
    assert all("3 results" not in content for _, content in _shown(conversation))


def test_issue_28_t2_a_deepseek_tip_with_an_unreadable_time_is_the_oldest(api):
    """Issue 28, T2: the head is the newest tip by `inserted_at`; a tip whose time cannot be read counts as the
    oldest, so the other branch is the head."""
    document = json.loads(DEEPSEEK.read_text())[:1]
    mapping = document[0]["mapping"]
    mapping["5"]["message"]["inserted_at"] = "yesterday at noon"
    (conversation,) = _imported(_post(api, json.dumps(document).encode()))
    answer = mapping["2"]["message"]["fragments"][-1]["content"]
    assert _shown(conversation) == [("user", mapping["1"]["message"]["fragments"][0]["content"]),
                                    ("assistant", answer)]


def test_issue_28_t2_a_deepseek_file_with_no_tip_holding_a_message_makes_the_newest_node_the_head(api):
    """Issue 28, T2: when every tip is an empty placeholder (`message` null), no tip names the head: the newest
    node made is the head, and the placeholder makes no node."""
    document = json.loads(DEEPSEEK.read_text())[1:]
    mapping = document[0]["mapping"]
    mapping["2"]["children"] = ["3"]
    mapping["3"] = {"id": "3", "parent": "2", "children": [], "message": None}
    (conversation,) = _imported(_post(api, json.dumps(document).encode()))
    assert _nodes(conversation) == 1
    assert _shown(conversation) == [("user", "Say hello."), ("assistant", "Hello!")]


# --- Grok ---------------------------------------------------------------------------------------------------


def test_issue_28_t8_t2_grok_branches_are_siblings_and_leaf_response_id_is_the_head(api):
    """Issue 28, T8, T2: Grok's responses chain by `parent_response_id`; two answers to one question are siblings,
    the older one with the conversation's next question below it; `leaf_response_id` names the tip the app shows,
    which is the head even where another branch is newer. Senders are `human` or the model (`assistant`,
    `ASSISTANT`, a model's name)."""
    document = json.loads(GROK.read_text())
    responses = {r["response"]["_id"]: r["response"]["message"] for r in document["conversations"][0]["responses"]}
    branched, greeting = _imported(_post(api, GROK.read_bytes()))
    assert branched.title == "Tides" and _nodes(branched) == 3
    assert _shown(branched) == [("user", responses["h1"]), ("assistant", responses["a1b"])]
    (shown,) = node_path(head(branched).pk, owner=branched.owner_id)
    (other,) = Node.objects.filter(conversation=branched, parent_id=None).exclude(pk=shown.id)
    assert other.sent == shown.sent and it.answer_text(other.received) == responses["a1"]
    (below,) = Node.objects.filter(parent_id=other.id)
    assert it.question_of(below.sent) == responses["h2"] and it.answer_text(below.received) == responses["a2"]
    assert _nodes(greeting) == 1
    assert _shown(greeting) == [("user", "Hi Grok"), ("assistant", "Hi! What's on your mind?")]


def test_issue_28_c4_grok_thinking_trace_is_a_reasoning_item(api):
    """Issue 28, C4: a response's `thinking_trace` is the answer's reasoning item, before its text, not shown as
    the answer."""
    document = json.loads(GROK.read_text())
    trace = document["conversations"][0]["responses"][4]["response"]["thinking_trace"]
    branched, _ = _imported(_post(api, GROK.read_bytes()))
    node = head(branched)
    assert _types(node) == ["reasoning", "text"]
    assert node.received[0] == {"type": "reasoning", "provider": "grok", "text": trace, "data": None}
    assert all(trace not in content for _, content in _shown(branched))


def test_issue_28_t2_grok_without_a_leaf_the_newest_tip_is_the_head(api):
    """Issue 28, T2, T8: with `leaf_response_id` null, the head is the newest tip (by `create_time`)."""
    document = json.loads(GROK.read_text())
    document["conversations"] = document["conversations"][:1]
    document["conversations"][0]["conversation"]["leaf_response_id"] = None
    (branched,) = _imported(_post(api, json.dumps(document).encode()))
    assert [t for _, t in _shown(branched)][-1] == "The Sun adds about half as much again: spring and neap tides."


@pytest.mark.parametrize(("change", "message"), [
    pytest.param(lambda r: r[1]["response"].update(message=["x"]), "message: expected text", id="message"),
    pytest.param(lambda r: r[2]["response"].update(_id="h1"), "the id 'h1' is used twice", id="duplicate-id"),
    pytest.param(lambda r: r.append({"share_link": None}), "expected an object with a response", id="no-response"),
])
def test_issue_28_d5_a_grok_conversation_that_cannot_be_read_is_refused_whole(api, change, message):
    """Issue 28, D5: a message that is not text, an id used twice, a response missing: refused, named, and
    nothing is created."""
    document = json.loads(GROK.read_text())
    document["conversations"] = document["conversations"][:1]
    change(document["conversations"][0]["responses"])
    _refused(api, document, message)


def test_issue_28_d5_an_entry_that_is_no_grok_conversation_is_skipped_and_named(api):
    """Issue 28, D5: in a Grok file, an entry that is no conversation (no `conversation` object and `responses`
    list) is skipped and named by its place; the others import, and nothing is made of it."""
    document = json.loads(GROK.read_text())
    document["conversations"] = [document["conversations"][1], {"conversation": "Tides", "responses": []}]
    conversation = _skipped_one(api, document, 1, "conversations[1]: not a Grok conversation (a conversation and "
                                                  "its responses).")
    assert conversation.title == "Greeting" and _nodes(conversation) == 1


def test_issue_28_c4_a_grok_answer_with_only_thoughts_keeps_them_as_reasoning(api):
    """Issue 28, C4: an answer whose message is empty but which has a `thinking_trace` keeps the thoughts as its
    one reasoning item, and no empty text item is made."""
    document = json.loads(GROK.read_text())
    document["conversations"] = document["conversations"][:1]
    response = document["conversations"][0]["responses"][4]["response"]
    response["message"] = ""
    (branched,) = _imported(_post(api, json.dumps(document).encode()))
    node = head(branched)
    assert node.received == [{"type": "reasoning", "provider": "grok", "text": response["thinking_trace"],
                              "data": None}]
    assert all(response["thinking_trace"] not in content for _, content in _shown(branched))


@pytest.mark.parametrize("create_time", [
    pytest.param(None, id="missing"),
    pytest.param({"$date": "last Tuesday"}, id="not-a-number"),
    pytest.param({"$date": {"$numberLong": "soon"}}, id="not-a-long"),
])
def test_issue_28_t2_a_grok_tip_with_an_unreadable_time_is_the_oldest(api, create_time):
    """Issue 28, T2: without `leaf_response_id`, the newest tip is the head; a tip whose `create_time` is missing
    or cannot be read counts as the oldest, so the other branch's tip is the head."""
    document = json.loads(GROK.read_text())
    document["conversations"] = document["conversations"][:1]
    conversation = document["conversations"][0]
    conversation["conversation"]["leaf_response_id"] = None
    newest = conversation["responses"][3]["response"]
    if create_time is None:
        del newest["create_time"]
    else:
        newest["create_time"] = create_time
    (branched,) = _imported(_post(api, json.dumps(document).encode()))
    assert [t for _, t in _shown(branched)] == ["What causes the tides?",
                                                "The Moon's and the Sun's gravity, and the Earth turning beneath them."]


# --- Google AI Studio ------------------------------------------------------------------------------------


def test_issue_28_c4_a_real_ai_studio_file_imports_its_thoughts_as_reasoning(api):
    """Issue 28, C4, T1: a real AI Studio prompt file: the question and the answer make one node; the thought
    chunk (`isThought`) is the answer's reasoning item, not its text; the unsent draft (`pendingInputs`) is left
    out; the first question names the conversation, and an empty `systemInstruction` gives no instructions."""
    chunks = json.loads(AISTUDIO.read_text())["chunkedPrompt"]["chunks"]
    (conversation,) = _imported(_post(api, AISTUDIO.read_bytes()))
    assert _nodes(conversation) == 1
    assert _shown(conversation) == [("user", "Hi! just write hi!"), ("assistant", "hi!")]
    node = head(conversation)
    assert _types(node) == ["reasoning", "text"]
    assert node.received[0]["text"] == chunks[1]["text"] and node.received[0]["provider"] == "aistudio"
    assert conversation.title == "Hi! just write hi!" and conversation.instructions == ""


def test_issue_28_ai_studio_system_instruction_becomes_the_conversations_instructions(api):
    """Issue 28, T1, T2: `systemInstruction.parts` (the shape AI Studio's files give it once one is set) become the
    conversation's instructions (gathered before each call, not a node); each question and its answer is one node,
    the next below it, and the head is the last."""
    document = json.loads(AISTUDIO.read_text())
    document["systemInstruction"] = {"parts": [{"text": "Answer in one word."}, {"text": "Be kind."}]}
    document["chunkedPrompt"]["chunks"] += [{"text": "Again?", "role": "user", "tokenCount": 2},
                                           {"text": "hi!", "role": "model", "finishReason": "STOP"}]
    (conversation,) = _imported(_post(api, json.dumps(document).encode()))
    assert conversation.instructions == "Answer in one word.\n\nBe kind."
    assert _nodes(conversation) == 2
    assert [t for _, t in _shown(conversation)] == ["Hi! just write hi!", "hi!", "Again?", "hi!"]


@pytest.mark.parametrize(("change", "message"), [
    pytest.param(lambda d: d["chunkedPrompt"]["chunks"][2].update(text=3), "chunks[2].text: expected text",
                 id="text"),
    pytest.param(lambda d: d["chunkedPrompt"]["chunks"].insert(0, "hi"), "chunks[0]: expected an object",
                 id="chunk"),
    pytest.param(lambda d: d.update(systemInstruction={"parts": "x"}), "systemInstruction.parts: expected a list",
                 id="instruction"),
])
def test_issue_28_d5_an_ai_studio_file_that_cannot_be_read_is_refused_whole(api, change, message):
    """Issue 28, D5: a chunk whose text is not text, a chunk that is not an object, instructions of the wrong
    shape: refused, named, and nothing is created."""
    document = copy.deepcopy(json.loads(AISTUDIO.read_text()))
    change(document)
    _refused(api, document, message)


def test_issue_28_d5_an_entry_that_is_no_ai_studio_prompt_is_skipped_and_named(api):
    """Issue 28, D5: in a list of AI Studio prompts, an entry that is no prompt (no `chunkedPrompt.chunks` list)
    is skipped and named by its place; the others import, and nothing is made of it."""
    document = [json.loads(AISTUDIO.read_text()), {"chunkedPrompt": {"chunks": "hi"}}]
    conversation = _skipped_one(api, document, 1, "[1]: not a Google AI Studio prompt (chunkedPrompt.chunks).")
    assert _shown(conversation) == [("user", "Hi! just write hi!"), ("assistant", "hi!")]


def test_issue_28_d5_ai_studio_instructions_that_are_not_an_object_are_refused_whole(api):
    """Issue 28, D5: a `systemInstruction` that is neither an object nor unset: refused, the error names it, and
    nothing is created."""
    document = json.loads(AISTUDIO.read_text())
    document["systemInstruction"] = "Answer in one word."
    _refused(api, document, "[0].systemInstruction: expected an object.")


def test_issue_28_ai_studio_empty_chunks_and_chunks_of_no_known_role_are_left_out(api):
    """Issue 28, T1: a chunk with no text (nor a Drive file) and a chunk whose role is neither `user` nor `model`
    make nothing; the chunks around them still chain, one node a question and its answer."""
    document = json.loads(AISTUDIO.read_text())
    document["chunkedPrompt"]["chunks"] += [{"text": "", "role": "user"}, {"text": "", "role": "model"},
                                           {"text": "A note of no role."},
                                           {"text": "Function output?", "role": "function"},
                                           {"text": "Again?", "role": "user"}, {"text": "hi!", "role": "model"}]
    (conversation,) = _imported(_post(api, json.dumps(document).encode()))
    assert _nodes(conversation) == 2
    assert [t for _, t in _shown(conversation)] == ["Hi! just write hi!", "hi!", "Again?", "hi!"]
    every = json.dumps([n.sent + n.received for n in Node.objects.filter(conversation=conversation)])
    assert "A note of no role." not in every and "Function output?" not in every


# --- Gemini (Google Takeout's activity log) ------------------------------------------------------------------------

GEMINI = EXPORTS / "gemini" / "MyActivity-HANDMADE.json"


def test_issue_28_gemini_takeout_questions_become_conversations_by_chat_and_by_time(api):
    """Issue 28, T2: the log is newest first and names no conversation in older exports: a chat named in `details`
    is one conversation, whatever came between its questions; unnamed questions go together until 30 minutes pass
    without one. Each is a chain in time order, its last answer the head; what the app did (feedback, a chosen
    draft, a canvas) and other products' records are not turns."""
    conversations = _imported(_post(api, GEMINI.read_bytes()))
    assert [c.title for c in conversations] == ["Hi Bard", "What is a tide?", "Hello, something else entirely",
                                                "Best islands in Greece for a first visit?"]
    bard, tides, hello, islands = conversations
    assert _shown(bard) == [("user", "Hi Bard"), ("assistant", "Hi! I'm Bard.")]
    assert _shown(tides) == [
        ("user", "What is a tide?"), ("assistant", "Tides\n\nThe rise and fall of the sea, pulled by the Moon."),
        ("user", "And what makes a spring tide?"),
        ("assistant", "When the Sun and the Moon line up,\n\ntheir pulls add up: higher highs.\nTwice a month.")]
    assert _nodes(tides) == 2 and _nodes(hello) == 1 and _nodes(islands) == 2
    (first,) = Node.objects.filter(conversation=islands, parent=None)
    assert head(islands).parent_id == first.pk and it.question_of(head(islands).sent) == \
        "Which of those is best in spring?"
    everything = json.dumps([_shown(c) for c in conversations])
    assert "feedback" not in everything and "Canvas" not in everything and "ferry" not in everything


def test_issue_28_gemini_answers_are_text_with_no_markup_and_files_are_placeholders(api):
    """The answer's HTML is read as text, a line per block, entities decoded; a script's text is dropped, and no
    markup is kept. An image and a file sent with the question are named in it."""
    islands = _imported(_post(api, GEMINI.read_bytes()))[-1]
    (question, answer), _ = _shown(islands)[:2], None
    assert question == ("user", "Best islands in Greece for a first visit?\n[image: map-of-the-aegean.jpg]\n"
                                "[file: itinerary.pdf]")
    assert answer == ("assistant", "Three to start with:\n\n- Naxos & its beaches\n- Crete\n- Santorini")
    assert "alert" not in json.dumps(_shown(islands)) and "<" not in answer[1]


def test_issue_28_d5_a_gemini_log_without_questions_or_with_a_bad_time_is_refused_whole(api):
    document = json.loads(GEMINI.read_text())
    _refused(api, [r for r in document if not r["title"].startswith("Prompted ")], "holds no question")
    broken = copy.deepcopy(document)
    broken[1]["time"] = "yesterday"
    _refused(api, broken, "A Gemini record's time is not a date: 'yesterday'")
    assert _post(api, json.dumps([{"header": "Search", "title": "x", "time": "2025-01-01T00:00:00Z"}]).encode()
                 ).status_code == 400, "another product's log is no Gemini file"


def test_issue_28_d5_a_gemini_question_that_cannot_be_read_is_skipped_and_named(api):
    """Fields of a shape no export has (`details` a number, a detail that is no object) name no chat; an answer
    that is not a list of HTML parts skips its conversation, named, and the others import. A table's cells read
    a word apart."""
    document = json.loads(GEMINI.read_text())
    document[0]["details"], document[1]["details"] = 7, ["not an object"]
    document[9]["safeHtmlItem"] = "<p>not a list</p>"  # the Bard question: the oldest conversation
    document[7]["safeHtmlItem"] = [{"html": "<table><tr><th>Sea</th><th>Tide</th></tr><tr><td>North</td>"
                                            "<td>2 m</td></tr></table>"}]
    response = _post(api, json.dumps(document).encode())
    assert response.status_code == 201, response.json()
    assert response.json()["skipped"] == [{"index": 0, "error": "conversation 0, question 0: `safeHtmlItem` is not "
                                                                "a list."}]
    titles = {c.title: c for c in _imported(response)}
    assert list(titles) == ["What is a tide?", "Hello, something else entirely",
                            "Best islands in Greece for a first visit?"]
    assert _shown(titles["Hello, something else entirely"])[1] == ("assistant", "Sea Tide\nNorth 2 m")


def test_issue_28_d5_a_gemini_answers_html_is_read_in_linear_time_and_never_breaks_the_import(api):
    """D5: what breaks Python's own HTML parser (`<![` then no name) or makes it take minutes (120 KB of unclosed
    attribute quotes) is read as text here, bounded; a `pre` block keeps its lines; two questions of one moment
    keep the order they were asked in."""
    records = [
        {"header": "Gemini Apps", "title": "Prompted second, same moment", "time": "2025-06-01T10:00:00.000Z",
         "safeHtmlItem": [{"html": "<pre>def f():\n    return 1</pre><p>done</p>"}]},
        {"header": "Gemini Apps", "title": "Prompted first, same moment", "time": "2025-06-01T10:00:00.000Z",
         "safeHtmlItem": [{"html": "<p>a</p><![ x]>" + "<a b='" * 20000}]},
    ]
    started = time.monotonic()
    (conversation,) = _imported(_post(api, json.dumps(records).encode()))
    assert time.monotonic() - started < 10, "linear, where html.parser took a minute"
    shown = _shown(conversation)
    assert [text for role, text in shown if role == "user"] == ["first, same moment", "second, same moment"]
    assert shown[1] == ("assistant", "a") and shown[3] == ("assistant", "def f():\n    return 1\n\ndone")
