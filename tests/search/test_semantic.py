"""Issue 18: embeddings after the commit (R4) and hybrid retrieval (R2), through the real litellm path:
arbor/echo-embed (a litellm custom provider) and a loopback OpenAI-compatible server's /v1/embeddings."""

from __future__ import annotations

import json
import math
import time

import pytest
from django.db import connection
from django.urls import reverse

from conversations import llm, services
from conversations.jobs import worker
from conversations.llm.echo import embed as echo_embed
from conversations.models import Bubble, OutboxJob
from conversations.transfer import importing
from conversations.turns.detached import run_here
from search import embedding, vectors
from search.chunks import CHUNK_CHARS, MAX_CHUNKS, chunk_spans
from search.models import ChunkVector
from search.retrieval import hybrid_hits, vector_hits, word_hits
from search.similar import similar_bubbles
from tests.conversations.helpers import ask, command_output, head
from tests.support.openai_stub import STUB_DIMENSIONS, Reply

pytestmark = pytest.mark.django_db

STUB_MODEL = "openai/text-embedding-3-small"


def _cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def _conversation(user, title: str, *questions: str):
    conversation = services.conversation_create(owner=user, title=title)
    for question in questions:
        ask(conversation, question)
    return conversation


# --- the offline embedder ------------------------------------------------------------------------------------

def test_echo_embed_is_deterministic_normalised_and_ranks_shared_word_forms_above_unrelated_text():
    question = "How do I cancel my subscription?"
    paraphrase = "Steps for cancelling a subscripton"  # other word forms and a typo, no word in common
    unrelated = "Quarterly revenue grew in the northern region"
    vq, vp, vu = llm.embed("arbor/echo-embed", [question, paraphrase, unrelated])
    assert len(vq) == echo_embed.DIMENSIONS and math.isclose(math.sqrt(sum(v * v for v in vq)), 1.0, rel_tol=1e-9)
    assert llm.embed("arbor/echo-embed", [question])[0] == vq, "the same text, the same vector"
    assert _cos(vq, vp) > 0.3 > abs(_cos(vq, vu)), (_cos(vq, vp), _cos(vq, vu))
    assert llm.embed("arbor/echo-embed", ["the of and"])[0] == [0.0] * echo_embed.DIMENSIONS, "no word: zeros"


def test_echo_is_not_an_embedding_model():
    with pytest.raises(llm.LLMError, match="not an embedding model"):
        llm.embed("arbor/echo", ["text"])


def test_long_texts_are_cut_into_bounded_pieces_at_boundaries():
    sentence = "The quarterly plan covers every region. "
    text = sentence * 200  # 8,000 characters
    spans = chunk_spans(text)
    assert len(spans) > 1 and all(end - start <= CHUNK_CHARS for start, end in spans)
    assert all(text[end - 1] in ". " for _, end in spans[:-1]), "cut after a sentence"
    assert "".join(text[s:e] for s, e in spans).replace(" ", "") == text.replace(" ", ""), "nothing dropped"
    assert len(chunk_spans("x" * (CHUNK_CHARS * (MAX_CHUNKS + 5)))) == MAX_CHUNKS
    assert chunk_spans("   ") == []


# --- the embed job -------------------------------------------------------------------------------------------

def test_r4_a_committed_turn_queues_its_own_embed_job_and_the_worker_embeds_question_and_answer(user):
    conversation = _conversation(user, "Plans", "How do I cancel my subscription?")
    queued = OutboxJob.objects.filter(payload__conversation=conversation.pk)
    assert {"embed", "index"} <= set(queued.values_list("kind", flat=True)), "a kind of its own"
    assert not ChunkVector.objects.exists(), "nothing is embedded inside the turn"
    worker.run_due()
    bubbles = Bubble.objects.filter(conversation=conversation)
    rows = ChunkVector.objects.filter(bubble__in=bubbles)
    assert {r.bubble_id for r in rows} == {b.pk for b in bubbles if b.role in ("user", "assistant")}
    assert {r.model for r in rows} == {"arbor/echo-embed"} and {r.owner_id for r in rows} == {user.pk}
    question = bubbles.get(role="user")
    stored = ChunkVector.objects.get(bubble=question)
    assert bytes(stored.vector) == vectors.to_bytes(echo_embed.embed_text(question.content))


