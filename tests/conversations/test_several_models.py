"""Issue 33, ask several models at once: `models` on a turn runs one sibling branch per model from the same parent,
concurrently, under the one turn lock (T9); the first model's answer becomes the head, and choosing another is a
switch (T8). Each branch is a normal turn of the one runner (R1), so each is recorded like any call (T3, F1).

The second model is a real OpenAI-compatible server on a loopback socket (tests/support/openai_stub.py) reached
through litellm; the first is the offline arbor/echo. Branches run in threads of their own with their own
connections, so these tests commit (transactional database)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest

from conversations import items as it
from conversations import llm, services
from conversations.errors import TooManyTurns
from conversations.models import Conversation, Node
from conversations.turns import compaction
from conversations.turns.detached import launch, request_stop, run_here
from conversations.turns.log import follow
from conversations.turns.start import turn_ask
from tests.conversations.helpers import ask, head
from tests.support.openai_stub import Reply

pytestmark = pytest.mark.django_db(transaction=True)

ECHO, STUB = "arbor/echo", "openai/stub-model"


def _turn(api, conversation: Conversation, body: dict, **headers):
    return api.post(f"/api/conversations/{conversation.pk}/turns/", body, format="json", **headers)


def _sse(response) -> list[tuple[str, dict]]:
    async def read() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    events = []
    for block in asyncio.run(read()).decode().strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            events.append((fields.get("event", "message"), json.loads(fields["data"])))
    return events


def test_issue_33_t7_each_model_answers_as_a_sibling_and_the_first_becomes_the_head(api, conversation, stub):
    ask(conversation, "before")
    parent = head(conversation)
    stub.script(Reply.text("The stub's own answer."))

    response = _turn(api, conversation, {"content": "compare us", "models": [ECHO, STUB]})

    assert response.status_code == 201, response.content
    body = response.json()
    answers = {a["model"]: a for a in body["answers"]}
    assert [a["model"] for a in body["answers"]] == [ECHO, STUB], "in the order asked"
    assert {a["ending"] for a in answers.values()} == {"done"}
    assert answers[STUB]["answer"] == "The stub's own answer." and "compare us" in answers[ECHO]["answer"]
    echo_node, stub_node = Node.objects.get(pk=answers[ECHO]["node"]), Node.objects.get(pk=answers[STUB]["node"])
    assert echo_node.parent_id == stub_node.parent_id == parent.pk, "siblings from the same parent"
    assert (echo_node.model, stub_node.model) == (ECHO, STUB)
    assert echo_node.sent == stub_node.sent and echo_node.sent[-1]["text"] == "compare us", "the same question"
    conversation.refresh_from_db()
    assert body["head"] == conversation.head_id == echo_node.pk, "the first model's answer is the head"
    assert conversation.turn_token is None, "the lock went back when both had ended"
    assert sorted(n["id"] for n in body["nodes"]) == sorted([echo_node.pk, stub_node.pk])
    assert stub.requests[-1]["messages"][-1]["content"] == "compare us", "the stub was asked the question"
    assert "The stub's own answer." not in json.dumps(stub.requests[-1]), "and never saw its sibling's answer"

    tree = api.get(f"/api/conversations/{conversation.pk}/tree/").json()
    marks = {mark["id"]: mark for mark in tree["nodes"]}
    assert marks[echo_node.pk]["parent"] == marks[stub_node.pk]["parent"] == parent.pk, "the map shows siblings"
    assert marks[echo_node.pk]["on_path"] and not marks[stub_node.pk]["on_path"]

    switched = api.post(f"/api/conversations/{conversation.pk}/switch/", {"node": stub_node.pk}, format="json")
    assert switched.status_code == 200 and switched.json()["head"] == stub_node.pk, "choosing one is a switch"
    follow_up = ask(conversation, "go on")[-1].data
    assert Node.objects.get(pk=follow_up["head"]).parent_id == stub_node.pk
    assert "The stub's own answer." in follow_up["answer"], "the next call goes on from the chosen answer"


def test_issue_33_the_branches_run_at_once_and_stream_marked_with_their_model(api, conversation, stub, settings):
    """The stub answers while the slow echo is still writing: its tokens arrive between the echo's, which one
    call after the other could not give. One ending, carrying every branch."""
    settings.ARBOR_ECHO_WORD_SECONDS = 0.25
    stub.script(Reply.text("quick stub words"))

    response = _turn(api, conversation, {"content": "#slow one two three four five six seven eight nine ten",
                                         "models": [ECHO, STUB]}, HTTP_ACCEPT="text/event-stream")

    events = _sse(response)
    tokens = [(data["model"], data["node"]) for kind, data in events if kind == "token"]
    by_model = [model for model, _ in tokens]
    assert STUB in by_model and ECHO in by_model
    assert by_model.index(STUB) < len(by_model) - 1 - by_model[::-1].index(ECHO), "interleaved: run at once"
    assert len({node for model, node in tokens if model == STUB}) == 1, "each branch's tokens name its node"
    endings = [kind for kind, _ in events if kind in ("done", "error", "approval_required")]
    assert endings == ["done"], "one ending for the group"
    done = events[-1][1]
    assert [a["model"] for a in done["answers"]] == [ECHO, STUB] and done["model"] == ECHO
    assert done["answers"][1]["answer"] == "quick stub words"


def test_issue_33_f1_a_failing_branch_is_recorded_and_the_others_answer(api, conversation, stub):
    stub.script(Reply.server_error())
    response = _turn(api, conversation, {"content": "try both", "models": [STUB, ECHO]})

    body = response.json()
    assert response.status_code == 502, body
    answers = body["error"]["answers"]
    assert [(a["model"], a["ending"]) for a in answers] == [(STUB, "error"), (ECHO, "done")]
    failed, answered = Node.objects.get(pk=answers[0]["node"]), Node.objects.get(pk=answers[1]["node"])
    assert failed.status == Node.Status.FAILED and answered.status == Node.Status.SUCCEEDED
    assert failed.parent_id == answered.parent_id is None, "siblings: both the conversation's first calls"
    conversation.refresh_from_db()
    assert conversation.head_id == failed.pk, "F1: the first model's failed node is the head, with Retry"
    assert conversation.turn_token is None


def test_issue_33_t7_an_edit_asks_several_models_below_the_turn_before_the_question(api, conversation, stub):
    ask(conversation, "first")
    first = head(conversation)
    ask(conversation, "second, with a typo")
    question = head(conversation)
    stub.script(Reply.text("edited, by the stub"))

    response = api.post(f"/api/conversations/{conversation.pk}/edit/",
                        {"node": question.pk, "content": "second, fixed", "models": [ECHO, STUB]}, format="json")

    assert response.status_code == 201, response.content
    nodes = [Node.objects.get(pk=a["node"]) for a in response.json()["answers"]]
    assert [n.parent_id for n in nodes] == [first.pk, first.pk]
    assert all(n.sent[-1]["text"] == "second, fixed" for n in nodes)
    assert "second, with a typo" not in json.dumps(stub.requests[-1]), "T7: an edit never sees the old question"


def test_issue_33_bad_models_are_refused_and_change_nothing(api, conversation, stub, settings):
    settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER = 2
    cases = [({"models": []}, "models"), ({"models": [ECHO, ECHO]}, "once"), ({"models": ["nope/none"]}, "nope"),
             ({"models": ECHO}, "models"), ({"models": [ECHO, STUB, "hosted_vllm/stub-model"]}, "at most 2")]
    for extra, said in cases:
        response = _turn(api, conversation, {"content": "hi", **extra})
        assert response.status_code == 400 and said in json.dumps(response.json()), (extra, response.content)
    assert Node.objects.count() == 0 and not stub.requests
    schema = api.get("/api/schema/?format=json").json()["components"]["schemas"]["TurnIn"]["properties"]["models"]
    assert schema["uniqueItems"] is True and schema["maxItems"] == 2 and schema["minItems"] == 1


def test_issue_33_t9_the_lock_and_the_persons_limit_count_every_model(api, conversation, user, stub, settings):
    """Asking two models runs two turns: with a limit of two and one turn running elsewhere, it is refused (429,
    nothing recorded) while asking one still runs; once the other ends, both run."""
    settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER = 2
    settings.ARBOR_ECHO_WORD_SECONDS = 0.1
    other = services.conversation_create(owner=user)
    stub.script(Reply.text("a"), Reply.text("b"))
    run = launch(turn_ask(user=user, conversation_id=other.pk, content="#slow " + "w " * 30))

    refused = _turn(api, conversation, {"content": "both?", "models": [ECHO, STUB]})
    assert refused.status_code == 429 and "2 models" in refused.json()["error"]["message"], refused.content
    assert not Node.objects.filter(conversation=conversation).exists(), "nothing recorded"
    assert _turn(api, conversation, {"content": "one is fine", "models": [STUB]}).status_code == 201

    assert [event.type for _, event in follow(run, owner=conversation.owner_id)][-1] == "done"
    both = _turn(api, conversation, {"content": "both now", "models": [ECHO, STUB]})
    assert both.status_code == 201 and len(both.json()["answers"]) == 2

    # …and while two models answer, they hold both of the person's turns: a turn anywhere else waits.
    settings.ARBOR_MODELS = [*settings.ARBOR_MODELS, "arbor/echo-2"]
    group = launch(turn_ask(user=user, conversation_id=conversation.pk, content="#slow " + "w " * 30,
                            models=[ECHO, "arbor/echo-2"]))
    elsewhere = _turn(api, other, {"content": "and here?"})
    assert elsewhere.status_code == 429 and "2 turns running" in elsewhere.json()["error"]["message"]
    assert Node.objects.filter(conversation=other).count() == 1, "nothing recorded"
    assert [event.type for _, event in follow(group, owner=conversation.owner_id)][-1] == "done"
    assert _turn(api, other, {"content": "and now?"}).status_code == 201


def test_issue_33_f1_a_stop_ends_every_branch_and_keeps_what_each_had_written(user, conversation, settings):
    """Stop (asked through the database, from any tab) reaches every model's branch: each is recorded stopped with
    its text so far, the lock goes back, and the group's one ending lists both."""
    settings.ARBOR_MODELS = ["arbor/echo", "arbor/echo-2"]
    settings.ARBOR_ECHO_WORD_SECONDS = 0.1
    run = launch(turn_ask(user=user, conversation_id=conversation.pk, content="#slow " + "word " * 200,
                          models=["arbor/echo", "arbor/echo-2"]))
    seen: set[str] = set()
    for _, event in follow(run, owner=conversation.owner_id):
        if event.type == "token" and "word" in event.data["text"]:  # past "echo: #slow": a stop ends it at once
            seen.add(event.data["model"])
            if seen == {"arbor/echo", "arbor/echo-2"}:
                assert request_stop(conversation)
        ending = event
    assert ending.type == "error" and ending.data["code"] == "cancelled"
    assert [(a["model"], a["ending"]) for a in ending.data["answers"]] == [("arbor/echo", "error"),
                                                                          ("arbor/echo-2", "error")]
    nodes = Node.objects.filter(conversation=conversation).order_by("pk")
    assert [(n.status, n.failure_reason) for n in nodes] == [(Node.Status.FAILED, Node.FailureReason.CANCELLED)] * 2
    assert all(n.received and "word" in json.dumps(n.received) for n in nodes), "what had arrived is kept"
    conversation.refresh_from_db()
    assert conversation.turn_token is None and conversation.head_id == ending.data["answers"][0]["node"]


