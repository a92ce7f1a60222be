import json
import pytest
from conversations.models import Bubble, Conversation, Node, ToolApproval
from conversations.transfer import arbor_tree, chatgpt, markdown
from conversations.turns.start import turn_compact, turn_decide
from tests.conversations.helpers import ask, head
pytestmark = pytest.mark.django_db

def _post(api, doc):
    return api.post("/api/conversations/import/", data=json.dumps(doc), content_type="application/json")

def test_probe(api, conversation, settings):
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    ask(conversation, "first")
    ask(conversation, '#tool sql_query {"sql": "select count(*) as n from customers"}')
    ask(conversation, '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}')
    (call,) = head(conversation).received
    turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"], approve=False).run()
    ask(conversation, "#fail")
    turn_compact(user=conversation.owner, conversation_id=conversation.pk)
    ask(conversation, "after")
    print("MD<<<" + markdown.export_markdown(conversation) + ">>>MD")
    return
    print(json.dumps(chatgpt.export_chatgpt(conversation), indent=1)[:3000])
    doc = arbor_tree.export_tree(conversation)
    doc["approvals"].append(dict(doc["approvals"][0]))
    try:
        r = _post(api, doc); print("dup approvals", r.status_code, r.content[:300])
    except Exception as e:
        print("dup approvals raised", type(e), e)
    doc = arbor_tree.export_tree(conversation)
    doc["nodes"][0]["tokens"] = 10**30
    try:
        r = _post(api, doc); print("huge tokens", r.status_code, r.content[:300])
    except Exception as e:
        print("huge tokens raised", type(e), e)
    doc = {"mapping": {"r": {"parent": None, "message": None},
        "q": {"parent": "r", "message": {"author": {"role": "user"}, "content": {"parts": ["Q"]}}},
        "a": {"parent": "q", "message": {"author": {"role": "assistant"}, "content": {"parts": ["A"]}}},
        "q->a": {"parent": "r", "message": {"author": {"role": "assistant"}, "content": {"parts": ["other"]}}}}}
    r = _post(api, doc); print("collide", r.status_code, r.content[:300])
    if r.status_code == 201:
        c = Conversation.objects.get(pk=r.json()["conversations"][0]["id"])
        print(list(Bubble.objects.filter(conversation=c).values_list("role", "content")))