def test_r4_the_embed_job_is_idempotent_and_long_bubbles_are_embedded_in_pieces(user):
    long_question = " ".join(f"Paragraph {n} is about the renewal of contract number {n}." for n in range(150))
    conversation = _conversation(user, "Long", long_question)
    worker.run_due()
    question = Bubble.objects.get(conversation=conversation, role="user")
    pieces = list(ChunkVector.objects.filter(bubble=question).order_by("chunk").values_list("chunk", "start", "end"))
    assert [(s, e) for _, s, e in pieces] == chunk_spans(question.content) and len(pieces) > 3
    before = sorted(ChunkVector.objects.values_list("pk", flat=True))
    assert embedding.embed_conversation(conversation.pk) == 0, "a second run finds nothing to do"
    embedding.run({"conversation": conversation.pk})
    assert sorted(ChunkVector.objects.values_list("pk", flat=True)) == before


def test_r4_imported_conversations_are_embedded(user):
    # A ChatGPT export, the shape of tests/fixtures/exports/chatgpt's files, cut to one turn.
    export = [{"title": "Imported plan talk", "current_node": "b", "mapping": {
        "root": {"id": "root", "parent": None, "children": ["a"], "message": None},
        "a": {"id": "a", "parent": "root", "children": ["b"], "message": {
            "id": "a", "author": {"role": "user"}, "content": {"content_type": "text", "parts": [
                "How should we renew the enterprise contract?"]}, "create_time": 1}},
        "b": {"id": "b", "parent": "a", "children": [], "message": {
            "id": "b", "author": {"role": "assistant"}, "content": {"content_type": "text", "parts": [
                "Renew it yearly with a discount."]}, "create_time": 2}}}}]
    (imported,) = importing.import_any(owner=user, document=importing.parse(json.dumps(export).encode())).conversations
    assert OutboxJob.objects.filter(kind="embed", payload__conversation=imported.pk).exists()
    worker.run_due()
    assert ChunkVector.objects.filter(conversation=imported).count() == 2


def test_r4_a_failing_embedding_provider_fails_the_job_for_a_retry_and_nothing_is_lost(user, stub, settings):
    settings.ARBOR_EMBEDDING_MODEL = STUB_MODEL
    stub.script(*[Reply.server_error()] * 3)  # the call for both bubbles, then each alone: the provider is down
    conversation = _conversation(user, "Plans", "How do I cancel my subscription?")
    stats = worker.run_due()
    job = OutboxJob.objects.get(kind="embed", payload__conversation=conversation.pk)
    assert stats.retried == 1 and job.status == "pending" and "InternalServerError" in job.last_error
    assert not ChunkVector.objects.exists()
    OutboxJob.objects.filter(pk=job.pk).update(run_after=job.created_at)  # its backoff is over
    worker.run_due()
    job.refresh_from_db()
    assert job.status == "done" and ChunkVector.objects.filter(model=STUB_MODEL).count() == 2
    assert [r for r in stub.requests if "input" in r][-1]["model"] == "text-embedding-3-small"


def test_r4_a_text_the_provider_refuses_is_kept_with_no_vector_and_blocks_nothing(user, stub, settings, caplog):
    settings.ARBOR_EMBEDDING_MODEL = STUB_MODEL
    refusal = Reply.error(400, {"error": {"message": "This input violates our policy.", "type": "invalid_request_error",
                                          "param": "input", "code": None}})
    stub.script(refusal, Reply.text("taken"), refusal)  # both at once, then the question alone, the answer alone
    conversation = _conversation(user, "Plans", "How do I cancel my subscription?")
    stats = worker.run_due()
    assert stats.failed == stats.retried == 0
    question, answer = Bubble.objects.filter(conversation=conversation).order_by("id")
    assert len(bytes(ChunkVector.objects.get(bubble=question).vector)) == STUB_DIMENSIONS * 4
    assert bytes(ChunkVector.objects.get(bubble=answer).vector) == b"", "kept, marked, with no vector"
    assert f"refused bubble {answer.pk} while it took others" in caplog.text
    assert embedding.backfill() is False, "nothing left that blocks the sweep"