def test_issue_33_t9_a_branch_that_cannot_start_gives_the_lock_back_and_records_nothing(api, conversation, stub,
                                                                                     monkeypatch):
    """The first branch has taken the lock over when the second fails to start (here its tool servers cannot be
    read): the lock goes back at once, not a lease later, and nothing was written."""
    from conversations.turns import runner

    real, made = runner.tool_servers_of, []

    def fails_second(conversation):
        made.append(conversation)
        if len(made) == 2:
            raise RuntimeError("the tool servers could not be read")
        return real(conversation)

    monkeypatch.setattr(runner, "tool_servers_of", fails_second)
    with pytest.raises(RuntimeError):
        turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="hi", models=[ECHO, STUB])
    conversation.refresh_from_db()
    assert conversation.turn_token is None and not Node.objects.exists()
    monkeypatch.setattr(runner, "tool_servers_of", real)
    assert _turn(api, conversation, {"content": "again"}).status_code == 201, "free at once"


def test_issue_33_t3_the_head_moves_once_every_branch_has_ended(conversation, stub):
    """No branch moves the head on its own: while a slower model still answers, the head stays where the question
    was asked (so a process killed then leaves it there, as a single turn's would); it moves to the first model's
    answer with the lock's release."""
    stub.script(Reply.hang(1.5, then=Reply.text("slow stub")))
    run = launch(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="quick one",
                          models=[ECHO, STUB]))
    while not Node.objects.filter(conversation=conversation, model=ECHO, status=Node.Status.SUCCEEDED).exists():
        time.sleep(0.02)
    conversation.refresh_from_db()
    assert conversation.head_id is None and conversation.turn_token is not None, "the first has answered; not yet"
    ending = [event for _, event in follow(run, owner=conversation.owner_id)][-1]
    conversation.refresh_from_db()
    assert ending.type == "done" and conversation.head_id == ending.data["head"] == \
        Node.objects.get(conversation=conversation, model=ECHO).pk and conversation.turn_token is None


