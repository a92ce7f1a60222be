"""The playbook API over HTTP: status codes, the error shape, and access (P1-P3)."""

from __future__ import annotations

import pytest

from conversations import items as it
from conversations.models import Conversation, Node
from conversations.turns.start import turn_ask
from playbooks.models import Playbook
from tests.conversations.helpers import give_back
from tests.playbooks.helpers import sales_conversation

pytestmark = pytest.mark.django_db


def _convert(api, conversation):
    return api.post(f"/api/conversations/{conversation.pk}/playbooks/", format="json")


def test_p1_convert_answers_201_with_the_playbook_and_its_conversion_chain(api, conversation):
    sales_conversation(conversation, "#draft-invalid 1")
    response = _convert(api, conversation)
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["source_conversation"] == conversation.pk and body["source_head"] == conversation.head_id
    (version,) = body["versions"]
    tries = version["conversion_nodes"]
    assert [n["kind"] for n in tries] == ["playbook", "playbook"]
    assert [n["parent"] for n in tries] == [conversation.head_id, tries[0]["id"]]
    assert tries[-1]["id"] == body["conversion_node"] == version["conversion_node"]
    listed = api.get("/api/playbooks/").json()
    assert [p["id"] for p in listed["results"]] == [body["id"]]
    assert api.get(f"/api/playbooks/{body['id']}/").json()["versions"][0]["number"] == 1


def test_p1_still_invalid_is_a_422_in_the_error_shape_with_the_last_errors(api, conversation):
    sales_conversation(conversation, "#draft-invalid always")
    response = _convert(api, conversation)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "playbook_invalid"
    assert error["errors"] == ["steps[0].arguments.sql: SQL error: no such column: no_such_column"]
    assert len(error["nodes"]) == 3 and Node.objects.filter(pk__in=error["nodes"], kind="playbook").count() == 3
    assert not Playbook.objects.exists()


def test_a_conversation_without_a_head_is_a_clear_400(api, conversation):
    response = _convert(api, conversation)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "bad_input" and "no messages yet" in response.json()["error"]["message"]


def test_p3_edit_conversation_then_save_makes_version_2(api, conversation):
    sales_conversation(conversation)
    playbook = _convert(api, conversation).json()
    response = api.post(f"/api/playbooks/{playbook['id']}/edit-conversation/", format="json")
    assert response.status_code == 201
    edit = response.json()
    assert edit["head"] == conversation.head_id and edit["id"] != conversation.pk
    api.post(f"/api/conversations/{edit['id']}/turns/", {"content": "tweak it"}, format="json")
    saved = api.post(f"/api/playbooks/{playbook['id']}/save/", format="json")
    assert saved.status_code == 201
    assert [v["number"] for v in saved.json()["versions"]] == [2, 1]
    assert saved.json()["versions"][0]["conversation"] == edit["id"]


def test_save_without_an_edit_conversation_is_a_400(api, conversation):
    sales_conversation(conversation)
    playbook = _convert(api, conversation).json()
    response = api.post(f"/api/playbooks/{playbook['id']}/save/", format="json")
    assert response.status_code == 400 and "edit conversation" in response.json()["error"]["message"]


def test_run_answers_201_with_the_new_conversation_answer_and_head(api, conversation):
    sales_conversation(conversation)
    playbook = _convert(api, conversation).json()
    response = api.post(f"/api/playbooks/{playbook['id']}/runs/", {"values": {"month": "2026-08"}}, format="json")
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["status"] == "done" and body["answer"].startswith("echo: Run the playbook")
    run_conversation = Conversation.objects.get(pk=body["conversation"])
    assert run_conversation.head_id == body["head"] == body["nodes"][-1]["id"]
    assert body["values"] == {"month": "2026-08", "limit": 5, "include_overseas": False}