def test_a_bubble_let_go_while_it_was_embedded_gets_no_vector_and_no_error(user):
    conversation = _conversation(user, "Plans", "How do I cancel my subscription?")
    (question,) = Bubble.objects.filter(conversation=conversation, role="user")
    Bubble.objects.filter(pk=question.pk).update(conversation=None)  # cleared (T11) after the worker read it
    embedding.embed_bubbles([(question.pk, question.content, conversation.pk, user.pk)], "arbor/echo-embed")
    assert not ChunkVector.objects.filter(bubble=question).exists()


def test_a_new_embedding_model_re_embeds_in_the_background_and_never_mixes_models(user, stub, settings):
    conversation = _conversation(user, "Plans", "How do I cancel my subscription?", "What does the plan cost?")
    worker.run_due()
    assert set(ChunkVector.objects.values_list("model", flat=True)) == {"arbor/echo-embed"}
    settings.ARBOR_EMBEDDING_MODEL = STUB_MODEL
    assert similar_bubbles(user=user, query="cancel subscription") == [], "echo's vectors are not the stub's"
    sweeper = worker.Sweeper(clock=lambda: 0.0)
    assert sweeper.run(), "work found: it comes back at once"
    assert set(ChunkVector.objects.values_list("model", flat=True)) == {"arbor/echo-embed", STUB_MODEL}
    assert sweeper.run(), "then the old model's vectors go"
    assert set(ChunkVector.objects.values_list("model", flat=True)) == {STUB_MODEL}
    assert not sweeper.run(), "nothing left to do"
    assert {len(bytes(v)) for v in ChunkVector.objects.values_list("vector", flat=True)} == {STUB_DIMENSIONS * 4}
    (hit, *_) = similar_bubbles(user=user, query="cancel my subscription?")
    assert hit.conversation == conversation.pk and hit.role == "user"


def test_a_failing_sweep_is_logged_and_tried_again_later(user, stub, settings, caplog):
    _conversation(user, "Plans", "How do I cancel my subscription?")
    worker.run_due()  # its jobs: the index sweep finds nothing left, and the embedding sweep is the one that fails
    settings.ARBOR_EMBEDDING_MODEL = STUB_MODEL
    stub.script(*[Reply.server_error()] * 3)
    now = [0.0]
    sweeper = worker.Sweeper(clock=lambda: now[0])
    assert sweeper.run() is False and "sweep embed-backfill failed" in caplog.text
    assert sweeper.run() is False and stub.pending == 0 and len(stub.requests) == 3, "not again before it is due"
    now[0] = 601.0
    assert sweeper.run() is True and ChunkVector.objects.filter(model=STUB_MODEL).exists()


# --- what is found -------------------------------------------------------------------------------------------

def test_similar_messages_are_the_owners_own_on_every_branch_never_cleared_or_deleted(user, other_user):
    """T8 (every branch), T11 (cleared and deleted conversations are gone), owner-scoped."""
    mine = _conversation(user, "Mine", "How do I cancel my subscription?")
    first = head(mine)
    from conversations.turns.start import turn_edit
    run_here(turn_edit(user=user, conversation_id=mine.pk, node_id=first.pk, content="What is the weather like?"))
    _conversation(other_user, "Theirs", "Cancelling a subscription, step by step")
    cleared = _conversation(user, "Cleared", "Cancellation of subscriptions is final")
    deleted = _conversation(user, "Deleted", "Subscription cancelling policy")
    worker.run_due()
    found = similar_bubbles(user=user, query="cancel subscription")
    assert {h.conversation for h in found} == {mine.pk, cleared.pk, deleted.pk}
    services.conversation_clear(conversation=cleared)
    deleted_pk = deleted.pk
    services.conversation_delete(conversation=deleted)
    assert not ChunkVector.objects.filter(conversation_id=deleted_pk).exists(), "deleted with the conversation"
    (hit,) = [h for h in similar_bubbles(user=user, query="cancel subscription") if h.role == "user"]
    assert hit.conversation == mine.pk and hit.node == first.pk and not hit.on_current_path, "another branch"