def test_issue_33_f3_an_approved_call_goes_on_with_the_model_of_its_branch(api, conversation, settings):
    settings.ARBOR_MODELS = [ECHO, "arbor/echo-2"]
    call = '#tool send_email {"to": "a@example.com", "subject": "Hi", "body": "Hello"}'
    waiting = _turn(api, conversation, {"content": call, "models": ["arbor/echo-2", ECHO]})
    assert waiting.status_code == 202, waiting.content
    tip = Node.objects.get(pk=waiting.json()["head"])
    assert tip.model == "arbor/echo-2" and conversation.model == ECHO
    call_id = tip.received[-1]["id"]
    approved = api.post(f"/api/conversations/{conversation.pk}/approvals/", {"call_id": call_id, "approve": True},
                        format="json")
    assert approved.status_code == 201, approved.content
    assert Node.objects.get(pk=approved.json()["head"]).model == "arbor/echo-2", "the model that asked goes on"


def test_issue_33_f1_closing_the_group_stops_every_branch_and_gives_the_lock_back(conversation, settings):
    """A run closed mid-answer (a JSON request's turn whose reader is closed, as a stop closes one): every branch
    is recorded stopped with what had arrived, and the lock goes back."""
    settings.ARBOR_MODELS = [ECHO, "arbor/echo-2"]
    settings.ARBOR_ECHO_WORD_SECONDS = 0.05
    group = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="#slow " + "word " * 100,
                     models=[ECHO, "arbor/echo-2"])
    events = group.events()
    seen = set()
    for event in events:
        seen.add(event.data.get("model"))
        if seen == {ECHO, "arbor/echo-2"}:
            break
    events.close()
    nodes = list(Node.objects.filter(conversation=conversation))
    assert len(nodes) == 2 and {(n.status, n.failure_reason) for n in nodes} == {
        (Node.Status.FAILED, Node.FailureReason.CANCELLED)}
    assert all(n.received for n in nodes), "what had arrived is kept"
    conversation.refresh_from_db()
    assert conversation.turn_token is None


