"""Issue 31: a usage ledger keyed to nodes (one row per call that reached a provider, written with the node's
ending), `GET /api/usage/`, monthly budgets (402 `budget_exceeded`, nothing recorded) and `manage.py
usage_check`. Rule D1: the ledger and the tree never disagree, through failures too."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from config.settings import _prices
from conversations import budget, llm, services
from conversations import items as it
from conversations.models import Node, UsageEntry
from conversations.selectors import path_node
from conversations.turns import compaction, records, recovery
from conversations.turns.start import turn_ask
from tests.conversations.helpers import ask, command_output, head

pytestmark = pytest.mark.django_db


def test_issue_31_d1_every_call_that_reached_a_provider_has_one_ledger_row_alike(conversation, stub):
    from tests.support.openai_stub import Reply

    ask(conversation, "one")
    ask(conversation, "#fail please")  # a provider error: recorded failed, no usage, no row
    ask(conversation, '#tool sql_query {"sql": "select 1"}')  # two calls: the tool's, then the answer
    services.conversation_update(conversation=conversation, model="openai/stub-model")
    stub.script(Reply.text("priced answer"))
    ask(conversation, "through the stub")
    charged = Node.objects.filter(status=Node.Status.SUCCEEDED)
    assert UsageEntry.objects.count() == charged.count() >= 4
    for node in charged:
        row = UsageEntry.objects.get(node_id=node.pk)
        assert (row.input_tokens, row.output_tokens) == (node.usage["prompt_tokens"], node.usage["completion_tokens"])
        assert (row.owner_id, row.conversation_id, row.model) == (conversation.owner_id, conversation.pk, node.model)
    assert not UsageEntry.objects.filter(node_id__in=Node.objects.filter(status="failed").values("pk")).exists()
    assert "agree" in command_output("usage_check")

    UsageEntry.objects.filter(node_id=charged.first().pk).delete()
    with pytest.raises(CommandError, match="1 difference"):
        call_command("usage_check")


def test_issue_31_a_deleted_conversation_keeps_its_bill(conversation):
    ask(conversation, "billed")
    cid = conversation.pk
    services.conversation_delete(conversation=conversation)
    (row,) = UsageEntry.objects.all()
    assert row.conversation_id == cid and row.input_tokens > 0 and not Node.objects.exists()
    assert "agree" in command_output("usage_check"), "a row whose node is gone is no difference"


def test_issue_31_usage_api_sums_the_callers_ledger_in_groups(api, other_api, user, other_user, conversation):
    ask(conversation, "one")
    ask(conversation, "two")
    theirs = services.conversation_create(owner=other_user)
    ask(theirs, "not mine")
    body = api.get("/api/usage/", {"group": "conversation"}).json()
    mine = UsageEntry.objects.filter(owner=user)
    assert body["calls"] == 2 and body["input_tokens"] == sum(r.input_tokens for r in mine)
    assert body["groups"] == [{"key": str(conversation.pk), "calls": 2, "input_tokens": body["input_tokens"],
                               "output_tokens": body["output_tokens"], "cost_usd": 0.0}]
    (day,) = api.get("/api/usage/", {"group": "day"}).json()["groups"]
    assert api.get("/api/usage/", {"from": "2000-01-01", "to": "2000-01-31"}).json()["calls"] == 0
    assert api.get("/api/usage/", {"group": "weekday"}).status_code == 400
    assert api.get("/api/usage/", {"from": "yesterday"}).status_code == 400
    assert api.get("/api/usage/", {"to": ""}).status_code == 400, "an empty date is no date (the schema's format)"
    assert api.get("/api/usage/", {"user": other_user.username}).status_code == 404, "only staff read others'"
    user.is_staff = True
    user.save()
    assert api.get("/api/usage/", {"user": other_user.username}).json()["calls"] == 1
    assert day["key"] == str(mine.first().day)


def test_issue_31_a_turn_past_the_budget_is_a_402_with_nothing_recorded(api, user, other_user, conversation):
    staff = APIClient()
    staff.force_authenticate(other_user)
    assert staff.put(f"/api/users/{user.username}/budget/", {"monthly_tokens": 1}, format="json").status_code == 403
    assert api.put(f"/api/users/{user.username}/budget/", {"monthly_tokens": 1}, format="json").status_code == 403
    other_user.is_staff = True
    other_user.save()
    assert staff.put("/api/users/nobody/budget/", {"monthly_tokens": 1}, format="json").status_code == 404
    assert staff.put(f"/api/users/{user.username}/budget/", {"monthly_tokens": 0}, format="json").status_code == 400
    set_to = staff.put(f"/api/users/{user.username}/budget/", {"monthly_tokens": 50}, format="json")
    assert set_to.status_code == 200 and set_to.json()["monthly_tokens"] == 50

    first = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "x" * 400}, format="json")
    assert first.status_code == 201, "under the budget when it starts"
    before = (Node.objects.count(), UsageEntry.objects.count())
    refused = api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "more"}, format="json")
    assert refused.status_code == 402 and refused.json()["error"]["code"] == "budget_exceeded"
    assert (Node.objects.count(), UsageEntry.objects.count()) == before, "nothing recorded"
    gateway = APIClient()
    gateway.credentials(HTTP_AUTHORIZATION="Bearer " + Token.objects.get_or_create(user=user)[0].key)
    v1 = gateway.post("/v1/responses", {"model": "arbor/echo", "input": "hi"}, format="json")
    assert v1.status_code == 402 and v1.json()["error"]["code"] == "budget_exceeded"
    assert Node.objects.count() == before[0]

    assert api.get(f"/api/users/{user.username}/budget/").json()["spent_this_month"]["tokens"] >= 50
    lifted = staff.put(f"/api/users/{user.username}/budget/", {"monthly_tokens": None}, format="json")
    assert lifted.json()["monthly_tokens"] is None
    assert api.post(f"/api/conversations/{conversation.pk}/turns/", {"content": "again"},
                    format="json").status_code == 201


def test_issue_31_imported_calls_and_compaction_roots_are_no_bill(api, conversation, settings):
    """An imported node (its usage came with the file) reached no provider of Arbor's: no row, and usage_check
    agrees; so does a compaction root (its summarising call is billed)."""
    import json

    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    ask(conversation, "one")
    ask(conversation, "two")
    response = api.get(f"/api/conversations/{conversation.pk}/export/", {"format": "json"})
    exported = json.loads(b"".join(response.streaming_content))
    assert api.post("/api/conversations/import/", exported, format="json").status_code == 201
    assert api.post(f"/api/conversations/{conversation.pk}/compact/").status_code == 201
    assert UsageEntry.objects.count() == 3, "two turns and the summarising call"
    assert "agree" in command_output("usage_check")


def test_issue_31_the_chat_page_says_what_is_left_when_the_budget_runs_low(page, user, conversation):
    from django.urls import reverse

    from conversations import usage

    ask(conversation, "one")
    spent = usage.spent_this_month(user.pk)["tokens"]
    url = reverse("chat-conversation", args=[conversation.pk])
    assert "budget runs low" not in page.get(url).content.decode(), "no budget, no note"
    usage.set_budget(user, {"monthly_tokens": spent * 10})
    assert "budget runs low" not in page.get(url).content.decode(), "a tenth spent: nothing to say"
    usage.set_budget(user, {"monthly_tokens": spent + 2})
    assert f"2 of {spent + 2:,} tokens left" in page.get(url).content.decode()


def test_issue_31_the_admins_usage_page_charts_tokens_per_day_and_per_model(conversation, client, django_user_model):
    """Drawn on the server as SVG (no script, the admin's CSP holds), of the ledger rows its filters keep."""
    import datetime as dt
    import re

    ask(conversation, "one")
    ask(conversation, "two")
    UsageEntry.objects.filter(pk=UsageEntry.objects.order_by("pk").first().pk).update(
        day=dt.date(2026, 1, 2), model="openai/other")
    staff = django_user_model.objects.create_superuser("root", "root@example.com", "pw-root-12345")
    client.force_login(staff)
    html = client.get("/admin/conversations/usageentry/").content.decode()
    assert "Tokens per day" in html and "Tokens per model" in html
    bars = re.findall(r'<rect x="([\d.]+)" y="([\d.]+)" width="16" height="([\d.]+)"', html)
    assert len(bars) == 4, "two days, two models"
    rows = {row.model: row.input_tokens + row.output_tokens for row in UsageEntry.objects.all()}
    assert f"<td>arbor/echo</td><td>{rows['arbor/echo']}</td><td>1</td>" in html
    assert "<td>2026-01-02</td>" in html
    assert max(float(height) for _, _, height in bars) == 120.0, "the biggest bar is the chart's height"
    filtered = client.get("/admin/conversations/usageentry/?model=openai/other").content.decode()
    charts = filtered.split('class="usage-charts"')[1].split("</section>")[0]
    assert len(re.findall(r"<rect ", charts)) == 2 and "<td>openai/other</td>" in charts
    assert "<td>arbor/echo</td>" not in charts, "the charts follow the page's filters"


def test_issue_31_a_price_override_wins_and_is_what_the_ledger_and_the_usage_api_charge(api, conversation, settings):
    """ARBOR_MODEL_PRICES: dollars per million tokens, over litellm's list (here for the offline model, which that
    list does not price); cached input at its own price."""
    settings.ARBOR_MODEL_PRICES = {"arbor/echo": {"input": 3.0, "output": 15.0, "cached_input": 0.3}}
    ask(conversation, "what does this cost?")
    node = Node.objects.get(status=Node.Status.SUCCEEDED)
    expected = round((node.usage["prompt_tokens"] * 3.0 + node.usage["completion_tokens"] * 15.0) / 1e6, 10)
    assert node.usage["cost_usd"] == expected > 0
    assert UsageEntry.objects.get(node_id=node.pk).cost_usd == expected
    assert api.get("/api/usage/").json()["cost_usd"] == round(expected, 6)
    assert llm.cost_of("arbor/echo", {"prompt_tokens": 1000, "completion_tokens": 0,
                                      "prompt_tokens_details": {"cached_tokens": 600}}) == (400 * 3.0 + 600 * 0.3) / 1e6
    assert "agree" in command_output("usage_check")


@pytest.mark.parametrize(("raw", "said"), [
    ("{", "not JSON"), ('["x"]', "must be a JSON object"), ('{"m": {"input": 1}}', "must hold `input` and `output`"),
    ('{"m": {"input": 1, "output": -2}}', "0 or more"), ('{"m": {"input": 1, "output": 2, "extra": 1}}', "may hold"),
    ('{"m": {"input": true, "output": 2}}', "a number")])
def test_issue_31_a_wrong_price_override_stops_the_start_and_says_what_is_wrong(raw, said):
    with pytest.raises(ImproperlyConfigured, match=said):
        _prices(raw)
    assert _prices("") == {} and _prices('{"m": {"input": 0, "output": 2.5}}') == {"m": {"input": 0, "output": 2.5}}


def test_issue_31_d1_a_call_stopped_after_output_arrived_has_an_estimated_row(conversation, settings):
    """The provider charges for what it generated before a stop; it reports no usage then, so the row counts the
    context sent and the text received, marked estimated. A call that failed with nothing received has none."""
    settings.ARBOR_MODEL_PRICES = {"arbor/echo": {"input": 1.0, "output": 2.0}}
    settings.ARBOR_ECHO_WORD_SECONDS = 0
    ask(conversation, "#fail nothing arrives")
    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="#slow " + "word " * 50)
    events = turn.events()
    for event in events:
        if event.type == "token" and "word" in event.data["text"]:
            break
    events.close()  # a stop mid-answer (the page's Stop closes the turn's events)
    stopped = Node.objects.get(failure_reason=Node.FailureReason.CANCELLED)
    assert stopped.received, "what had arrived is kept"
    row = UsageEntry.objects.get(node_id=stopped.pk)
    assert row.estimated and row.input_tokens == stopped.path_tokens > 0
    assert row.output_tokens == budget.items_tokens(stopped.received, model="arbor/echo", provider="arbor") > 0
    assert row.cost_usd == round((row.input_tokens * 1.0 + row.output_tokens * 2.0) / 1e6, 10)
    failed = Node.objects.get(failure_reason=Node.FailureReason.PROVIDER_ERROR)
    assert not failed.received and not UsageEntry.objects.filter(node_id=failed.pk).exists()
    assert "agree" in command_output("usage_check")

    row.delete()
    with pytest.raises(CommandError, match="1 difference"):
        call_command("usage_check")


