"""Issue 29 on the gateway (X1): images and documents in content parts, from the official `openai` SDK (Chat
Completions `image_url` and `file` parts, Responses `input_image` and `input_file`) and the `anthropic` SDK
(`image` and `document` blocks), against a live Arbor. The bytes become the caller's files (the same bytes
again are the same file), the call gets them as any question's files (arbor/echo's digest shows it), and a
resent list with the same files extends the stored path instead of forking it; a URL is never fetched."""

from __future__ import annotations

import base64

import anthropic
import openai
import pytest
from rest_framework.authtoken.models import Token

from conversations.models import Node
from files.models import SentFile, StoredFile
from tests.conversations.openai.test_responses import MODEL, _client
from tests.files.test_files import png

pytestmark = pytest.mark.django_db(transaction=True)  # the live server reads what the test writes

PNG_URL = "data:image/png;base64," + base64.b64encode(png()).decode()
NOTES = base64.b64encode(b"Budget: 40 euros. Venue: the old mill.").decode()


@pytest.fixture
def key(user) -> str:
    return Token.objects.create(user=user).key


@pytest.fixture
def client(asgi_server, key) -> openai.OpenAI:
    return _client(asgi_server, key)


def test_x1_chat_completions_image_and_file_parts_reach_the_call_and_a_resend_extends_the_path(client, user):
    question = {"role": "user", "content": [
        {"type": "text", "text": "Plan the party"},
        {"type": "image_url", "image_url": {"url": PNG_URL}},
        {"type": "file", "file": {"filename": "notes.txt", "file_data": f"data:text/plain;base64,{NOTES}"}}]}
    first = client.chat.completions.create(model=MODEL, messages=[question])
    seen = first.choices[0].message.content
    assert "user:Plan the party [image image-1.png] [file notes.txt: Budget: 40 euros. Venue: the o]" in seen
    files = StoredFile.objects.filter(owner=user).order_by("id")
    assert [(f.name, f.kind, f.status) for f in files] == [("image-1.png", "image", "ready"),
                                                          ("notes.txt", "document", "ready")]
    node = Node.objects.get(pk=int(first.id.removeprefix("chatcmpl-")))
    assert SentFile.objects.filter(node=node).count() == 2

    again = client.chat.completions.create(model=MODEL, messages=[
        question, {"role": "assistant", "content": seen}, {"role": "user", "content": "Shorter"}])
    follow = Node.objects.get(pk=int(again.id.removeprefix("chatcmpl-")))
    assert follow.parent_id == node.pk, "the same words and files: the stored path, extended"
    assert StoredFile.objects.filter(owner=user).count() == 2, "the same bytes are the same files"
    assert "user:Plan the party [image image-1.png] [file notes.txt: Budget" in again.choices[0].message.content

    other = dict(question, content=[question["content"][0], {"type": "image_url", "image_url": {
        "url": "data:image/png;base64," + base64.b64encode(png(3, 2)).decode()}}])
    forked = client.chat.completions.create(model=MODEL, messages=[
        other, {"role": "assistant", "content": seen}, {"role": "user", "content": "Shorter"}])
    assert Node.objects.get(pk=int(forked.id.removeprefix("chatcmpl-"))).parent_id != node.pk, \
        "the same words with another picture are another question"


def test_x1_responses_input_image_and_input_file_by_bytes_and_by_id(client, api, user):
    kept = api.post("/api/files/", {"file": _upload("agenda.md", b"# Agenda\n1. Cake")}, format="multipart").json()
    from conversations.jobs import worker

    worker.run_due()
    response = client.responses.create(model=MODEL, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Compare"},
        {"type": "input_image", "image_url": PNG_URL, "detail": "auto"},
        {"type": "input_file", "file_id": f"file-{kept['id']}"},
        {"type": "input_file", "filename": "notes.txt", "file_data": f"data:text/plain;base64,{NOTES}"}]}])
    text = response.output_text
    assert "[image image-1.png] [file agenda.md: # Agenda\n1. Cake] [file notes.txt: Budget" in text