def test_issue_33_r3_a_group_that_outlived_its_lock_keeps_its_answers_and_moves_no_head(conversation, settings):
    """Another turn took the conversation over (this group's lease ran out meanwhile): the answers are kept as
    branches, the head is not moved, and the ending says so."""
    settings.ARBOR_MODELS = [ECHO, "arbor/echo-2"]
    settings.ARBOR_ECHO_WORD_SECONDS = 0.05
    run = launch(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="#slow a b c d e f g",
                          models=[ECHO, "arbor/echo-2"]))
    Conversation.objects.filter(pk=conversation.pk).update(turn_token=uuid.uuid4())  # another holder now
    ending = [event for _, event in follow(run, owner=conversation.owner_id)][-1]
    assert ending.type == "error" and ending.data["code"] == "turn_superseded" and ending.data["head"] is None
    assert [a["ending"] for a in ending.data["answers"]] == ["done", "done"]
    conversation.refresh_from_db()
    assert conversation.head_id is None and Node.objects.filter(status=Node.Status.SUCCEEDED).count() == 2


def test_issue_33_f2_an_overflowing_question_moves_no_head_and_frees_the_conversation(api, conversation, settings):
    settings.ARBOR_MODELS = [ECHO, "arbor/echo-2"]
    response = _turn(api, conversation, {"content": "#overflow", "models": [ECHO, "arbor/echo-2"]})
    assert response.status_code == 502, response.content
    body = response.json()["error"]
    assert body["code"] == "context_overflow" and [a["error"]["code"] for a in body["answers"]] == \
        ["context_overflow"] * 2
    conversation.refresh_from_db()
    assert conversation.head_id is None and conversation.turn_token is None, "F2: kept off the path"
    assert Node.objects.filter(failure_reason=Node.FailureReason.CONTEXT_OVERFLOW).count() == 2