def test_issue_31_d1_a_call_its_process_left_pending_gets_its_row_when_it_is_failed(conversation):
    """A process killed mid-answer leaves the node pending with the text saved so far; whoever fails it
    (`turns.recovery`) writes its estimated row in the same transaction."""
    node = records.start(conversation=conversation, parent=None, kind=Node.Kind.TURN,
                         sent=[{"type": "user", "text": "hello"}], model="arbor/echo", call_settings={"model": "x"})
    records.save_partial(node, "half an answ")
    node.refresh_from_db()
    assert records.interrupt(node, recovery._interrupted(node))
    row = UsageEntry.objects.get(node_id=node.pk)
    assert row.estimated and row.output_tokens > 0 and row.input_tokens == node.path_tokens
    assert not records.interrupt(node, recovery._interrupted(node)), "once"
    assert UsageEntry.objects.filter(node_id=node.pk).count() == 1
    assert "agree" in command_output("usage_check")


def test_issue_31_d1_a_stop_during_the_summary_charges_the_summary_alone(conversation, monkeypatch):
    """A stop while the summarising call streams (C2): the summary node keeps its text and its estimated row; the
    question's own call never began, so its node receives nothing and is no bill."""
    ask(conversation, "first question")
    monkeypatch.setattr(compaction, "needed", lambda *args, **kwargs: True)

    def stopped_summary(**kwargs):  # what side_calls.run_side_call records on a stop mid-summary
        summary = records.start(conversation=conversation, parent=path_node(head(conversation)),
                                kind=Node.Kind.COMPACTION, sent=[it.text("summarise")], model="arbor/echo",
                                call_settings={"model": "arbor/echo"})
        error = llm.LLMError(Node.FailureReason.CANCELLED, "stopped by the user",
                             partial=[it.text("summary of 4 messages: user asked")])
        records.fail(summary, error)
        raise compaction.SummaryFailed(error, summary.pk)

    monkeypatch.setattr(compaction, "compact", stopped_summary)
    ask(conversation, "second question")
    question = head(conversation)
    assert it.question_of(question.sent) == "second question" and question.failure_reason == "cancelled"
    assert question.received == [] and not UsageEntry.objects.filter(node_id=question.pk).exists()
    summary = Node.objects.get(kind=Node.Kind.COMPACTION)
    assert UsageEntry.objects.get(node_id=summary.pk).estimated
    assert "agree" in command_output("usage_check")