def test_a_process_copy_follows_new_and_deleted_rows(user):
    """A copy read before a write sees the write; rows deleted under it are never found."""
    _conversation(user, "A", "Renew the enterprise contract")
    worker.run_due()
    assert similar_bubbles(user=user, query="renew contract")
    b = _conversation(user, "B", "Migrate the billing database")
    worker.run_due()
    assert any(h.conversation == b.pk for h in similar_bubbles(user=user, query="billing database migration"))
    gone = set(ChunkVector.objects.filter(conversation=b).values_list("pk", flat=True))
    ChunkVector.objects.filter(conversation=b).delete()  # no version change: the copy still has them
    assert not any(h.conversation == b.pk for h in similar_bubbles(user=user, query="billing database migration"))
    c = _conversation(user, "C", "Plan the office party in June")
    worker.run_due()
    assert not gone & set(ChunkVector.objects.filter(conversation=c).values_list("pk", flat=True)), "new ids"
    found = similar_bubbles(user=user, query="office party in June")
    assert found and found[0].conversation == c.pk, found
    assert not any(h.conversation == c.pk for h in similar_bubbles(user=user, query="billing database migration"))


def test_hybrid_retrieval_finds_a_paraphrase_full_text_misses_and_keeps_word_hits(user):
    # Misspelt where full-text looks (a long word's first five letters), close where vectors look (trigrams).
    notes = _conversation(user, "Account notes", "Kancelling a zubscription takes effect next month")
    words_only = _conversation(user, "Pricing", "Team subscription prices rise in May")
    worker.run_due()
    question = "How do I cancel my subscription?"
    assert not [h for h in word_hits(user=user, question=question, limit=5, exclude_conversation=None)
                if h.conversation == notes.pk], "no word in common: full-text alone misses it"
    assert [h.conversation for h in vector_hits(user=user, question=question, limit=5,
                                                exclude_conversation=None)][:1] == [notes.pk]
    assert {h.conversation for h in word_hits(user=user, question=question, limit=5,
                                              exclude_conversation=None)} == {words_only.pk}
    fused = hybrid_hits(user=user, question=question, limit=5)
    assert {notes.pk, words_only.pk} <= {h.conversation for h in fused}, "each ranking's hit is kept"
    assert hybrid_hits(user=user, question="zebra giraffe", limit=5) == [], "nothing near, no word: nothing"