def test_x1_anthropic_image_and_document_blocks(asgi_server, key):
    client = anthropic.Anthropic(api_key=key, base_url=asgi_server.url, max_retries=0,
                                 _strict_response_validation=True)
    message = client.messages.create(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": base64.b64encode(png()).decode()}},
        {"type": "document", "title": "notes.txt", "source": {"type": "text", "media_type": "text/plain",
                                                              "data": "Budget: 40 euros."}},
        {"type": "text", "text": "What is the budget?"}]}])
    assert "user:What is the budget? [image image-1.png] [file notes.txt: Budget: 40 euros.]" in \
        message.content[0].text


@pytest.mark.parametrize(("part", "status", "needle"), [
    ({"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}, 400, "fetches nothing"),
    ({"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, 400, "does not decode"),
    ({"type": "file", "file": {"file_id": "file-999999999"}}, 404, "No file 999999999 of yours"),
    ({"type": "file", "file": {"file_id": "report.pdf"}}, 400, "names no file of this server"),
    ({"type": "file", "file": {"file_data": "data:application/octet-stream;base64,AAEC"}}, 415, "cannot be read"),
])
def test_x1_gateway_files_refused_with_a_clear_error_change_nothing(client, part, status, needle):
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            {"type": "text", "text": "look"}, part]}])
    assert refused.value.status_code == status and needle in refused.value.body["message"]
    assert Node.objects.count() == 0


def _upload(name: str, data: bytes):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, data)


@pytest.mark.parametrize(("content", "error"), [
    ([{"type": "file", "file": "notes.txt"}], "a file part holds `file_data`"),
    ([{"type": "image_url", "image_url": {"url": "data:image/png,not-base64"}}], "not a base64 data URL"),
    ([{"type": "audio", "audio": {}}], "reads text, image and file parts (got 'audio')"),
    ({"type": "text"}, "expected text or a list of content parts"),
])
def test_x1_content_parts_that_are_no_file_say_what_is_wrong(content, error):
    from config.errors import BadInput
    from conversations.openai.parts import user_content

    with pytest.raises(BadInput, match=error.replace("(", r"\(").replace(")", r"\)")):
        user_content(content, "messages[0]")


def test_d5_a_file_in_a_part_is_bounded_and_parts_name_files_by_id(settings):
    from config.errors import TooLarge
    from conversations.openai.parts import user_content

    assert user_content(None, "m") == ("", [])
    text, (by_id,) = user_content([{"type": "input_image", "file_id": "file-7"}], "m")
    assert (text, by_id) == ("", {"pending": "id", "id": 7})
    settings.ARBOR_FILE_MAX_BYTES = 10
    with pytest.raises(TooLarge):
        user_content([{"type": "image_url", "image_url": {"url": PNG_URL}}], "m")


def test_x1_items_added_to_an_openai_conversation_keep_their_files_as_the_callers(client, user):
    conversation = client.conversations.create(items=[{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Remember this picture"},
        {"type": "input_image", "image_url": PNG_URL, "detail": "auto"}]}])
    (stored,) = StoredFile.objects.filter(owner=user)
    answered = client.responses.create(model=MODEL, conversation=conversation.id, input="What did I send?")
    assert "user:Remember this picture [image image-1.png]" in answered.output_text
    assert SentFile.objects.filter(file=stored).exists() and str(SentFile.objects.get(file=stored)).startswith("file")


def test_x1_anthropic_pdf_by_base64_and_a_file_by_id(asgi_server, key, api):
    from pathlib import Path

    from conversations.jobs import worker

    kept = api.post("/api/files/", {"file": _upload("memo.txt", b"Memo: call Ada.")}, format="multipart").json()
    worker.run_due()
    pdf = (Path(__file__).resolve().parent.parent / "fixtures" / "files" / "hello-world.pdf").read_bytes()
    client = anthropic.Anthropic(api_key=key, base_url=asgi_server.url, max_retries=0)
    message = client.messages.create(model=MODEL, max_tokens=256, messages=[{"role": "user", "content": [
        {"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                        "data": base64.b64encode(pdf).decode()}},
        {"type": "document", "source": {"type": "file", "file_id": f"file-{kept['id']}"}},
        {"type": "text", "text": "Read both"}]}])
    assert "[file file-1.pdf: English:\nHello World\nArabic:\nم] [file memo.txt: Memo: call Ada.]" in \
        message.content[0].text
    with pytest.raises(anthropic.BadRequestError, match="fetches nothing"):
        client.messages.create(model=MODEL, max_tokens=64, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}]}])