@pytest.mark.parametrize("body", [{"values": {"month": 202608}}, {"values": "2026-08"}, ["2026-08"]])
def test_run_with_bad_values_is_a_400_and_creates_nothing(api, conversation, body):
    sales_conversation(conversation)
    playbook = _convert(api, conversation).json()
    conversations = Conversation.objects.count()
    response = api.post(f"/api/playbooks/{playbook['id']}/runs/", body, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_input"
    assert Conversation.objects.count() == conversations


def test_another_users_playbook_is_a_404_everywhere(api, other_api, conversation):
    """Only the caller's own playbooks: anyone else's is a 404, like a missing one; nothing changes."""
    sales_conversation(conversation)
    playbook = _convert(api, conversation).json()
    pid = playbook["id"]
    assert other_api.get("/api/playbooks/").json()["results"] == []
    for method, url in [("get", f"/api/playbooks/{pid}/"), ("post", f"/api/playbooks/{pid}/edit-conversation/"),
                        ("post", f"/api/playbooks/{pid}/save/"), ("post", f"/api/playbooks/{pid}/runs/"),
                        ("get", f"/api/playbooks/{pid}/runs/"),
                        ("post", f"/api/conversations/{conversation.pk}/playbooks/")]:
        response = getattr(other_api, method)(url, {}, format="json")
        assert response.status_code == 404, url
        assert response.json()["error"]["code"] == "not_found"
    assert Playbook.objects.count() == 1 and Conversation.objects.count() == 1


def test_the_openapi_schema_documents_the_playbook_endpoints(api):
    paths = api.get("/api/schema/", HTTP_ACCEPT="application/json").json()["paths"]
    for path in ["/api/conversations/{conversation_id}/playbooks/", "/api/playbooks/", "/api/playbooks/{id}/",
                 "/api/playbooks/{id}/edit-conversation/", "/api/playbooks/{id}/save/", "/api/playbooks/{id}/runs/",
                 "/api/playbooks/{id}/runs/{run_id}/"]:
        assert path.replace("{id}", "{playbook_id}") in paths
    run = paths["/api/playbooks/{playbook_id}/runs/{run_id}/"]["get"]["responses"]["200"]
    assert run["content"]["application/json"]["schema"]["$ref"].endswith("/RunOut")
    assert "get" in paths["/api/playbooks/{playbook_id}/runs/"]


def test_t9_convert_while_a_turn_runs_is_a_409_and_records_nothing(api, conversation):
    """T9, R3: the conversion needs the turn lock; a running turn holds it."""
    sales_conversation(conversation)
    turn = turn_ask(user=conversation.owner, conversation_id=conversation.pk, content="still running")
    try:
        response = _convert(api, conversation)
    finally:
        give_back(turn)
    assert response.status_code == 409 and response.json()["error"]["code"] == "turn_in_progress"
    assert not Node.objects.filter(kind="playbook").exists()


def _run(api, playbook_id, values):
    response = api.post(f"/api/playbooks/{playbook_id}/runs/", {"values": values}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


def test_s5_a_runs_result_is_readable_after_the_post_and_listed(api, conversation):
    sales_conversation(conversation)
    playbook = _convert(api, conversation).json()
    posted = _run(api, playbook["id"], {"month": "2026-08"})
    read = api.get(f"/api/playbooks/{playbook['id']}/runs/{posted['run']}/")
    assert read.status_code == 200
    body = read.json()
    for key in ["run", "playbook", "version", "values", "conversation", "status", "answer", "head", "nodes",
                "deviated"]:
        assert body[key] == posted[key], key
    assert body["status"] == "done" and body["deviated"] is False and len(body["nodes"]) == 2
    second = _run(api, playbook["id"], {"month": "2026-07"})
    listed = api.get(f"/api/playbooks/{playbook['id']}/runs/").json()["results"]
    assert [r["run"] for r in listed] == [second["run"], posted["run"]]
    assert listed[1]["values"]["month"] == "2026-08"


def test_s5_a_run_paused_for_approval_shows_its_latest_state_once_decided(api, conversation):
    """F3: the GET reads the run's conversation, so after the approval it says done, with the new nodes."""
    sales_conversation(conversation)
    playbook = Playbook.objects.get(pk=_convert(api, conversation).json()["id"])
    version = playbook.versions.get()
    version.definition["steps"].insert(1, {"tool": "send_email", "arguments": {
        "to": "boss@example.com", "subject": "Sales for {{month}}", "body": "Top customers attached."}})
    version.save()
    posted = _run(api, playbook.pk, {"month": "2026-09"})
    url = f"/api/playbooks/{playbook.pk}/runs/{posted['run']}/"
    paused = api.get(url).json()
    assert posted["status"] == paused["status"] == "approval_required" and paused["deviated"] is False
    assert [c["name"] for c in paused["approval_required"]] == ["send_email"]
    call_id = paused["approval_required"][0]["call_id"]
    decided = api.post(f"/api/conversations/{posted['conversation']}/approvals/",
                       {"tool_call_id": call_id, "approve": True}, format="json")
    assert decided.status_code in (200, 201), decided.json()
    done = api.get(url).json()
    assert done["status"] == "done" and done["answer"].startswith("echo: Run the playbook")
    assert done["head"] != paused["head"] and len(done["nodes"]) > len(paused["nodes"])
    assert done["deviated"] is False and done["approval_required"] == []


def test_s5_someone_elses_run_or_a_run_of_another_playbook_is_a_404(api, other_api, conversation):
    sales_conversation(conversation)
    playbook = _convert(api, conversation).json()
    other = _convert(api, conversation).json()
    run = _run(api, playbook["id"], {})
    assert other_api.get(f"/api/playbooks/{playbook['id']}/runs/{run['run']}/").status_code == 404
    assert api.get(f"/api/playbooks/{other['id']}/runs/{run['run']}/").status_code == 404
    assert api.get(f"/api/playbooks/{playbook['id']}/runs/999999/").status_code == 404


def test_s6_a_provider_failure_answers_with_every_try_in_the_error_body(api, conversation, monkeypatch):
    """S6: like the 422, a 502 names every try (`nodes`), the failed one last."""
    sales_conversation(conversation, "#draft-invalid 1")
    monkeypatch.setattr("playbooks.prompts.conversion_retry", lambda errors: it.user("#fail"))
    response = _convert(api, conversation)
    assert response.status_code == 502
    error = response.json()["error"]
    tries = list(Node.objects.filter(kind="playbook").order_by("id").values_list("id", flat=True))
    assert error["code"] == "provider_error" and error["nodes"] == tries and len(tries) == 2