def test_r2_a_common_word_chooses_no_candidates_while_a_distinctive_one_is_there(user, other_user, monkeypatch):
    """A question's word in at least COMMON of the person's own messages picks no full-text candidates when the
    question has rarer words: "weekly" in every message would make full-text rank all of them (what cost 100 ms
    at 100,000 pieces, bench_retrieval). Alone, common words still search. Another person's messages count for
    nothing: their many invoices leave "invoice" distinctive for this person."""
    from search import query

    monkeypatch.setattr(query, "COMMON", 6)  # each conversation holds a question and echo's answer with its words
    weekly = [_conversation(user, f"Weekly {n}", f"Weekly standup notes number {n}") for n in range(3)]
    theirs = [_conversation(other_user, f"Theirs {n}", f"Weekly invoice dispute {n}") for n in range(4)]
    invoice = _conversation(user, "Billing", "Weekly invoice audit for the Lisbon office")
    worker.run_due()
    found = word_hits(user=user, question="weekly invoice please", limit=10, exclude_conversation=None)
    assert {h.conversation for h in found} == {invoice.pk}, "the standups share only the common word"
    alone = word_hits(user=user, question="weekly", limit=10, exclude_conversation=None)
    assert {h.conversation for h in alone} == {*(c.pk for c in weekly), invoice.pk}
    assert not {c.pk for c in theirs} & {h.conversation for h in alone}, "another person's are never found"
    # A word found nowhere (a typo, "thanks") is no distinctive word: the common ones still search.
    found = word_hits(user=user, question="weekly standup thanks", limit=10, exclude_conversation=None)
    assert {h.conversation for h in found} == {*(c.pk for c in weekly), invoice.pk}
    found = word_hits(user=user, question="wekly standup", limit=10, exclude_conversation=None)
    assert {h.conversation for h in found} == {c.pk for c in weekly}
    # A distinctive word only the excluded conversation has (a follow-up in it): the common words still search.
    found = word_hits(user=user, question="weekly invoice", limit=10, exclude_conversation=invoice.pk)
    assert {h.conversation for h in found} == {c.pk for c in weekly}
    # Each person's words are counted among their own messages: "invoice" is common for the other person only.
    with connection.cursor() as cursor:
        assert query.distinctive_terms(cursor, ["weekly", "invoice"], owner_id=user.pk) == ["invoice"]
        assert query.distinctive_terms(cursor, ["weekly", "invoice"], owner_id=other_user.pk) == []
    monkeypatch.setattr(query, "COMMON", 100)  # not common any more: every match is a candidate again
    found = word_hits(user=user, question="weekly invoice please", limit=10, exclude_conversation=None)
    assert {h.conversation for h in found} == {*(c.pk for c in weekly), invoice.pk}
    assert found[0].conversation == invoice.pk, "two words beat one"


def test_r2_a_question_gets_a_paraphrase_as_an_ephemeral_item(user):
    notes = _conversation(user, "Account notes", "Cancellng a subscripton takes effect next month")
    worker.run_due()
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True)
    ask(conversation, "How do I cancel my subscription?")
    retrieved = [i for i in head(conversation).sent if i.get("ephemeral")]
    assert retrieved and retrieved[0]["source"]["conversation"] == notes.pk
    assert "subscripton" in retrieved[0]["text"]


def test_r2_a_failing_embedding_provider_falls_back_to_full_text_and_never_stops_the_question(
        user, stub, settings, caplog):
    notes = _conversation(user, "Pricing notes", "Our enterprise tier costs 900 dollars per seat")
    worker.run_due()
    settings.ARBOR_EMBEDDING_MODEL = STUB_MODEL
    stub.script(Reply.server_error())
    conversation = services.conversation_create(owner=user)
    services.conversation_update(conversation=conversation, retrieval=True)
    events = ask(conversation, "What does the enterprise tier cost?")
    assert events[-1].type == "done", events[-1]
    node = head(conversation)
    assert node.status == "succeeded"
    retrieved = [i for i in node.sent if i.get("ephemeral")]
    assert retrieved and retrieved[0]["source"]["conversation"] == notes.pk, "the words still found it"
    assert "vector retrieval failed, full-text only" in caplog.text


def test_the_search_page_and_api_offer_similar_messages(client, api, user, stub, settings):
    notes = _conversation(user, "Account notes", "Cancellng a subscripton takes effect next month")
    worker.run_due()
    client.force_login(user)
    query = "subscription cancellation policy"  # no message has all three words
    html = client.get(reverse("search"), {"q": query}).content.decode()
    assert "No message has these words." in html
    assert "Similar messages" in html and "Cancellng a subscripton takes effect" in html
    response = api.get("/api/search/", {"q": "cancel subscription", "mode": "similar"})
    assert response.status_code == 200
    (hit, *_) = response.json()["results"]
    assert hit["conversation"] == notes.pk and 0.3 <= hit["rank"] <= 1.0
    assert api.get("/api/search/", {"q": "x", "mode": "vectors"}).json()["error"]["code"] == "bad_input"
    settings.ARBOR_EMBEDDING_MODEL = STUB_MODEL
    stub.script(Reply.server_error(), Reply.server_error())
    failed = api.get("/api/search/", {"q": "cancel subscription", "mode": "similar"})
    assert failed.status_code == 503 and failed.json()["error"]["code"] == "embedding_unavailable"
    html = client.get(reverse("search"), {"q": "subscripton"}).content.decode()
    assert "the embedding model did not answer" in html and "<mark>subscripton</mark>" in html.lower()