def test_x1_a_malformed_upload_under_daphne_gets_the_apis_json_error(asgi_server, key):
    """Daphne (Twisted) would answer a malformed multipart body itself, an empty 400 (found by the fuzz); Django
    reads uploads, so the refusal says what is wrong."""
    import httpx

    response = httpx.post(f"{asgi_server.url}/api/files/", content=b"--b--\r\n", headers={
        "Authorization": f"Token {key}", "Content-Type": "multipart/form-data; boundary=b"})
    assert response.status_code == 400 and response.json()["error"]["code"] == "bad_input"
    assert StoredFile.objects.count() == 0


def test_x1_a_resent_list_naming_its_file_by_id_extends_the_path(client, api, user):
    """A file named by id is matched as its bytes: the resent list continues its conversation, no copy."""
    kept = api.post("/api/files/", {"file": _upload("memo.txt", b"Memo: call Ada.")}, format="multipart").json()
    from conversations.jobs import worker

    worker.run_due()
    question = {"role": "user", "content": [{"type": "text", "text": "Read"},
                                            {"type": "file", "file": {"file_id": f"file-{kept['id']}"}}]}
    first = client.chat.completions.create(model=MODEL, messages=[question])
    again = client.chat.completions.create(model=MODEL, messages=[
        question, {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "More"}])
    assert Node.objects.get(pk=int(again.id.removeprefix("chatcmpl-"))).parent_id == int(
        first.id.removeprefix("chatcmpl-"))


def test_x1_too_many_files_or_one_not_yours_is_refused_before_any_bytes_are_kept(client, settings):
    parts = [{"type": "text", "text": "look"}, *({"type": "file", "file": {
        "filename": f"n{i}.txt", "file_data": "data:text/plain;base64," + base64.b64encode(f"n{i}".encode()).decode()}}
        for i in range(11))]
    with pytest.raises(openai.BadRequestError, match="at most 10 files"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": parts}])
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
            *parts[:2], {"type": "file", "file": {"file_id": "file-999999"}}]}])
    assert StoredFile.objects.count() == 0


def test_x1_a_call_may_carry_a_file_larger_than_djangos_body_limit_and_no_more_than_its_own(client, settings):
    """A photo of a few MB comes inside a /v1 body as base64: the gateway reads bodies up to
    ARBOR_GATEWAY_MAX_BODY_BYTES (Django's 2.5 MB stays the bound everywhere else)."""
    notes = b"Line of notes.\n" * 200_000  # 3 MB
    answer = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
        {"type": "text", "text": "Read"},
        {"type": "file", "file": {"filename": "big.txt",
                                  "file_data": "data:text/plain;base64," + base64.b64encode(notes).decode()}}]}])
    assert "[file big.txt" in answer.choices[0].message.content
    assert StoredFile.objects.get(name="big.txt").size == len(notes)


def test_x1_a_call_body_past_the_gateways_bound_is_refused(key, settings):
    from django.test import Client

    settings.ARBOR_GATEWAY_MAX_BODY_BYTES = 1000
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x" * 2000}]}
    response = Client().post("/v1/chat/completions", body, content_type="application/json",
                             headers={"Authorization": f"Bearer {key}"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "too_large"
    assert Node.objects.count() == 0


@pytest.mark.django_db
def test_x1_a_refused_gateway_call_keeps_none_of_the_files_its_parts_made(user, monkeypatch):
    """The image's bytes are stored before the turn can start; the turn is then refused (402, the month's budget
    is spent): the call changes nothing, so the file it made goes again, bytes and all, by the worker a minute
    later (another request that took the same bytes meanwhile has its call recorded by then). A file the person
    had before, named by the call, stays."""
    from django.core.files.storage import default_storage
    from rest_framework.test import APIClient

    from conversations.jobs import worker
    from conversations.models import UsageBudget
    from files import services
    from files.services import file_upload

    monkeypatch.setattr(services, "DROP_AFTER_SECONDS", 0.0)

    before = file_upload(user=user, name="mine.png", data=png(2, 2))
    UsageBudget.objects.create(owner=user, monthly_tokens=0)
    v1 = APIClient()
    v1.credentials(HTTP_AUTHORIZATION="Bearer " + Token.objects.create(user=user).key)
    picture = "data:image/png;base64," + base64.b64encode(png(4, 4)).decode()
    refused = v1.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": picture}},
        {"type": "file", "file": {"file_id": f"file-{before.pk}"}}]}]}, format="json")
    assert refused.status_code == 402, refused.content
    worker.run_due()
    assert list(StoredFile.objects.values_list("pk", flat=True)) == [before.pk]
    assert sorted(default_storage.listdir(f"files/{user.pk}")[1]) == [before.sha256], "the new bytes went too"
    assert Node.objects.count() == 0


