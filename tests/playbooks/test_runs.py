"""Running a playbook: its steps as tool calls in a new conversation, through the one turn runner (R1, F3)."""

from __future__ import annotations

import json

import pytest
from django.core import mail

from config.errors import BadInput
from conversations.models import Conversation, Node
from conversations.selectors import node_path
from conversations.tools.sql_query import sql_query
from conversations.turns.detached import run_here
from conversations.turns.start import turn_decide
from playbooks import services
from playbooks.models import PlaybookRun, PlaybookVersion
from playbooks.selectors import run_deviated, run_view
from tests.playbooks.helpers import sales_conversation

pytestmark = pytest.mark.django_db


@pytest.fixture
def playbook(conversation):
    sales_conversation(conversation)
    return services.playbook_convert(user=conversation.owner, conversation_id=conversation.pk)


def _run(playbook, **values):
    return services.playbook_run(user=playbook.owner, playbook_id=playbook.pk, values=values)


def _query_rows(result) -> list[list]:
    """The rows the run's sql_query call returned, as the tool result the model was sent."""
    node = Node.objects.get(pk=result.head)
    tool_result = next(i for i in node.sent if i["type"] == "tool_result")
    return json.loads(tool_result["content"])["rows"]


def _expected(month: str, *, overseas: bool, limit: int = 5) -> list[list]:
    where = "" if overseas else " AND is_overseas = 0"
    return list(sql_query(f"SELECT customer_name, total FROM monthly_sales WHERE month = '{month}'{where} "
                          f"ORDER BY total DESC LIMIT {limit}")["rows"])


def test_a_converted_playbook_answers_the_sales_question_for_another_month(conversation, playbook):
    """The seeds' question, converted from October and run for September: the SQL ran as a tool call in a
    new conversation, and its rows are September's (right against the sales database, not October's)."""
    result = _run(playbook, month="2026-09")
    assert result.status == "done" and result.answer.startswith("echo: Run the playbook")
    run_conversation = Conversation.objects.get(pk=result.run.conversation_id)
    assert run_conversation.pk != conversation.pk and run_conversation.head_id == result.head
    calls = Node.objects.filter(pk__in=result.nodes).order_by("id")
    assert [c.kind for c in calls] == ["turn", "turn"] and calls[0].received[0]["name"] == "sql_query"
    arguments = json.loads(calls[0].received[0]["arguments"])
    assert "month = :month" in arguments["sql"] and arguments["params"]["month"] == "2026-09"  # bound (S1)
    september, october = _query_rows(result), _expected("2026-10", overseas=False)
    assert september == _expected("2026-09", overseas=False) and september != october
    assert len(september) == 5
    assert result.run.values == {"month": "2026-09", "limit": 5, "include_overseas": False}


def test_a_run_with_overseas_included_counts_overseas_customers(playbook):
    """The seeds' 'with or without overseas': the boolean parameter switches the filter."""
    result = _run(playbook, month="2026-09", include_overseas=True, limit=10)
    assert _query_rows(result) == _expected("2026-09", overseas=True, limit=10)
    assert _query_rows(result) != _expected("2026-09", overseas=False, limit=10)


@pytest.mark.parametrize(("values", "message"), [
    ({"month": "September"}, "month: 'September' does not match the pattern"),
    ({"limit": "ten"}, "limit: 'ten' is not an integer"),
    ({"region": "EU"}, "region: there is no such parameter"),
])
def test_bad_values_are_refused_naming_the_parameter_and_nothing_is_created(playbook, values, message):
    conversations = Conversation.objects.count()
    with pytest.raises(BadInput, match=message):
        _run(playbook, **values)
    assert Conversation.objects.count() == conversations and not PlaybookRun.objects.exists()


def test_f3_a_send_email_step_waits_for_approval_like_any_turn(playbook):
    """F3: the run pauses at the email; nothing is sent until the person approves it in the run."""
    version = playbook.versions.get()
    version.definition["steps"].insert(1, {"tool": "send_email", "arguments": {
        "to": "boss@example.com", "subject": "Sales for {{month}}", "body": "Top customers attached."}})
    version.save()
    result = _run(playbook, month="2026-09")
    assert result.status == "approval_required" and mail.outbox == []
    call = result.approval_required[0]
    assert call["name"] == "send_email" and json.loads(call["arguments"])["subject"] == "Sales for 2026-09"
    run_here(turn_decide(user=playbook.owner, conversation_id=result.run.conversation_id, call_id=call["call_id"],
                      approve=True))
    assert [m.subject for m in mail.outbox] == ["Sales for 2026-09"]