def test_r4_a_large_import_is_embedded_by_follow_up_jobs_each_within_its_share(user, settings, monkeypatch):
    monkeypatch.setattr(embedding, "JOB_SECONDS_SHARE_OF_LEASE", 0)  # a job's time is up after one unit of work
    settings.ARBOR_EMBEDDING_BATCH = 2
    conversation = _conversation(user, "Many", *[f"Question number {n} about renewals" for n in range(5)])
    embedding.run({"conversation": conversation.pk, "head": None})
    assert ChunkVector.objects.filter(conversation=conversation).values("bubble").distinct().count() == 2
    follow_up = OutboxJob.objects.filter(kind="embed", payload__conversation=conversation.pk, status="pending")
    assert follow_up.count() == 5 + 1, "the turns' own jobs and one follow-up"
    worker.run_due()
    assert ChunkVector.objects.filter(conversation=conversation).count() == 10, "every question and answer"
    assert not OutboxJob.objects.filter(kind="embed", status__in=["pending", "failed"]).exists()


def test_t11_the_sweep_drops_vectors_of_bubbles_a_cleared_conversation_let_go(user):
    """A bubble kept for another conversation's screen (P3) leaves its cleared conversation: its vectors go."""
    conversation = _conversation(user, "Cleared", "Renew the enterprise contract")
    worker.run_due()
    (question,) = Bubble.objects.filter(conversation=conversation, role="user")
    Bubble.objects.filter(pk=question.pk).update(conversation=None)  # what conversation_clear does for P3 nodes
    assert ChunkVector.objects.filter(bubble=question).exists()
    assert question.pk not in [h.bubble for h in similar_bubbles(user=user, query="renew enterprise contract")]
    assert embedding.backfill() is True
    assert not ChunkVector.objects.filter(bubble=question).exists()


def test_r2_a_hanging_embedding_provider_costs_a_question_the_retrieval_timeout_then_words(
        user, stub, settings, monkeypatch):
    from search import retrieval

    _conversation(user, "Pricing notes", "Our enterprise tier costs 900 dollars per seat")
    worker.run_due()
    settings.ARBOR_EMBEDDING_MODEL = STUB_MODEL
    monkeypatch.setattr(retrieval, "QUERY_TIMEOUT_SECONDS", 0.5)
    stub.script(Reply.hang(5))
    started = time.monotonic()
    found = retrieval.hybrid_hits(user=user, question="What does the enterprise tier cost?", limit=3)
    assert time.monotonic() - started < 3 and found, "words answered once the embedding call timed out"


def test_the_worker_once_runs_the_sweeps_too(user):
    """Cron-style `arbor_worker --once` embeds what no job did (here: jobs that ran out of attempts)."""
    conversation = _conversation(user, "Plans", "How do I cancel my subscription?")
    OutboxJob.objects.filter(kind="embed").update(status="failed", last_error="gave up")
    command_output("arbor_worker", "--once")
    assert ChunkVector.objects.filter(conversation=conversation).count() == 2


def test_similar_messages_need_an_embedding_model(api, user, settings):
    settings.ARBOR_EMBEDDING_MODEL = ""
    response = api.get("/api/search/", {"q": "cancel subscription", "mode": "similar"})
    assert response.status_code == 503 and "ARBOR_EMBEDDING_MODEL" in response.json()["error"]["message"]
    assert api.get("/api/search/", {"q": "cancel subscription"}).status_code == 200, "words still work"