@pytest.mark.django_db
def test_x1_a_gateway_call_that_failed_at_the_model_keeps_the_files_its_node_sent(user, monkeypatch):
    """The call reached the model and failed (502): its node is recorded with the file it sent, which stays."""
    from rest_framework.test import APIClient

    from conversations.jobs import worker
    from files import services

    monkeypatch.setattr(services, "DROP_AFTER_SECONDS", 0.0)

    v1 = APIClient()
    v1.credentials(HTTP_AUTHORIZATION="Bearer " + Token.objects.create(user=user).key)
    picture = "data:image/png;base64," + base64.b64encode(png(5, 5)).decode()
    failed = v1.post("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "#fail"}, {"type": "image_url", "image_url": {"url": picture}}]}]}, format="json")
    assert failed.status_code == 502, failed.content
    worker.run_due()  # the drop of a refused call's files comes a minute later: it leaves a sent file alone
    (stored,) = StoredFile.objects.all()
    assert SentFile.objects.filter(file=stored).exists(), "the failed node keeps its question's file (F1)"


def test_x1_count_tokens_counts_an_image_as_a_call_does_not_as_its_base64(asgi_server, key):
    """`/v1/messages/count_tokens` with an image: its fixed cost (files.services.IMAGE_TOKENS), whatever its size
    in base64; nothing is stored."""
    from files.services import IMAGE_TOKENS

    client = anthropic.Anthropic(api_key=key, base_url=asgi_server.url, max_retries=0,
                                 _strict_response_validation=True)
    big = base64.b64encode(png(300, 300)).decode()
    small = base64.b64encode(png(2, 2)).decode()
    counts = [client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}},
        {"type": "text", "text": "what is it?"}]}]).input_tokens for data in (big, small)]
    plain = client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": "what is it?"}])
    assert counts[0] == counts[1] and IMAGE_TOKENS <= counts[0] - plain.input_tokens < IMAGE_TOKENS + 20
    assert not StoredFile.objects.exists()


def test_x1_count_tokens_counts_a_document_named_by_its_file_id_as_a_call_sends_it(asgi_server, key, api,
                                                                                   other_api):
    """A document named by `file_id` counts its extracted text as a call sends it, the same as the same text sent
    inline would; another person's file is a 404 in Anthropic's shape, and nothing is stored or recorded."""
    from conversations.jobs import worker
    from files.services import reference

    memo = b"Memo: call Ada about the venue, the budget and the date. " * 40
    kept = api.post("/api/files/", {"file": _upload("memo.txt", memo)}, format="multipart").json()
    theirs = other_api.post("/api/files/", {"file": _upload("theirs.txt", b"not yours")}, format="multipart").json()
    worker.run_due()
    client = anthropic.Anthropic(api_key=key, base_url=asgi_server.url, max_retries=0,
                                 _strict_response_validation=True)

    def counted(*blocks) -> int:
        return client.messages.count_tokens(model=MODEL, messages=[{"role": "user", "content": [
            *blocks, {"type": "text", "text": "Read it"}]}]).input_tokens

    plain = counted()
    by_id = counted({"type": "document", "source": {"type": "file", "file_id": f"file-{kept['id']}"}})
    assert by_id - plain == reference(StoredFile.objects.get(pk=kept["id"]))["tokens"] > len(memo) // 8, \
        "its text, as a call sends it"
    twice = counted(*[{"type": "document", "source": {"type": "file", "file_id": f"file-{kept['id']}"}}] * 2)
    assert twice == by_id, "named twice, sent once"
    with pytest.raises(anthropic.NotFoundError):
        counted({"type": "document", "source": {"type": "file", "file_id": f"file-{theirs['id']}"}})
    assert not Node.objects.exists() and StoredFile.objects.count() == 2
