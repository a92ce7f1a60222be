"""Issue 30, projects: a person's conversations grouped, with instructions every call in the project gets, in
the order the person's own, the project's, the conversation's (what the model saw shows them); a project and
its conversations are their owner's alone; deleting one deletes its conversations only once told how many."""

from __future__ import annotations

import pytest

from conversations import services
from conversations.models import Conversation, Node, Project
from tests.conversations.helpers import ask

pytestmark = pytest.mark.django_db


def test_issue_30_instructions_go_person_then_project_then_conversation(api, user):
    services.preferences_update(user=user, instructions="Person: be kind.")
    made = api.post("/api/projects/", {"name": "Launch", "instructions": "Project: we launch in May.",
                                       "model": "arbor/echo"}, format="json")
    assert made.status_code == 201 and made.json()["memory"] is True, made.content
    project = made.json()["id"]
    created = api.post("/api/conversations/", {"title": "Plan", "instructions": "Conversation: be brief.",
                                               "project": project}, format="json")
    assert created.status_code == 201 and created.json()["project"] == project
    conversation = Conversation.objects.get(pk=created.json()["id"])
    head = ask(conversation, "what now?")[-1].data["head"]
    node = Node.objects.get(pk=head)
    assert node.instructions == "Person: be kind.\n\nProject: we launch in May.\n\nConversation: be brief."
    seen = api.get(f"/api/conversations/{conversation.pk}/context/").json()["messages"][0]
    assert seen == {"role": "system", "content": node.instructions}, "what the next call is sent, first"

    api.patch(f"/api/projects/{project}/", {"instructions": "Project: we launch in June."}, format="json")
    head = ask(conversation, "and now?")[-1].data["head"]
    assert "June" in Node.objects.get(pk=head).instructions, "the project's instructions as they are now"
    moved = api.patch(f"/api/conversations/{conversation.pk}/", {"project": None}, format="json")
    assert moved.json()["project"] is None
    head = ask(conversation, "out?")[-1].data["head"]
    assert Node.objects.get(pk=head).instructions == "Person: be kind.\n\nConversation: be brief."


def test_issue_30_a_new_conversation_in_a_project_starts_with_its_model(api, settings):
    settings.ARBOR_MODELS = [*settings.ARBOR_MODELS, "openai/stub-model"]
    project = api.post("/api/projects/", {"name": "Stubbed", "model": "openai/stub-model"}, format="json").json()
    created = api.post("/api/conversations/", {"project": project["id"]}, format="json").json()
    assert created["model"] == "openai/stub-model"
    assert api.post("/api/projects/", {"name": "Bad", "model": "nope/none"}, format="json").status_code == 400

    cleared = api.patch(f"/api/projects/{project['id']}/", {"model": ""}, format="json")
    assert cleared.status_code == 200 and cleared.json()["model"] == ""
    assert api.post("/api/conversations/", {"project": project["id"]}, format="json").json()["model"] == \
        settings.ARBOR_MODEL, "a project with no model of its own: the default"
    schemas = api.get("/api/schema/?format=json").json()["components"]["schemas"]

    def accepted(field: dict) -> set:  # the values of the field's enum, or of the enums it refers to
        parts = [field, *field.get("oneOf", []), *field.get("allOf", [])]
        return {value for part in parts
                for value in schemas.get(part.get("$ref", "").rpartition("/")[2], part).get("enum", [])}

    assert "" in accepted(schemas["PatchedProjectIn"]["properties"]["model"]), "the schema says what is accepted"
    assert "" not in accepted(schemas["ConversationIn"]["properties"]["model"]), "a conversation names a model"
    assert "arbor/echo" in accepted(schemas["ConversationIn"]["properties"]["model"])


def test_issue_30_another_persons_project_is_a_404_everywhere_and_nothing_changes(api, other_api, user):
    project = api.post("/api/projects/", {"name": "Mine"}, format="json").json()["id"]
    theirs = other_api.post("/api/conversations/", {}, format="json").json()["id"]
    assert other_api.get(f"/api/projects/{project}/").status_code == 404
    assert other_api.patch(f"/api/projects/{project}/", {"name": "x"}, format="json").status_code == 404
    assert other_api.delete(f"/api/projects/{project}/").status_code == 404
    assert other_api.post("/api/conversations/", {"project": project}, format="json").status_code == 404
    assert other_api.patch(f"/api/conversations/{theirs}/", {"project": project}, format="json").status_code == 404
    assert other_api.get("/api/projects/").json()["results"] == []
    assert Project.objects.get(pk=project).name == "Mine" and Conversation.objects.get(pk=theirs).project_id is None
    assert Conversation.objects.count() == 1


