"""Issue 30's pages, as a person uses them through forms (the pages' client, signed in): make a project, set its
instructions, model and memory, start a chat in it, move a conversation in and out, add and remove knowledge
files, delete it only with the number of its conversations; the sidebar groups conversations by project; another
person's project is a 404 everywhere and nothing changes (X2)."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from conversations.models import Conversation, Project
from files.models import StoredFile

pytestmark = pytest.mark.django_db


def _project(page, name="Launch") -> Project:
    made = page.post("/projects/", {"name": name})
    assert made.status_code == 302, made.content
    project = Project.objects.get(name=name)
    assert made["Location"] == f"/projects/{project.pk}/"
    return project


def test_issue_30_a_project_is_made_set_and_chatted_in_from_its_page(page, user):
    project = _project(page)
    saved = page.post(f"/projects/{project.pk}/update/", {"name": "Launch", "instructions": "We launch in May.",
                                                          "model": "arbor/echo", "memory": "false"})
    assert saved.status_code == 302
    project.refresh_from_db()
    assert (project.instructions, project.model, project.memory) == ("We launch in May.", "arbor/echo", False)
    refused = page.post(f"/projects/{project.pk}/update/", {"model": "nope/none"}, follow=True)
    assert "Nothing was changed" in refused.content.decode() and Project.objects.get(pk=project.pk).model == \
        "arbor/echo"
    opened = page.post(f"/projects/{project.pk}/new-chat/")
    conversation = Conversation.objects.get(project=project)
    assert opened["Location"] == f"/chat/{conversation.pk}/"
    html = page.get(f"/projects/{project.pk}/").content.decode()
    assert f'href="/chat/{conversation.pk}/"' in html and "We launch in May." in html
    sidebar = page.get(f"/chat/{conversation.pk}/").content.decode()
    heading = sidebar.index(f'<h2 class="sidebar-project"><a href="/projects/{project.pk}/">Launch</a></h2>')
    assert heading < sidebar.index(f'<a href="/chat/{conversation.pk}/" aria-current="page">'), \
        "the sidebar lists the conversation under its project"


def test_issue_30_a_conversation_moves_in_and_out_and_never_into_someone_elses(page, user, other_user):
    mine = _project(page)
    theirs = Project.objects.create(owner=other_user, name="Theirs")
    conversation = Conversation.objects.create(owner=user, model="arbor/echo")
    assert page.post(f"/chat/{conversation.pk}/move/", {"project": mine.pk}).status_code == 302
    assert Conversation.objects.get(pk=conversation.pk).project_id == mine.pk
    assert page.post(f"/chat/{conversation.pk}/move/", {"project": theirs.pk}).status_code == 404
    assert Conversation.objects.get(pk=conversation.pk).project_id == mine.pk, "nothing changed"
    page.post(f"/chat/{conversation.pk}/move/", {"project": ""})
    assert Conversation.objects.get(pk=conversation.pk).project_id is None
    for url in (f"/projects/{theirs.pk}/", ):
        assert page.get(url).status_code == 404
    for url in (f"/projects/{theirs.pk}/update/", f"/projects/{theirs.pk}/new-chat/",
                f"/projects/{theirs.pk}/delete/"):
        assert page.post(url, {"name": "mine now", "confirm": "0"}).status_code == 404
    assert Project.objects.get(pk=theirs.pk).name == "Theirs" and not Conversation.objects.filter(
        project=theirs).exists()


def test_issue_30_knowledge_files_are_added_and_removed_on_the_page(page, user):
    project = _project(page)
    upload = SimpleUploadedFile("pricing.md", b"The Oak plan costs 12 dollars.")
    assert page.post(f"/projects/{project.pk}/files/", {"file": upload}).status_code == 302
    (stored,) = StoredFile.objects.filter(owner=user)
    assert stored.project_id == project.pk
    assert "pricing.md" in page.get(f"/projects/{project.pk}/").content.decode()
    page.post(f"/projects/{project.pk}/files/{stored.pk}/remove/")
    stored.refresh_from_db()
    assert stored.project_id is None, "out of the project, still the person's"


def test_issue_30_deleting_a_project_on_its_page_asks_for_the_number(page, user):
    project = _project(page)
    page.post(f"/projects/{project.pk}/new-chat/")
    page.post(f"/projects/{project.pk}/new-chat/")  # the untouched one is a new one: projects keep their own
    count = Conversation.objects.filter(project=project).count()
    wrong = page.post(f"/projects/{project.pk}/delete/", {"confirm": str(count + 1)}, follow=True)
    assert f"holds {count} conversation" in wrong.content.decode()
    assert Project.objects.filter(pk=project.pk).exists() and Conversation.objects.filter(project=project).count() \
        == count
    done = page.post(f"/projects/{project.pk}/delete/", {"confirm": str(count)})
    assert done["Location"] == "/projects/" and not Project.objects.filter(pk=project.pk).exists()
    assert not Conversation.objects.filter(owner=user).exists()


def test_issue_30_signed_out_the_project_pages_ask_to_sign_in():
    assert Client().get("/projects/")["Location"].startswith("/accounts/login/")


def test_issue_30_a_project_exports_as_one_file_and_imports_as_a_new_project(api, other_api, user, other_user):
    """The settings, the knowledge files (with their bytes) and every conversation's whole tree go in one file; its
    import is a new project of the importer's, whose questions get the knowledge as the original's did (X2)."""
    import json as jsonlib

    from conversations.jobs import worker
    from conversations.models import Node
    from tests.conversations.helpers import ask
    from tests.files.test_files import ready

    notes = ready(api, "pricing.md", b"The Oak plan costs 12 dollars a month.")
    project = api.post("/api/projects/", {"name": "Sales", "instructions": "Be brief.", "memory": False,
                                          "files": [notes["id"]]}, format="json").json()
    for title in ("First", "Second"):
        cid = api.post("/api/conversations/", {"title": title, "project": project["id"]}, format="json").json()["id"]
        ask(Conversation.objects.get(pk=cid), f"{title}: what does the Oak plan cost?")
    exported = api.get(f"/api/projects/{project['id']}/export/")
    assert exported.status_code == 200 and "attachment" in exported["Content-Disposition"]
    raw = b"".join(exported.streaming_content)
    document = jsonlib.loads(raw)
    assert document["format"] == "arbor.project" and len(document["conversations"]) == 2

    imported = other_api.post("/api/conversations/import/", data=raw, content_type="application/json")
    assert imported.status_code == 201, imported.content
    theirs = Project.objects.get(pk=imported.json()["project"])
    assert (theirs.owner_id, theirs.name, theirs.instructions, theirs.memory) == (other_user.pk, "Sales",
                                                                                    "Be brief.", False)
    assert sorted(c.title for c in theirs.conversations.all()) == ["First", "Second"]
    (knowledge,) = StoredFile.objects.filter(project=theirs)
    assert knowledge.owner_id == other_user.pk and knowledge.name == "pricing.md"
    worker.run_due()  # the knowledge file's text is read by the worker (R4), as after an upload
    conversation = theirs.conversations.get(title="First")
    node = Node.objects.get(pk=ask(conversation, "Oak plan price again?")[-1].data["head"])
    assert "12 dollars" in str([i for i in node.sent if i.get("ephemeral")]), "the knowledge works in the copy"


def test_issue_30_a_project_file_that_cannot_be_read_whole_creates_nothing(other_api, other_user):
    import json as jsonlib

    broken = {"format": "arbor.project", "version": 1, "project": {"name": "P"}, "files": [],
              "conversations": [{"format": "arbor.tree", "version": 1, "conversation": {}, "nodes": "no"}]}
    refused = other_api.post("/api/conversations/import/", data=jsonlib.dumps(broken).encode(),
                             content_type="application/json")
    assert refused.status_code == 400 and "conversations[0]" in refused.json()["error"]["message"]
    assert not Project.objects.filter(owner=other_user).exists() and not Conversation.objects.exists()


@pytest.mark.parametrize(("document", "says"), [
    ({"version": 2, "project": {"name": "P"}, "conversations": []}, "version"),
    ({"version": 1, "project": "P", "conversations": []}, "project:"),
    ({"version": 1, "project": {"name": ""}, "conversations": []}, "project.name"),
    ({"version": 1, "project": {"name": "P"}, "conversations": {}}, "conversations:"),
    ({"version": 1, "project": {"name": "P"}, "conversations": [{"format": "chatgpt"}]}, "conversations[0]"),
    ({"version": 1, "project": {"name": "P"}, "conversations": [], "files": [{"id": 1, "data": "%%"}]}, "files[0]"),
])
def test_issue_30_a_wrong_project_file_says_where_and_creates_nothing(other_api, other_user, document, says):
    import json as jsonlib

    refused = other_api.post("/api/conversations/import/", content_type="application/json",
                             data=jsonlib.dumps({"format": "arbor.project", **document}).encode())
    assert refused.status_code == 400 and says in refused.json()["error"]["message"], refused.content
    assert not Project.objects.filter(owner=other_user).exists()


def test_issue_30_a_project_file_with_a_model_not_offered_here_takes_the_default(other_api, other_user, settings):
    import json as jsonlib

    document = {"format": "arbor.project", "version": 1, "files": [], "conversations": [],
                "project": {"name": "P", "model": "vendor/gone"}}
    made = other_api.post("/api/conversations/import/", data=jsonlib.dumps(document).encode(),
                          content_type="application/json")
    assert made.status_code == 201, made.content
    assert Project.objects.get(pk=made.json()["project"]).model == settings.ARBOR_MODEL


def test_issue_30_importing_a_project_never_takes_a_file_from_another_project(api, other_api, other_user, settings):
    """The importer already keeps the same bytes as a knowledge file of another project: that file stays there,
    and the new project gets a file of its own (sharing the stored bytes)."""
    import json as jsonlib

    from tests.files.test_files import ready

    notes = ready(api, "pricing.md", b"The Oak plan costs 12 dollars a month.")
    project = api.post("/api/projects/", {"name": "Sales", "files": [notes["id"]]}, format="json").json()
    raw = b"".join(api.get(f"/api/projects/{project['id']}/export/").streaming_content)
    theirs = ready(other_api, "same.md", b"The Oak plan costs 12 dollars a month.")
    elsewhere = other_api.post("/api/projects/", {"name": "Elsewhere", "files": [theirs["id"]]}, format="json")
    made = other_api.post("/api/conversations/import/", data=raw, content_type="application/json").json()
    assert StoredFile.objects.get(pk=theirs["id"]).project_id == elsewhere.json()["id"], "left where it was"
    (copy,) = StoredFile.objects.filter(project_id=made["project"])
    assert copy.pk != theirs["id"] and copy.owner_id == other_user.pk
    settings.ARBOR_IMPORT_MAX_NODES = 1
    document = jsonlib.loads(raw)
    too_many = {**document, "conversations": [{"format": "arbor.tree", "nodes": [{}, {}]}]}
    refused = other_api.post("/api/conversations/import/", data=jsonlib.dumps(too_many).encode(),
                             content_type="application/json")
    assert refused.status_code == 400 and "nodes in all" in refused.json()["error"]["message"]