def test_issue_33_a_branch_that_breaks_is_recorded_and_named_while_the_others_answer(api, conversation, stub,
                                                                                    monkeypatch):
    from conversations.turns.runner import Turn

    real = Turn._call_model

    def breaks_for_the_stub(self, node, messages, tools):
        if self.model == STUB:
            raise RuntimeError("a bug in the stub's branch")
        return (yield from real(self, node, messages, tools))

    monkeypatch.setattr(Turn, "_call_model", breaks_for_the_stub)
    response = _turn(api, conversation, {"content": "both?", "models": [ECHO, STUB]})
    assert response.status_code == 201, response.content
    echo, broken = response.json()["answers"]
    assert echo["ending"] == "done" and broken["ending"] == "error"
    assert broken["error"]["code"] == "server_error" and "a bug in the stub's branch" in broken["error"]["message"]
    failed = Node.objects.get(pk=broken["node"])
    assert (failed.status, failed.failure_reason) == (Node.Status.FAILED, Node.FailureReason.INTERRUPTED)


def test_issue_33_t9_more_models_than_the_person_may_run_at_once_is_refused_before_the_lock(conversation, settings):
    """The API caps `models` at the limit; a caller of the turn start itself (the socket, a playbook) is held to it
    by the lock: nothing is taken, nothing recorded."""
    settings.ARBOR_MODELS = [ECHO, "arbor/echo-2", "arbor/echo-3"]
    settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER = 2
    with pytest.raises(TooManyTurns, match="You may run 2 turns at once; asking 3 models at once runs 3"):
        turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="all three?",
                 models=[ECHO, "arbor/echo-2", "arbor/echo-3"])
    conversation.refresh_from_db()
    assert conversation.turn_token is None and not Node.objects.exists()


def test_issue_33_c2_the_group_compacts_once_and_its_answers_stay_siblings(conversation, settings):
    """C1, C2: when the question would pass the threshold, the group summarises once, with the first model, and
    every model answers below that one root: siblings still, one summary call, the head on the first's answer."""
    _compacting_soon(conversation, settings)
    assert not Node.objects.filter(kind=Node.Kind.COMPACTION).exists()
    events = run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content=LONG,
                               models=[ECHO, "arbor/echo-2"]))
    assert [e.type for e in events].count("compaction") == 1 and events[-1].type == "done"
    (root,) = Node.objects.filter(kind=Node.Kind.COMPACTION, parent=None)
    answers = [Node.objects.get(pk=a["node"]) for a in events[-1].data["answers"]]
    assert [a.parent_id for a in answers] == [root.pk, root.pk], "siblings below the one root"
    assert [a.model for a in answers] == [ECHO, "arbor/echo-2"]
    assert Node.objects.filter(kind=Node.Kind.COMPACTION, parent__isnull=False).count() == 1, "one summary call"
    conversation.refresh_from_db()
    assert conversation.head_id == answers[0].pk and conversation.turn_token is None