def test_issue_30_t11_deleting_a_project_names_how_many_conversations_go_first(api, user):
    project = api.post("/api/projects/", {"name": "Old"}, format="json").json()["id"]
    for title in ("a", "b"):
        cid = api.post("/api/conversations/", {"title": title, "project": project}, format="json").json()["id"]
        ask(Conversation.objects.get(pk=cid), "hello")
    outside = services.conversation_create(owner=user, title="outside")
    refused = api.delete(f"/api/projects/{project}/")
    assert refused.status_code == 409 and "holds 2 conversations" in refused.json()["error"]["message"]
    assert api.delete(f"/api/projects/{project}/?confirm=1").status_code == 409
    # the schema's largest confirm is a wrong count (409), one past it or a non-ASCII digit is bad input (400)
    assert api.delete(f"/api/projects/{project}/?confirm=999999999").status_code == 409
    assert api.delete(f"/api/projects/{project}/?confirm=1000000000").status_code == 400
    assert api.delete(f"/api/projects/{project}/?confirm=\u00b2").status_code == 400
    assert Conversation.objects.count() == 3 and Project.objects.exists(), "nothing changed"
    assert api.delete(f"/api/projects/{project}/?confirm=2").status_code == 204
    assert list(Conversation.objects.values_list("title", flat=True)) == [outside.title]
    assert not Project.objects.exists()
    empty = api.post("/api/projects/", {"name": "Empty"}, format="json").json()["id"]
    assert api.delete(f"/api/projects/{empty}/").status_code == 204, "an empty project needs no confirmation"


def test_issue_30_search_filtered_by_a_project_finds_only_its_conversations(api, other_api, user):
    from conversations.jobs import worker

    project = api.post("/api/projects/", {"name": "Launch"}, format="json").json()["id"]
    inside = api.post("/api/conversations/", {"project": project}, format="json").json()["id"]
    outside = api.post("/api/conversations/", {}, format="json").json()["id"]
    ask(Conversation.objects.get(pk=inside), "the zephyr launch plan")
    ask(Conversation.objects.get(pk=outside), "the zephyr holiday plan")
    worker.run_due()  # the search index is written by the worker (R4)
    everywhere = {hit["conversation"] for hit in api.get("/api/search/", {"q": "zephyr"}).json()["results"]}
    assert everywhere == {inside, outside}
    scoped = api.get("/api/search/", {"q": "zephyr", "project": project}).json()["results"]
    assert scoped and {hit["conversation"] for hit in scoped} == {inside}
    assert other_api.get("/api/search/", {"q": "zephyr", "project": project}).status_code == 404
    empty = api.get("/api/search/", {"q": "zephyr", "project": ""})
    assert empty.status_code == 400 and empty.json()["error"]["param"] == "project", "an empty id is no id"


def test_issue_30_x2_retrieval_never_crosses_a_projects_border_and_memory_off_retrieves_nothing(api, user):
    """R2 within a project's border: a conversation in project A retrieves from A's other conversations only, one
    outside any project from those outside any project only; with A's memory off, nothing is retrieved."""
    from conversations.jobs import worker
    from tests.conversations.helpers import head

    first = services.project_create(owner=user, name="A")
    second = services.project_create(owner=user, name="B")
    for project, amount in ((first, "forty"), (second, "ninety"), (None, "seventy")):
        ask(services.conversation_create(owner=user, project=project), f"the zephyr budget is {amount} dollars")
    worker.run_due()

    def retrieved(project) -> str:
        asker = services.conversation_create(owner=user, project=project, retrieval=True)
        ask(asker, "what is the zephyr budget?")
        sources = {item["source"]["conversation"] for item in head(asker).sent if item.get("ephemeral")}
        texts = " ".join(item.get("text", "") for item in head(asker).sent if item.get("ephemeral"))
        assert all(Conversation.objects.get(pk=pk).project_id == (project and project.pk) for pk in sources)
        return texts

    assert "forty" in retrieved(first) and "ninety" not in retrieved(first) and "seventy" not in retrieved(first)
    assert "seventy" in retrieved(None) and "forty" not in retrieved(None)
    services.project_update(project=first, memory=False)
    assert retrieved(first) == "", "memory off: nothing retrieved"


