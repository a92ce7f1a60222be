"""Conversion against a real OpenAI-compatible server (the loopback stub): JSON mode and retries (P1)."""

from __future__ import annotations

import json

import pytest

from conversations import services as conversation_services
from playbooks import services
from playbooks.selectors import conversion_chain
from tests.conversations.helpers import ask
from tests.support.openai_stub import Reply

pytestmark = pytest.mark.django_db

DRAFT = {
    "name": "Customer count", "description": "How many customers are in a segment.",
    "parameters": [{"name": "segment", "type": "string", "description": "Segment", "enum": ["SMB", "Enterprise"]}],
    "steps": [{"tool": "sql_query",
               "arguments": {"sql": "SELECT count(*) FROM customers WHERE segment = '{{segment}}'"}}],
    "expected_output": "A number.",
}


def test_p1_json_mode_is_asked_for_and_a_non_json_answer_is_retried_with_the_error(user, stub):
    """P1: a model litellm knows to take `response_format` gets JSON mode; prose is an error fed back, and a
    fenced JSON answer is accepted."""
    conversation = conversation_services.conversation_create(owner=user, model="openai/stub-model")
    stub.script(Reply.text("We have 12 SMB customers."))
    ask(conversation, "How many SMB customers?")
    stub.script(Reply.text("Sure! Here is your playbook."), Reply.text(f"```json\n{json.dumps(DRAFT)}\n```"))
    playbook = services.playbook_convert(user=user, conversation_id=conversation.pk)
    first, second = (stub.requests[-2], stub.requests[-1])
    assert first["response_format"] == second["response_format"] == {"type": "json_object"}
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][-2] == {"role": "assistant", "content": "Sure! Here is your playbook."}
    assert "(the answer): not valid JSON" in second["messages"][-1]["content"]
    assert "tools" not in first, "a conversion drafts text; it calls no tools"
    assert playbook.definition == DRAFT
    assert [n.provider for n in conversion_chain(playbook.conversion_node_id)] == ["openai", "openai"]
