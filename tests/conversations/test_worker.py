"""The post-commit worker (R4): at least once, idempotent, retried with backoff, never lost."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.core.management import call_command
from django.utils import timezone

from conversations import outbox, services
from conversations.jobs import worker
from conversations.models import Node, OutboxJob
from conversations.screen import path_bubbles
from conversations.turns.seen import call_context
from search.models import BubbleDocument
from tests.conversations.helpers import ask, head
from tests.support.openai_stub import Reply

pytestmark = pytest.mark.django_db


def test_r4_a_committed_turn_queues_one_job_per_kind_the_worker_runs_once(conversation):
    ask(conversation, "hello there")
    queued = OutboxJob.objects.order_by("kind")
    assert [(j.kind, j.status, j.payload["conversation"]) for j in queued] == [
        ("embed", "pending", conversation.pk), ("index", "pending", conversation.pk),
        ("title", "pending", conversation.pk)]
    assert not BubbleDocument.objects.exists(), "nothing is indexed inside the turn itself"
    stats = worker.run_due()
    assert (stats.done, stats.retried, stats.failed) == (3, 0, 0)
    assert [(j.status, j.attempts) for j in queued.all()] == [("done", 1), ("done", 1), ("done", 1)]
    assert BubbleDocument.objects.count() == 2, "the question and the answer"
    assert worker.run_due().total == 0, "a done job does not run again"


def test_r4_running_a_job_twice_changes_nothing_more(conversation):
    """At least once: the handler is idempotent, so a job re-run after a crash leaves one index entry per bubble."""
    ask(conversation, "hello")
    job = OutboxJob.objects.get(kind="index")
    for _ in range(2):
        outbox.handler_for("index")(job.payload)
        outbox.handler_for("title")(job.payload)
    assert BubbleDocument.objects.count() == 2


def test_r4_a_crashed_job_is_claimed_again_when_its_lease_runs_out(conversation, settings):
    ask(conversation, "hello")
    OutboxJob.objects.exclude(kind="index").delete()  # one job is enough here
    (claimed,) = worker.claim(limit=10)  # a worker claims it, then dies without a word
    assert worker.claim(limit=10) == [], "the lease keeps other workers off it"
    OutboxJob.objects.filter(pk=claimed.pk).update(run_after=timezone.now() - timedelta(seconds=1))
    stats = worker.run_due()
    claimed.refresh_from_db()
    assert stats.done == 1 and (claimed.status, claimed.attempts) == ("done", 2)


def test_r4_a_job_whose_worker_dies_every_time_ends_failed_not_retried_for_ever(conversation, settings):
    settings.ARBOR_WORKER_MAX_ATTEMPTS = 2
    ask(conversation, "hello")
    OutboxJob.objects.exclude(kind="index").delete()  # one job is enough here
    for _ in range(2):  # claimed, then its worker dies: the lease runs out
        (job,) = worker.claim(limit=10)
        OutboxJob.objects.filter(pk=job.pk).update(run_after=timezone.now() - timedelta(seconds=1))
    assert worker.claim(limit=10) == []
    job.refresh_from_db()
    assert job.status == "failed" and "lease ran out" in job.last_error


def test_r4_a_worker_whose_lease_ran_out_does_not_overwrite_the_newer_claim(conversation):
    ask(conversation, "hello")
    OutboxJob.objects.exclude(kind="index").delete()  # one job is enough here
    (stale,) = worker.claim(limit=10)
    OutboxJob.objects.filter(pk=stale.pk).update(run_after=timezone.now() - timedelta(seconds=1))
    (fresh,) = worker.claim(limit=10)
    assert fresh.attempts == stale.attempts + 1
    assert worker.run_job(stale) == "done"  # it did the (idempotent) work, but the record is the new claim's
    fresh.refresh_from_db()
    assert fresh.status == "pending"
    assert worker.run_job(fresh) == "done"
    fresh.refresh_from_db()
    assert fresh.status == "done"


def test_r4_failures_are_retried_with_backoff_then_kept_as_failed(settings, monkeypatch):
    settings.ARBOR_WORKER_MAX_ATTEMPTS = 2
    job = outbox.enqueue(kind="index", payload={"conversation": "not a number"})
    before = timezone.now()
    assert worker.run_due().retried == 1
    job.refresh_from_db()
    assert job.status == "pending" and job.attempts == 1 and "ValueError" in job.last_error
    assert job.run_after >= before + timedelta(seconds=2), "backed off, not hammered"
    OutboxJob.objects.filter(pk=job.pk).update(run_after=timezone.now())
    assert worker.run_due().failed == 1
    job.refresh_from_db()
    assert (job.status, job.attempts) == ("failed", 2)
    unknown = outbox.enqueue(kind="no_such_kind", payload={})
    assert worker.run_due().failed == 1
    unknown.refresh_from_db()
    assert unknown.status == "failed" and "no handler" in unknown.last_error


def test_the_worker_command_runs_what_is_due(conversation, capsys):
    ask(conversation, "hello")
    call_command("arbor_worker", "--once")
    assert "done 3, retried 0, failed 0" in capsys.readouterr().out
    assert set(OutboxJob.objects.values_list("status", flat=True)) == {"done"}


def test_r4_a_new_conversation_gets_a_title_from_a_recorded_side_call(conversation):
    """The title call is a node of kind `title` below the head it read; the head never moves onto it."""
    services.conversation_update(conversation=conversation, title="")
    ask(conversation, "Quarterly revenue by region in Korea please")
    head_before = head(conversation).pk
    worker.run_due()
    conversation.refresh_from_db()
    assert conversation.title == "Quarterly revenue by region in Korea"
    (call,) = Node.objects.filter(kind="title")
    assert (call.parent_id, call.status, call.conversation_id) == (head_before, "succeeded", conversation.pk)
    assert call.usage["prompt_tokens"] > 0 and call.sent[0]["text"].startswith("#title")
    assert conversation.head_id == head_before
    ask(conversation, "next")
    assert head(conversation).parent_id == head_before, "the next turn hangs below the head, not the title call"
    views = path_bubbles(conversation=conversation)
    assert views[0].branch.count == 1, "a title call is no branch"


def test_r4_a_title_set_by_the_person_is_kept(conversation):
    ask(conversation, "something")
    assert conversation.title == "t"
    worker.run_due()
    conversation.refresh_from_db()
    assert conversation.title == "t" and not Node.objects.filter(kind="title").exists()


def test_r4_a_failed_title_call_is_recorded_and_the_job_retried(user, stub):
    conversation = services.conversation_create(owner=user, model="openai/stub-model")
    stub.script(Reply.text("an answer"), Reply.server_error("down"), Reply.text("Sales by region"))
    ask(conversation, "What were sales by region?")
    assert worker.run_due().retried == 1
    failed = Node.objects.get(kind="title")
    assert failed.status == "failed" and failed.failure_reason
    OutboxJob.objects.update(run_after=timezone.now())
    assert worker.run_due().done == 1
    conversation.refresh_from_db()
    assert conversation.title == "Sales by region"
    assert Node.objects.filter(kind="title").count() == 2, "both calls kept"


def test_r4_a_long_untitled_conversation_is_titled_from_its_opening_turns(conversation):
    """The title call reads the first nodes of the path only, and hangs below the last one it read."""
    services.conversation_update(conversation=conversation, title="")
    for n in range(9):
        ask(conversation, f"question number {n}")
    OutboxJob.objects.all().delete()  # only the job below
    outbox.enqueue(kind="title", payload={"conversation": conversation.pk})
    worker.run_due()
    conversation.refresh_from_db()
    assert conversation.title == "question number 0"
    call = Node.objects.get(kind="title")
    assert call.parent_id == Node.objects.filter(conversation=conversation, kind="turn").order_by("id")[5].pk
    assert "question number 6" not in str(call_context(call))