def test_issue_30_x2_a_projects_knowledge_files_reach_each_question_as_ephemeral_passages(api, other_api, user):
    """The passages of the project's files that share words with the question go with that call only (R2); a file
    outside the project, or another person's, never does; files are set on the project and listed by it."""
    from tests.files.test_files import ready

    pricing = ready(api, "pricing.md", b"Our pricing: the Oak plan costs 12 dollars a month.\n\n" + b"filler " * 400)
    outside = ready(api, "secret.md", b"The Oak plan secret discount code is ACORN.")
    theirs = ready(other_api, "theirs.md", b"Oak plan rumours from another person.")
    project = api.post("/api/projects/", {"name": "Sales", "files": [pricing["id"]]}, format="json").json()
    assert [f["name"] for f in project["files"]] == ["pricing.md"] and project["files"][0]["status"] == "ready"
    conversation = Conversation.objects.get(pk=api.post("/api/conversations/", {"project": project["id"]},
                                                        format="json").json()["id"])
    node = Node.objects.get(pk=ask(conversation, "What does the Oak plan cost?")[-1].data["head"])
    knowledge = [item for item in node.sent if item.get("ephemeral")]
    assert len(knowledge) == 1 and knowledge[0]["source"] == {"file": pricing["id"]}
    assert "From the project's file “pricing.md”: Our pricing: the Oak plan costs 12 dollars" in \
        knowledge[0]["text"]
    assert "ACORN" not in str(node.sent) and "rumours" not in str(node.sent), "nothing from outside the project"
    later = Node.objects.get(pk=ask(conversation, "Thanks!")[-1].data["head"])
    seen = api.get(f"/api/conversations/{conversation.pk}/context/").json()["messages"]
    assert "pricing.md" not in str(seen) and not [i for i in later.sent if i.get("ephemeral")], \
        "for that call only: the next call does not carry it, and a question sharing no word gets none"

    refused = api.patch(f"/api/projects/{project['id']}/", {"files": [outside["id"], theirs["id"]]}, format="json")
    assert refused.status_code == 404
    assert [f["id"] for f in api.get(f"/api/projects/{project['id']}/").json()["files"]] == [pricing["id"]], \
        "bad input changes nothing"
    moved = api.patch(f"/api/projects/{project['id']}/", {"files": [outside["id"]]}, format="json").json()
    assert [f["id"] for f in moved["files"]] == [outside["id"]]
    node = Node.objects.get(pk=ask(conversation, "Any Oak plan discount code?")[-1].data["head"])
    assert "ACORN" in str(node.sent) and "12 dollars" not in str(node.sent)


def test_issue_30_d5_knowledge_is_read_newest_first_up_to_the_scan_bound(api, user, settings):
    """A project of many files: each question reads the newest files' text up to the bound, never all of it."""
    from files.knowledge import knowledge_items
    from tests.files.test_files import ready

    settings.ARBOR_PROJECT_KNOWLEDGE_SCAN_CHARS = 100
    old = ready(api, "old.md", b"The Oak plan used to cost 9 dollars. " * 3)
    new = ready(api, "new.md", b"The Oak plan costs 12 dollars now. " * 3)
    project = api.post("/api/projects/", {"name": "P", "files": [old["id"], new["id"]]}, format="json").json()
    items = knowledge_items(project_id=project["id"], owner_id=user.pk, question="Oak plan cost?")
    assert [item["source"]["file"] for item in items] == [new["id"]], "the newest file, within the bound"


def test_issue_30_x2_r4_knowledge_files_are_embedded_and_their_passages_chosen_by_meaning_too(api, user, settings):
    """Once the worker has embedded a project's files (R4), a passage near the question in meaning goes with it
    though it shares no word with it (arbor/echo-embed knows word forms: "cancel", "cancellations"), and the
    passages nearer in meaning go first; a passage neither sharing a word nor near (ARBOR_RETRIEVAL_MIN_SIMILARITY)
    stays out. Before the worker has run, words alone choose: a call never waits on it."""
    from conversations.jobs import worker
    from files.knowledge import knowledge_items
    from files.models import FileChunkVector
    from tests.files.test_files import ready

    refunds = ready(api, "refunds.md", b"Cancellations are refunded within fourteen days.")
    weather = ready(api, "weather.md", b"Sunny mornings, rainy afternoons.")
    project = api.post("/api/projects/", {"name": "Support", "files": [refunds["id"], weather["id"]]},
                       format="json").json()
    question = "Can I cancel?"
    assert knowledge_items(project_id=project["id"], owner_id=user.pk, question=question) == [], \
        "no vectors yet: no word is shared, nothing is sent"
    worker.run_due()  # joining the project queued each file's embedding
    assert set(FileChunkVector.objects.values_list("file_id", flat=True)) == {refunds["id"], weather["id"]}
    items = knowledge_items(project_id=project["id"], owner_id=user.pk, question=question)
    assert [item["source"]["file"] for item in items] == [refunds["id"]], "near in meaning; the weather is not"
    assert items[0]["ephemeral"] and "refunded within fourteen days" in items[0]["text"]

    settings.ARBOR_EMBEDDING_MODEL = ""  # no model: words alone, as before
    assert knowledge_items(project_id=project["id"], owner_id=user.pk, question=question) == []
    assert knowledge_items(project_id=project["id"], owner_id=user.pk, question="Sunny?")[0]["source"] == \
        {"file": weather["id"]}


