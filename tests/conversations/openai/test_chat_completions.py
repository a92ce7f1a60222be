"""Issue 17: Chat Completions with the official `openai` SDK against a live Arbor. The request carries the whole
list; Arbor hangs the new call below the longest stored path the list extends and records only what is new, so
an edited earlier message makes a branch (the admin tree shows it), not a copy."""

from __future__ import annotations

import openai
import pytest
from django.urls import reverse
from rest_framework.authtoken.models import Token

from conversations.models import Conversation, Node
from tests.conversations.openai.test_responses import MODEL, _client

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def client(asgi_server, user) -> openai.OpenAI:
    return _client(asgi_server, Token.objects.create(user=user).key)


def _ask(client, messages, **options):
    completion = client.chat.completions.create(model=MODEL, messages=messages, **options)
    return completion, completion.choices[0].message


@pytest.mark.slow
def test_issue_17_a_resent_list_records_only_what_is_new_and_an_edited_message_makes_a_branch(client, admin_client):
    system = {"role": "system", "content": "Be brief."}
    first, answer = _ask(client, [system, {"role": "user", "content": "Hello"}])
    assert answer.content.startswith("echo: Hello\nseen: system:Be brief. | user:Hello")
    (conversation,) = Conversation.objects.all()
    history = [system, {"role": "user", "content": "Hello"}, {"role": "assistant", "content": answer.content}]

    second, reply = _ask(client, [*history, {"role": "user", "content": "And then?"}])
    assert Node.objects.count() == 2 and Conversation.objects.count() == 1, "only the new call is recorded"
    node = Node.objects.get(pk=int(second.id.removeprefix("chatcmpl-")))
    assert node.parent_id == int(first.id.removeprefix("chatcmpl-")) and node.sent == [
        {"type": "user", "text": "And then?"}]

    history += [{"role": "user", "content": "And then?"}, {"role": "assistant", "content": reply.content}]
    edited = [*history[:3], {"role": "user", "content": "And after that?"}]
    third, _ = _ask(client, edited)
    branch = Node.objects.get(pk=int(third.id.removeprefix("chatcmpl-")))
    assert branch.parent_id == node.parent_id and Node.objects.count() == 3, "a sibling of the edited call"
    tree = admin_client.get(reverse("admin:conversations_conversation_change", args=[conversation.pk]))
    assert len(tree.context["branches"]) == 2

    # An edited first message, in the conversation named by metadata: a new root beside the first (a branch).
    fourth, _ = _ask(client, [system, {"role": "user", "content": "Hi instead"}],
                     metadata={"conversation": str(conversation.pk)})
    assert Node.objects.get(pk=int(fourth.id.removeprefix("chatcmpl-"))).parent_id is None
    assert Conversation.objects.count() == 1


def test_issue_17_an_edit_with_later_answers_records_them_as_the_client_made_them(client):
    _, answer = _ask(client, [{"role": "user", "content": "one"}])
    listed = [{"role": "user", "content": "one"}, {"role": "assistant", "content": answer.content},
              {"role": "user", "content": "two (asked elsewhere)"},
              {"role": "assistant", "content": "an answer from another model"},
              {"role": "user", "content": "three"}]
    completion, reply = _ask(client, listed)
    new = Node.objects.get(pk=int(completion.id.removeprefix("chatcmpl-")))
    supplied = Node.objects.get(pk=new.parent_id)
    assert (supplied.provider, supplied.received) == ("client", [{"type": "text",
                                                                  "text": "an answer from another model"}])
    assert "assistant:an answer from another model" in reply.content
    assert list(supplied.bubbles.order_by("id").values_list("role", "content")) == [
        ("user", "two (asked elsewhere)"), ("assistant", "an answer from another model")], "shown in the chat"


@pytest.mark.slow
def test_issue_17_tool_calls_and_their_results_in_the_list(client):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    question = {"role": "user", "content": '#tool get_weather {"city": "Paris"}'}
    completion, message = _ask(client, [question], tools=tools)
    assert completion.choices[0].finish_reason == "tool_calls"
    (call,) = message.tool_calls
    listed = [question, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
              {"role": "tool", "tool_call_id": call.id, "content": "18C"}]
    completion, message = _ask(client, listed, tools=tools)
    assert "tool:18C" in message.content and Node.objects.count() == 2


def test_issue_17_a_streamed_completion_assembles_in_the_sdk(client):
    stream = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "#slow hi there"}],
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.startswith("echo: #slow hi there") and len([c for c in chunks if c.choices]) > 3
    assert chunks[-1].usage.total_tokens > 0
    with client.chat.completions.stream(model=MODEL, messages=[{"role": "user", "content": "again"}]) as helper:
        final = helper.get_final_completion()
    assert final.choices[0].message.content.startswith("echo: again")


def test_issue_17_bad_lists_are_the_sdks_errors_and_record_nothing(client):
    for messages, needle in (([{"role": "assistant", "content": "x"}], "assistant message answers"),
                             ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
                              "The last message must be the user's"),
                             ([{"role": "tool", "tool_call_id": "nope", "content": "x"}], "answers no tool call")):
        with pytest.raises(openai.BadRequestError, match=needle):
            client.chat.completions.create(model=MODEL, messages=messages)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a"}],
                                       metadata={"conversation": "999999"})
    assert not Node.objects.exists() and not Conversation.objects.exists()