@pytest.mark.parametrize("summary", ["nothing to compact", "the summary failed"])
def test_issue_33_c2_a_group_whose_summary_is_not_made_answers_where_it_was(conversation, settings, monkeypatch,
                                                                           summary):
    """Nothing to compact, or a summarising call that failed (recorded): every branch answers below the question's
    parent as it was, and none tries to compact again on its own."""
    settings.ARBOR_MODELS = [ECHO, "arbor/echo-2"]
    ask(conversation, "before")
    parent = head(conversation)
    tried = []

    def not_made(**kwargs):
        tried.append(kwargs["model"])
        if summary == "nothing to compact":
            raise compaction.NothingToCompact("nothing")
        raise compaction.SummaryFailed(llm.LLMError("provider_error", "down"), parent.pk)

    monkeypatch.setattr(compaction, "needed", lambda *args, **kwargs: True)
    monkeypatch.setattr(compaction, "compact", not_made)
    events = run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="now",
                               models=[ECHO, "arbor/echo-2"]))
    assert events[-1].type == "done" and tried[0] == ECHO, "the group tries first, with the first model"
    if summary == "the summary failed":
        assert tried == [ECHO], "a failed summary is not tried again"
    else:
        assert sorted(tried[1:]) == [ECHO, "arbor/echo-2"], "with nothing to compact yet, each may later"
    assert [Node.objects.get(pk=a["node"]).parent_id for a in events[-1].data["answers"]] == [parent.pk] * 2


def _compacting_soon(conversation, settings) -> None:
    settings.ARBOR_MODELS = [ECHO, "arbor/echo-2"]
    settings.ARBOR_ECHO_MAX_INPUT_TOKENS = 1200
    settings.ARBOR_ANSWER_RESERVE_TOKENS = 300
    settings.ARBOR_COMPACTION_THRESHOLD = 0.8
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    for i in range(2):
        ask(conversation, f"question {i}: sales of region {i}?")


LONG = "Compare every region's spring sales, one by one: " + "north south east west " * 60


def test_issue_33_f1_a_stop_during_the_groups_summary_keeps_every_question_stopped(conversation, settings,
                                                                                    monkeypatch):
    """C2, F1: stopped while the group's summary is made, no model is called: each branch keeps the question on a
    node of its own, stopped, and the head rests on the first's, as a single turn's does."""
    _compacting_soon(conversation, settings)
    before = head(conversation)

    def stopped(**kwargs):
        error = llm.LLMError(Node.FailureReason.CANCELLED, "stopped by the user")
        raise compaction.SummaryFailed(error, before.pk)

    monkeypatch.setattr(compaction, "compact", stopped)
    events = run_here(turn_ask(user=conversation.owner, conversation_id=conversation.pk, content=LONG,
                               models=[ECHO, "arbor/echo-2"]))
    assert [e.type for e in events] == ["error"] and events[-1].data["code"] == "cancelled"
    stopped_nodes = [Node.objects.get(pk=a["node"]) for a in events[-1].data["answers"]]
    assert [(n.parent_id, n.status, n.failure_reason, n.received) for n in stopped_nodes] == \
        [(before.pk, Node.Status.FAILED, Node.FailureReason.CANCELLED, [])] * 2, "no call was made"
    assert all(it.question_of(n.sent) == LONG for n in stopped_nodes)
    conversation.refresh_from_db()
    assert conversation.head_id == stopped_nodes[0].pk and conversation.turn_token is None


def test_issue_33_f1_a_group_closed_at_its_compaction_keeps_every_question(conversation, settings):
    """Closed right after the summary (a reader that leaves): the branches were on their way, so each records its
    question, stopped; nothing of the question is lost."""
    _compacting_soon(conversation, settings)
    settings.ARBOR_ECHO_WORD_SECONDS = 0.05  # on their way: an instant answer could end before the close
    question = f"{LONG} #slow"
    events = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content=question,
                      models=[ECHO, "arbor/echo-2"]).events()
    assert next(events).type == "compaction"
    events.close()
    asked = [n for n in Node.objects.filter(kind=Node.Kind.TURN) if it.question_of(n.sent) == question]
    assert len(asked) == 2 and all(n.status == Node.Status.FAILED for n in asked)
    conversation.refresh_from_db()
    assert conversation.turn_token is None