def test_issue_31_d1_a_late_answer_after_the_sweep_is_one_charge(conversation):
    """The sweep failed a call whose process was only slow (an estimated row); its answer then arrives and goes on
    a sibling (`records._settle`) with the usage the provider reported: that row replaces the estimate."""
    node = records.start(conversation=conversation, parent=None, kind=Node.Kind.TURN,
                         sent=[{"type": "user", "text": "hello"}], model="arbor/echo", call_settings={"model": "x"})
    records.save_partial(node, "half an answ")
    swept = Node.objects.get(pk=node.pk)
    assert records.interrupt(swept, recovery._interrupted(swept))
    assert UsageEntry.objects.get(node_id=node.pk).estimated
    usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    records.succeed(node, llm.CallResult(received=[it.text("half an answer, whole")], usage=usage,
                                         provider="arbor", model="arbor/echo"))
    (row,) = UsageEntry.objects.all()
    assert row.node_id == node.pk != swept.pk and not row.estimated and (row.input_tokens, row.output_tokens) == \
        (10, 5), "the call's own figures, once"
    assert Node.objects.get(pk=swept.pk).status == Node.Status.FAILED, "the swept node keeps its record"
    assert "agree" in command_output("usage_check")


def test_issue_31_an_estimate_keeps_the_price_of_its_day(conversation, settings):
    """An estimated row's cost is kept on its node: a later price is no difference to `usage_check`."""
    settings.ARBOR_MODEL_PRICES = {"arbor/echo": {"input": 1.0, "output": 2.0}}
    node = records.start(conversation=conversation, parent=None, kind=Node.Kind.TURN,
                         sent=[{"type": "user", "text": "hello"}], model="arbor/echo", call_settings={"model": "x"})
    records.fail(node, llm.LLMError("cancelled", "stopped by the user", partial=[it.text("some words")]))
    node.refresh_from_db()
    assert node.usage["estimated"] is True and node.usage["cost_usd"] == UsageEntry.objects.get().cost_usd > 0
    settings.ARBOR_MODEL_PRICES = {"arbor/echo": {"input": 5.0, "output": 9.0}}
    assert "agree" in command_output("usage_check")