def _unchecked_sql_playbook(playbook, sql: str):
    """The playbook with a month parameter that has no pattern, so any text reaches the SQL."""
    version = playbook.versions.get()
    definition = version.definition
    definition["parameters"] = [{"name": "month", "type": "string", "description": "YYYY-MM"}]
    definition["steps"] = [{"tool": "sql_query", "arguments": {"sql": sql}}, {"instruction": "Answer."}]
    version.definition = definition
    version.save()
    return playbook


@pytest.mark.parametrize("template", ["month = {{month}}", "month = '{{month}}'"])
@pytest.mark.parametrize("value", ["0 OR 1=1", "0 UNION SELECT name FROM customers", "x' OR '1'='1"])
def test_s1_injected_sql_in_a_value_binds_as_data_and_reads_nothing_extra(playbook, template, value):
    """S1: bare or quoted, the reference is a bound placeholder: an injection matches no month."""
    sql = f"SELECT customer_name FROM monthly_sales WHERE {template} ORDER BY customer_name"
    _unchecked_sql_playbook(playbook, sql)
    correct = _query_rows(_run(playbook, month="2026-09"))
    assert len(correct) == len(_expected("2026-09", overseas=True, limit=1000)) > 0
    assert _query_rows(_run(playbook, month=value)) == []


@pytest.mark.parametrize("sql", ['SELECT customer_name FROM monthly_sales WHERE month = "{{month}}"', "{{month}}"])
def test_s1_a_stored_version_with_unsafe_sql_is_refused_before_anything_runs(playbook, sql):
    """A definition stored before the check (or changed by hand) is refused, naming the reference."""
    _unchecked_sql_playbook(playbook, sql)
    with pytest.raises(BadInput, match="could change the statement"):
        _run(playbook, month="0 OR 1=1")
    assert not PlaybookRun.objects.exists()


def test_n1_a_run_reads_its_definition_and_number_from_one_version_row(playbook):
    """N1: the steps run and the version recorded come from the same PlaybookVersion, never from
    `playbook.definition` and a separate count (a save in between could mix them)."""
    first = playbook.versions.get()
    definition = {**first.definition, "name": "Second", "steps": [
        {"tool": "sql_query", "arguments": {"sql": "SELECT count(*) FROM orders WHERE month = {{month}} "
                                                   "AND {{limit}} > 0 AND NOT {{include_overseas}}"}},
        {"instruction": "Say the count."}]}
    second = PlaybookVersion.objects.create(playbook=playbook, number=2, definition=definition,
                                            conversion_node=first.conversion_node, head=first.head)
    result = _run(playbook, month="2026-09")  # playbook.definition is still the first version's
    assert result.run.playbook_version == second and result.run.version == 2
    call = Node.objects.get(pk=result.nodes[0]).received[0]
    assert json.loads(call["arguments"])["sql"].startswith("SELECT count(*) FROM orders")


def test_s4_a_run_whose_model_called_other_arguments_is_marked_deviated(playbook):
    """S4: a real model is asked, not forced, to call the steps exactly; the run says when it did not."""
    result = _run(playbook, month="2026-09")
    assert run_view(result.run).deviated is False
    node = Node.objects.get(pk=result.nodes[0])
    call = node.received[0]
    arguments = json.loads(call["arguments"])
    arguments["params"]["month"] = "2026-10"  # as if the model had changed the value
    node.received = [{**call, "arguments": json.dumps(arguments)}]
    node.save(update_fields=["received"])
    view = run_view(result.run)
    assert view.status == "done" and view.deviated is True


def test_s4_a_finished_run_that_skipped_a_tool_step_is_deviated_a_paused_one_is_not_yet(playbook):
    result = _run(playbook, month="2026-09")
    run = result.run
    definition = run.playbook_version.definition
    definition["steps"].insert(1, {"tool": "sql_query", "arguments": {"sql": "SELECT 1"}})
    run.playbook_version.save()
    ran = Conversation.objects.get(pk=run.conversation_id)
    path = node_path(ran.head_id, owner=ran.owner_id)
    assert run_deviated(run, path, finished=True) is True
    assert run_deviated(run, path, finished=False) is False