def test_issue_30_x2_a_file_uploaded_into_a_project_is_embedded_after_reading(api, user):
    """`project` on an upload: the worker reads the file, then embeds it, however short."""
    from conversations.jobs import worker
    from files.models import FileChunkVector
    from tests.files.test_files import upload

    project = api.post("/api/projects/", {"name": "Support"}, format="json").json()
    created = upload(api, "faq.md", b"Refunds take fourteen days.", project=project["id"])
    assert created.status_code == 201, created.content
    worker.run_due()
    worker.run_due()
    assert FileChunkVector.objects.filter(file_id=created.json()["id"]).count() == 1


def test_issue_30_r4_a_file_not_embedded_yet_is_not_ranked_below_the_rest_and_a_given_up_one_is_not_asked_again(
        api, user, settings, monkeypatch):
    """While one of the project's files has no vectors yet, words alone choose (by meaning it would rank below every
    embedded passage and drop out of the budget); once the worker gives a file's embedding up, questions do not
    queue it again within the hour (a provider that refuses it is not asked on every question)."""
    from conversations import llm
    from conversations.jobs import worker
    from conversations.models import OutboxJob
    from files import embedding
    from files.knowledge import knowledge_items
    from tests.files.test_files import ready

    old = ready(api, "old.md", b"Card cancellations are refunded within fourteen days.")
    games = ready(api, "games.md", b"Sunny mornings, card games in the afternoon.")
    project = api.post("/api/projects/", {"name": "Support", "files": [old["id"], games["id"]]}, format="json").json()
    worker.run_due()  # both embedded
    settings.ARBOR_WORKER_MAX_ATTEMPTS = 1

    def refused(model, texts):
        raise llm.LLMError("provider_error", "this file is refused")

    monkeypatch.setattr(embedding, "vectors_of", refused)
    new = ready(api, "new.md", b"Refund policy: card refunds go back to the card.")
    api.patch(f"/api/projects/{project['id']}/", {"files": [old["id"], games["id"], new["id"]]}, format="json")
    worker.run_due()  # new.md's embedding is given up
    asked = "How do card refunds work?"
    items = knowledge_items(project_id=project["id"], owner_id=user.pk, question=asked)
    assert items[0]["source"] == {"file": new["id"]}, "by words: the passage that shares the question's words"
    for _ in range(3):
        knowledge_items(project_id=project["id"], owner_id=user.pk, question=asked)
        worker.run_due()
    assert OutboxJob.objects.filter(kind="embed_file", payload__file=new["id"]).count() == 1


def test_issue_30_d5_knowledge_passages_stop_at_the_bound_and_a_file_read_as_empty_adds_none(api, user, settings):
    """Passages go best first while they fit ARBOR_PROJECT_KNOWLEDGE_CHARS: one that does not fit is left out, a
    shorter one after it may still go; a document read as no text (a scan with no text layer) adds nothing."""
    from files.knowledge import knowledge_items
    from files.models import StoredFile
    from tests.files.test_files import ready

    long = ready(api, "long.md", b"Oak plan: " + b"the Oak plan costs 12 dollars. " * 10)
    short = ready(api, "short.md", b"Oak plan, briefly: 12 dollars.")
    blank = ready(api, "scan.md", b"placeholder")
    StoredFile.objects.filter(pk=blank["id"]).update(text="")
    project = api.post("/api/projects/", {"name": "P", "files": [long["id"], short["id"], blank["id"]]},
                       format="json").json()
    settings.ARBOR_EMBEDDING_MODEL = ""  # words alone: the order is BM25's
    settings.ARBOR_PROJECT_KNOWLEDGE_CHARS = 100
    items = knowledge_items(project_id=project["id"], owner_id=user.pk, question="Oak plan cost?")
    assert [item["source"]["file"] for item in items] == [short["id"]], "the long passage does not fit"