def test_issue_31_cached_prompt_tokens_are_kept_and_priced_apart(conversation, stub, settings):
    """The provider's cached prompt tokens (`prompt_tokens_details.cached_tokens`) reach the node, the ledger, and
    the cached price."""
    from tests.support.openai_stub import Reply

    settings.ARBOR_MODEL_PRICES = {"openai/stub-model": {"input": 2.0, "output": 8.0, "cached_input": 0.5}}
    services.conversation_update(conversation=conversation, model="openai/stub-model")
    stub.script(Reply.text("cached answer", prompt_tokens=1000, completion_tokens=10, cached_tokens=600))
    ask(conversation, "again, with the same long prompt")
    row = UsageEntry.objects.get()
    assert (row.input_tokens, row.cached_tokens, row.output_tokens) == (1000, 600, 10)
    assert row.cost_usd == round((400 * 2.0 + 600 * 0.5 + 10 * 8.0) / 1e6, 10)


@pytest.mark.django_db(transaction=True)
def test_issue_31_the_migration_gives_calls_broken_off_before_it_their_estimated_rows(user):
    """Migration 0023: a call that failed after output had arrived, before estimated rows existed, gets its row,
    so `usage_check` agrees from the start; one that failed with nothing received, or already has a row, does not."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before, after = [("conversations", "0022_conversation_turn_weight")], [("conversations",
                                                                            "0023_usage_entry_estimated")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    old = executor.loader.project_state(before).apps
    conversation = old.get_model("conversations", "Conversation").objects.create(owner_id=user.pk, title="old")
    settings_row = old.get_model("conversations", "CallSettings").objects.create(digest="d" * 64, settings={})
    nodes = old.get_model("conversations", "Node").objects
    common = {"conversation_id": conversation.pk, "kind": "turn", "status": "failed", "model": "arbor/echo",
              "provider": "arbor", "call_settings_id": settings_row.pk, "path_tokens": 12,
              "sent": [{"type": "user", "text": "hi"}]}
    broken = nodes.create(**common, received=[{"type": "text", "text": "half an answ"}], failure_reason="cancelled")
    silent = nodes.create(**common, received=[], failure_reason="provider_error")
    try:
        executor = MigrationExecutor(connection)
        executor.migrate(after)
    finally:
        MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    row = UsageEntry.objects.get(node_id=broken.pk)
    assert row.estimated and row.input_tokens == 12 and row.output_tokens > 0 and row.owner_id == user.pk
    assert not UsageEntry.objects.filter(node_id=silent.pk).exists()
    assert Node.objects.get(pk=broken.pk).usage["estimated"] is True
    assert "agree" in command_output("usage_check")
