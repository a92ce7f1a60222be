"""The chat pages over HTTP: access, the forms that change things, and what the pages show."""

from __future__ import annotations

import re
from html import unescape

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from conversations import services
from conversations.locks import TurnLock
from conversations.models import Bubble, Conversation, Node
from conversations.turns.detached import run_here
from conversations.turns.start import turn_edit, turn_regenerate
from conversations.web.markdown import render_markdown
from tests.conversations.helpers import ask, head

pytestmark = pytest.mark.django_db


def _conversation_urls(conversation_id: int) -> list[tuple[str, str]]:
    return [
        ("get", reverse("chat-conversation", args=[conversation_id])),
        ("get", reverse("chat-messages", args=[conversation_id])),
        ("get", reverse("chat-compare", args=[conversation_id]) + "?a=1&b=2"),
        ("post", reverse("chat-switch", args=[conversation_id])),
        ("post", reverse("chat-update", args=[conversation_id])),
        ("post", reverse("chat-clear", args=[conversation_id])),
        ("post", reverse("chat-delete", args=[conversation_id])),
    ]


def test_pages_need_a_signed_in_person(conversation):
    for method, url in [*_conversation_urls(conversation.pk), ("get", reverse("chat")),
                        ("get", reverse("preferences"))]:
        response = getattr(Client(), method)(url)
        assert response.status_code == 302 and response.url.startswith("/accounts/login/"), url


def test_anyone_elses_conversation_and_node_are_not_found_and_unchanged(page, other_user):
    """Access: another person's conversation is a 404 on every page and form, and nothing changes."""
    theirs = services.conversation_create(owner=other_user, title="private")
    ask(theirs, "secret")
    head_before = head(theirs).pk
    for method, url in _conversation_urls(theirs.pk):
        assert getattr(page, method)(url, {"node": head_before, "title": "mine"}).status_code == 404, url
    assert page.get(reverse("chat-seen", args=[head_before])).status_code == 404
    theirs.refresh_from_db()
    assert (theirs.title, theirs.head_id) == ("private", head_before)
    assert Bubble.objects.filter(conversation=theirs).count() == 2


def test_the_chat_page_shows_the_path_with_branch_arrows_and_sanitised_markdown(page, conversation):
    """T8: the page shows the path's bubbles; an edited question shows k/n with arrows and a compare link."""
    ask(conversation, "first <script>alert(1)</script>")
    first = head(conversation)
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=first.pk,
                    content="second **bold**"))
    html = page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode()
    assert "2/2" in html and 'aria-label="Previous version of this question"' in html
    assert "echo: second **bold**" not in html and "<strong>bold</strong>" in html, "answers render as Markdown"
    assert f"?a={head(conversation).pk}&amp;b={first.pk}" in html
    assert "first &lt;script&gt;" not in html, "the old branch is not on the path"
    response = page.get(reverse("chat-conversation", args=[conversation.pk]))
    assert "script-src 'self'" in response["Content-Security-Policy"]


def test_switch_moves_the_head_to_the_other_branch_and_is_refused_while_a_turn_runs(page, conversation):
    """T8, T9: the arrows' form moves the head to the branch's latest tip; during a turn it changes nothing."""
    ask(conversation, "one")
    first = head(conversation)
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=first.pk,
                    content="two"))
    second = head(conversation)
    url = reverse("chat-switch", args=[conversation.pk])

    lock = TurnLock.acquire(conversation)
    response = page.post(url, {"node": first.pk}, follow=True)
    assert head(conversation).pk == second.pk
    assert "A turn is running" in response.content.decode()
    lock.release()

    page.post(url, {"node": first.pk})
    assert head(conversation).pk == first.pk
    response = page.post(url, {"node": "not a node"}, follow=True)
    assert "must be a node id" in response.content.decode() and head(conversation).pk == first.pk


def test_issue_26_t8_open_its_branch_from_search_shows_that_branch_even_with_a_star(page, conversation):
    """Issue 26: search's "Open its branch" (a switch whose redirect the browser makes with the search page as
    Referer) opened the starred branch instead of the hit's whenever the conversation had a star."""
    from conversations import services

    ask(conversation, "the starred question")
    starred = head(conversation)
    services.branch_mark(node=starred, starred=True)
    run_here(turn_edit(user=conversation.owner, conversation_id=conversation.pk, node_id=starred.pk,
                       content="the question search found"))
    found = head(conversation)
    services.head_switch(conversation=conversation, node_id=starred.pk)
    response = page.post(reverse("chat-switch", args=[conversation.pk]), {"node": found.pk}, follow=True,
                         HTTP_REFERER="http://testserver/search/?q=found")
    assert head(conversation).pk == found.pk and "the question search found" in response.content.decode()
    page.get(reverse("chat-conversation", args=[conversation.pk]), HTTP_REFERER="http://testserver/")
    assert head(conversation).pk == starred.pk, "opened afresh later, it opens on its star again"


def test_rename_model_and_instructions_use_the_apis_rules_and_bad_input_changes_nothing(page, conversation, settings):
    settings.ARBOR_MODELS = ["arbor/echo", "openai/gpt-4o-mini"]
    url = reverse("chat-update", args=[conversation.pk])
    page.post(url, {"title": "Sales", "model": "openai/gpt-4o-mini", "instructions": "Be brief."})
    conversation.refresh_from_db()
    assert (conversation.title, conversation.model, conversation.instructions) == (
        "Sales", "openai/gpt-4o-mini", "Be brief.")
    response = page.post(url, {"title": "x" * 201, "model": "nope/model"}, follow=True)
    assert "Nothing was changed" in response.content.decode() and "Unknown model" in response.content.decode()
    conversation.refresh_from_db()
    assert (conversation.title, conversation.model) == ("Sales", "openai/gpt-4o-mini")


def test_clear_and_delete(page, conversation, user):
    """T11: clear drops the head and the bubbles; delete removes the conversation."""
    ask(conversation, "hello")
    page.post(reverse("chat-clear", args=[conversation.pk]))
    conversation.refresh_from_db()
    assert conversation.head_id is None and not Bubble.objects.filter(conversation=conversation).exists()
    assert page.get(reverse("chat-messages", args=[conversation.pk])).content.decode().count("msg user") == 0
    response = page.post(reverse("chat-delete", args=[conversation.pk]))
    assert response.url == reverse("chat") and not Conversation.objects.filter(pk=conversation.pk).exists()


def test_new_chat_reuses_an_untouched_empty_conversation(page, user):
    first = page.post(reverse("chat-new")).url
    assert page.post(reverse("chat-new")).url == first
    assert Conversation.objects.filter(owner=user).count() == 1
    conversation = Conversation.objects.get(owner=user)
    ask(conversation, "hi")
    assert page.post(reverse("chat-new")).url != first
    assert page.get(reverse("chat")).url != first, "/chat/ opens the newest conversation"


def test_what_the_model_saw_is_the_exact_context_of_that_call(page, conversation):
    """T5: the panel shows call_context(node): the path to the parent, then what the call added."""
    services.conversation_update(conversation=conversation, instructions="Be brief.")
    ask(conversation, "one")
    ask(conversation, "two <b>")
    html = page.get(reverse("chat-seen", args=[head(conversation).pk]), headers={"X-Fragment": "1"}).content.decode()
    assert "<html" not in html, "the fragment for the panel"
    roles = [chunk.split("<", 1)[0].strip() for chunk in html.split('<h3>')[1:]]
    assert roles == ["system", "user", "assistant", "user"]
    assert "two &lt;b&gt;" in html and "Be brief." in html
    assert "<html" in page.get(reverse("chat-seen", args=[head(conversation).pk])).content.decode()


def test_issue_27_what_the_model_saw_shows_the_tools_and_settings_that_went_on_the_wire(page, conversation):
    """Issue 27 (T5): beside the messages, the panel shows what the call sent with them, from the node's own
    record (`llm.wire_settings`): its max_tokens and every tool with its description and parameters; calls that
    sent the same share one record."""
    from conversations import llm
    from conversations.models import CallSettings

    ask(conversation, "one")
    ask(conversation, "two")
    node = head(conversation)
    html = page.get(reverse("chat-seen", args=[node.pk]), headers={"X-Fragment": "1"}).content.decode()
    sent = node.call_settings.settings
    assert sent["max_tokens"] == llm.answer_reserve(conversation.effective_model)
    assert f"<dt>max_tokens</dt><dd><code>{sent['max_tokens']}</code></dd>" in html
    names = [tool["function"]["name"] for tool in sent["tools"]]
    assert "sql_query" in names and all(f"<strong>{name}</strong>" in html for name in names)
    assert "&quot;sql&quot;" in html, "each tool's parameters as they were sent"
    assert CallSettings.objects.count() == 1, "two calls that sent the same keep one record"


def test_compare_shows_two_branches_of_the_same_question_and_refuses_anything_else(page, conversation):
    ask(conversation, "left question")
    left = head(conversation)
    run_here(turn_regenerate(user=conversation.owner, conversation_id=conversation.pk))
    right = head(conversation)
    url = reverse("chat-compare", args=[conversation.pk])
    html = page.get(f"{url}?a={left.pk}&b={right.pk}").content.decode()
    assert html.count('class="column"') == 2 and "Version 1 of 2" in html and "Version 2 of 2" in html
    response = page.get(f"{url}?a={left.pk}&b={left.pk}", follow=True)
    assert "not different branches" in response.content.decode()


def test_compare_never_shows_another_persons_branches(page, conversation, other_user):
    theirs = services.conversation_create(owner=other_user)
    ask(theirs, "their secret question")
    first = head(theirs)
    run_here(turn_regenerate(user=other_user, conversation_id=theirs.pk))
    url = reverse("chat-compare", args=[conversation.pk])
    response = page.get(f"{url}?a={first.pk}&b={head(theirs).pk}")
    assert response.status_code == 404 and "their secret" not in response.content.decode()


def test_a_persons_instructions_are_saved_and_too_long_ones_refused(page, user, conversation):
    page.post(reverse("preferences"), {"instructions": "Answer in English."})
    assert "seen: system:Answer in English." in ask(conversation, "hi")[-1].data["answer"]
    response = page.post(reverse("preferences"), {"instructions": "x" * 20001}, follow=True)
    assert "Nothing was changed" in response.content.decode()
    assert 'Answer in English.</textarea>' in response.content.decode()


def test_a_failed_call_offers_retry_and_an_overflow_explains_itself(page, conversation):
    """F1: a failed call at the head shows Retry; F2: an overflowed question, off the path, is explained."""
    ask(conversation, "#fail")
    html = page.get(reverse("chat-messages", args=[conversation.pk])).content.decode()
    assert 'data-action="retry"' in html and "The model provider failed. Retry?" in html
    assert "<summary>Details</summary><pre>" in html and "#fail asked for a provider error" in html, (
        "issue 16: the provider's words behind a disclosure")
    ask(conversation, "#overflow")
    html = page.get(reverse("chat-messages", args=[conversation.pk])).content.decode()
    assert "did not fit in the model's input limit" in html
    overflowed = Node.objects.filter(conversation=conversation, failure_reason="context_overflow").get()
    assert head(conversation).pk == overflowed.parent_id


def test_markdown_keeps_model_html_out_of_the_page():
    html = str(render_markdown('<img src=x onerror=alert(1)> [x](javascript:alert(1)) ![i](https://e.x/i.png)\n'
                               "```\n<script>\n```"))
    assert "<img" not in html and "<script" not in html and 'href="javascript' not in html
    assert "&lt;img src=x onerror=alert(1)&gt;" in html and "&lt;script&gt;" in html


def test_compact_button_keeps_the_history_on_screen_and_locks_edits_before_it(page, conversation, settings):
    """C2, T10: compacting from the page moves the head to a compaction node; the page still shows every
    earlier bubble, marks where compaction happened, and offers no ✎ or ↻ before it."""
    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    for question in ("one", "two", "three"):
        ask(conversation, question)
    response = page.post(reverse("chat-compact", args=[conversation.pk]), follow=True)
    assert "Compacted" in response.content.decode()
    root = head(conversation)
    assert root.kind == "compaction" and root.parent_id is None and root.compacted_from_id is not None
    ask(conversation, "four")
    html = page.get(reverse("chat-messages", args=[conversation.pk])).content.decode()
    assert html.count('class="msg user"') == 4 and 'class="compaction-marker"' in html
    before, after = html.split('class="compaction-marker"')
    assert 'data-action="edit"' not in before and 'data-action="regenerate"' not in before
    assert after.count('data-action="edit"') == 1 and after.count('data-action="regenerate"') == 1
    assert reverse("chat-seen", args=[root.pk]) in html
    seen = page.get(reverse("chat-seen", args=[root.pk]), headers={"X-Fragment": "1"}).content.decode()
    assert "&lt;arbor-compaction:" in seen and "<pre>three</pre>" in seen, "the opaque summary, then the kept turn"


def test_export_links_and_the_import_page_round_trip(page, conversation):
    ask(conversation, "carry me over")
    html = page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode()
    url = reverse("conversation-export", args=[conversation.pk])
    assert f"{url}?format=md" in html and f"{url}?format=chatgpt" in html
    exported = page.get(f"{url}?format=json")
    assert exported.status_code == 200
    upload = SimpleUploadedFile("tree.json", b"".join(exported.streaming_content), content_type="application/json")
    response = page.post(reverse("chat-import"), {"file": upload})
    copy = Conversation.objects.exclude(pk=conversation.pk).get()
    assert response.url == reverse("chat-conversation", args=[copy.pk])
    assert [b.content for b in Bubble.objects.filter(conversation=copy).order_by("id")][0] == "carry me over"
    bad = SimpleUploadedFile("bad.json", b"[[[", content_type="application/json")
    response = page.post(reverse("chat-import"), {"file": bad}, follow=True)
    assert "not valid JSON" in response.content.decode() and Conversation.objects.count() == 2


def test_what_the_model_saw_for_an_anthropic_call_shows_text_parts(page, conversation):
    """C4: Anthropic's cache marker turns a message's content into a list of parts; the panel shows their text."""
    ask(conversation, "first")
    node = Node.objects.create(parent=head(conversation), conversation=conversation, kind="turn", status="succeeded",
                               sent=[{"type": "user", "text": "second"}], provider="anthropic",
                               model="anthropic/claude-sonnet-4-5")
    response = page.get(reverse("chat-seen", args=[node.pk]), headers={"X-Fragment": "1"})
    html = response.content.decode()
    assert response.status_code == 200 and "<pre>first</pre>" in html and "<pre>second</pre>" in html
    assert "cache_control" not in html


def _earlier_link(html: str) -> str | None:
    found = re.search(r'data-earlier="([^"]+)"', html)
    return unescape(found.group(1)) if found else None


def test_a_long_conversation_shows_its_end_and_loads_earlier_pages_one_at_a_time(page, conversation, settings):
    """Issue 13: the chat page reads the end of a long history only (its cost follows ARBOR_SCREEN_NODES); "show
    earlier" loads the page before it (ARBOR_PAGE_NODES nodes), whose own link goes further back, until the first
    question; nothing twice, in order. Edit controls and arrows still work on what is shown (T7, T8)."""
    settings.ARBOR_SCREEN_NODES = 3
    settings.ARBOR_PAGE_NODES = 1
    for n in range(5):
        ask(conversation, f"question {n}")
    html = page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode()
    assert "Show earlier messages" in html
    assert '<div class="body plain">question 1</div>' not in html
    assert '<div class="body plain">question 4</div>' in html
    assert html.count('data-action="edit"') == 3
    shown = []
    link = _earlier_link(html)
    while link:
        fragment = page.get(link, headers={"X-Fragment": "1"}).content.decode()
        shown = re.findall(r'<div class="body plain">(question \d)</div>', fragment) + shown
        assert fragment.count('data-action="edit"') == 1, "what an earlier page shows can be edited too (T7)"
        link = _earlier_link(fragment)
    assert shown == ["question 0", "question 1"]
    whole = page.get(_earlier_link(html)).content.decode()  # without the fragment header: a page of its own
    assert "<!doctype html>" in whole and "question 1" in whole and "Back to the latest messages" in whole


def test_an_earlier_link_is_only_good_for_its_own_conversation(page, user, conversation, settings):
    """Issue 13: the earlier page's link names a node to read back from; it is signed for its conversation, so
    no one reads another history by changing it."""
    settings.ARBOR_SCREEN_NODES = 1
    for n in range(3):
        ask(conversation, f"question {n}")
    link = _earlier_link(page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode())
    other = services.conversation_create(owner=user)
    forged = link.replace(f"/chat/{conversation.pk}/", f"/chat/{other.pk}/")
    response = page.get(forged, headers={"X-Fragment": "1"})
    assert response.status_code == 404 and "question" not in response.content.decode()
    tampered = page.get(link.replace("cursor=", "cursor=x"), headers={"X-Fragment": "1"})
    assert tampered.status_code == 404


def test_issue_16_first_run_points_at_the_chat_with_the_port_actually_used(settings, tmp_path, monkeypatch):
    """scripts/start printed "Log in at /admin/" while people chat at /, and its curl examples named port 8000
    whatever PORT said. The bootstrap prints the chat's address, the admin's, and curl with HOST and PORT."""
    import io

    from django.core.management import call_command

    settings.BASE_DIR = tmp_path
    (tmp_path / "var").mkdir()
    monkeypatch.setenv("PORT", "8123")
    monkeypatch.setenv("HOST", "0.0.0.0")
    out = io.StringIO()
    call_command("arbor_bootstrap", stdout=out)
    printed = out.getvalue()
    assert "Chat:   open http://127.0.0.1:8123/ and sign in as 'arbor'" in printed
    assert "http://127.0.0.1:8123/admin/" in printed and "http://127.0.0.1:8123/api/conversations/" in printed
    assert ":8000" not in printed and "Log in at /admin/" not in printed
    assert (tmp_path / "var" / "first-user-password.txt").read_text().strip() in printed


def test_issue_16_a_wrong_password_keeps_the_name_and_waits_in_the_password_box(client, user):
    html = client.post(reverse("login"), {"username": "ada", "password": "wrong"}).content.decode()
    assert 'name="username" id="id_username" value="ada" autocomplete="username" required>' in html
    assert 'id="id_password" autocomplete="current-password" autofocus required>' in html


def test_issue_16_t10_a_question_frozen_by_a_compaction_says_why_it_cannot_be_edited(page, conversation, settings):
    from conversations.turns.start import turn_compact

    settings.ARBOR_COMPACTION_KEEP_TURNS = 1
    ask(conversation, "before the compaction")
    ask(conversation, "kept word for word")
    turn_compact(user=conversation.owner, conversation_id=conversation.pk)
    ask(conversation, "after the compaction")
    html = page.get(reverse("chat-messages", args=[conversation.pk])).content.decode()
    frozen, live = html.split("after the compaction</div>")[0], html.split("after the compaction</div>")[1]
    assert "so it can't be edited" in frozen and 'data-action="edit"' not in frozen.split("before the compaction")[1]
    assert 'data-action="edit"' in live and "can't be edited" not in live


def test_issue_16_every_page_has_a_favicon(page, conversation):
    html = page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode()
    assert '<link rel="icon" href="/static/arbor/favicon.svg" type="image/svg+xml">' in html


def test_issue_16_a_streaming_answer_is_rendered_by_the_finished_answers_renderer(page, user):
    """The chat page posts the text streamed so far to /chat/render/ and shows what comes back: the same
    sanitised Markdown as a finished answer, highlighting included. Too long: 413 (the page shows plain text).
    Only for a signed-in person, and only with the CSRF token."""
    text = "**hi** <script>x</script>\n```python\nx = 1\n```"
    response = page.post(reverse("chat-render"), data=text, content_type="text/plain")
    assert response.status_code == 200 and response.content.decode() == str(render_markdown(text))
    assert "<script>" not in response.content.decode() and '<span class="n">x</span>' in response.content.decode()
    from conversations.web.pages import LIVE_RENDER_MAX_BYTES

    assert page.post(reverse("chat-render"), data="x" * (LIVE_RENDER_MAX_BYTES + 1),
                     content_type="text/plain").status_code == 413
    assert Client().post(reverse("chat-render"), data=text, content_type="text/plain").status_code == 302
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    assert strict.post(reverse("chat-render"), data=text, content_type="text/plain").status_code == 403


def test_issue_26_a_stopped_answer_is_drawn_as_stopped_not_as_a_failure(page, conversation):
    """Issue 26: a Stop is the person's own choice; its card is a plain "stopped" card with the partial answer,
    not the red failure card a provider error gets."""
    from conversations.models import Bubble

    ask(conversation, "q")
    node = head(conversation)
    Bubble.objects.create(conversation=conversation, node=node, role=Bubble.Role.ERROR, content="stopped by the user",
                          data={"reason": "cancelled", "partial": "half an answer"})
    html = page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode()
    assert 'class="msg stopped reason-cancelled"' in html and 'aria-label="A stopped answer"' in html
    assert "half an answer" in html and "msg error reason-cancelled" not in html


def test_issue_26_a_page_that_is_not_there_is_a_styled_404_with_a_way_back(client, settings):
    """Issue 26: bare unstyled 404 pages. With DEBUG off (production), a missing page is Arbor's own page, styled,
    with links back to the chats and to search."""
    settings.DEBUG = False
    response = client.get("/no/such/page/")
    html = response.content.decode()
    assert response.status_code == 404 and "arbor/chat.css" in html and 'href="/chat/"' in html


def test_issue_26_a_page_keeps_looking_while_a_cut_off_call_waits_for_recovery(page, conversation):
    """Issue 26: after a restart an open page reconnects and redraws; while a call its dead process left pending
    waits for recovery (nobody holds the lock), the page still says a turn runs, so it keeps redrawing until the
    call is marked interrupted and shows its text with Retry."""
    from conversations.models import Node

    ask(conversation, "q1")
    url = reverse("chat-messages", args=[conversation.pk])
    assert 'data-turn-running="0"' in page.get(url, HTTP_X_FRAGMENT="1").content.decode()
    cut = Node.objects.create(conversation=conversation, parent=head(conversation), kind="turn", status="pending",
                              sent=[{"type": "user", "text": "q2"}], received=[{"type": "text", "text": "half"}])
    assert 'data-turn-running="1"' in page.get(url, HTTP_X_FRAGMENT="1").content.decode()
    Node.objects.filter(pk=cut.pk).update(status="failed", failure_reason="interrupted")
    assert 'data-turn-running="0"' in page.get(url, HTTP_X_FRAGMENT="1").content.decode()


def test_issue_26_the_sign_in_page_says_where_the_first_password_is(client):
    """Issue 26 (a newcomer's first hour): the sign-in page says where the first user's password is."""
    html = client.get(reverse("login")).content.decode()
    assert "var/first-user-password.txt" in html and "arbor_bootstrap" in html


def test_issue_26_a_newcomer_lands_in_the_chat_or_signs_in_first_and_is_shown_what_to_try(client, page, conversation):
    """Issue 26 (the first hour): `/` signs a person in and then opens the chat (no developer page); an empty chat
    on the offline model shows prompts to try and says what its `seen:` line means."""
    response = client.get("/")
    assert response.status_code == 302 and response.url == "/accounts/login/?next=/chat/"
    assert "API documentation" in client.get(response.url).content.decode(), "the developers' links moved here"
    assert page.get("/").url == "/chat/"
    html = page.get(reverse("chat-conversation", args=[conversation.pk])).content.decode()
    assert "<code>seen:</code> line" in html and "#tool send_email" in html


def test_issue_26_the_sidebar_tells_chats_playbook_runs_and_api_calls_apart_and_filters_them(page, user, api):
    """Issue 26 (the first hour): the sidebar marks a conversation a /v1 call or a playbook run made, and its
    filter lists one kind; a kind that does not exist is a clear message and changes nothing."""
    chat = services.conversation_create(owner=user, title="my own chat")
    run = services.conversation_create(owner=user, title="Run: weekly report", origin=Conversation.Origin.PLAYBOOK)
    call = services.conversation_create(owner=user, title="made by a script", origin=Conversation.Origin.API)
    assert api.get(f"/api/conversations/{call.pk}/").json()["origin"] == "api"

    def listed() -> list[str]:
        html = page.get(reverse("preferences")).content.decode()
        return [(o, t.strip()) for o, t in re.findall(r'<li class="origin-(\w+)"><a [^>]*>([^<]+)', html)]

    assert sorted(listed()) == sorted([("chat", chat.title), ("playbook", run.title), ("api", call.title)])
    html = page.get(reverse("preferences")).content.decode()
    assert '<span class="origin-tag">API call</span>' in html and '<span class="origin-tag">Playbook</span>' in html
    for shows, title in (("api", call.title), ("playbook", run.title), ("chat", chat.title)):
        response = page.post(reverse("chat-sidebar"), {"shows": shows, "next": "/chat/"})
        assert response.status_code == 302 and response.url == "/chat/"
        assert [t for _, t in listed()] == [title], shows
    response = page.post(reverse("chat-sidebar"), {"shows": "secrets", "next": "/chat/"}, follow=True)
    assert "Show chats, playbook runs, API calls, or all conversations." in response.content.decode()
    assert [t for _, t in listed()] == [chat.title], "a refused filter changes nothing"
    page.post(reverse("chat-sidebar"), {"shows": "", "next": "https://evil.example/"})
    assert len(listed()) == 3


def test_issue_26_a_v1_call_and_a_playbook_run_make_conversations_of_their_kind(user, conversation):
    """Issue 26: where a conversation came from is recorded when it is made: a /v1 call's is an API call, a
    playbook's run a playbook's; a person's own is a chat."""
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    from playbooks.services import playbook_convert, playbook_run

    v1 = APIClient()
    v1.credentials(HTTP_AUTHORIZATION="Bearer " + Token.objects.create(user=user).key)
    response = v1.post("/v1/responses", {"model": "arbor/echo", "input": "hi"}, format="json")
    assert response.status_code == 200, response.content
    made = Node.objects.get(pk=int(response.json()["id"].removeprefix("resp_"))).conversation
    assert made.origin == Conversation.Origin.API
    ask(conversation, "count the customers")
    playbook = playbook_convert(user=user, conversation_id=conversation.pk)
    result = playbook_run(user=user, playbook_id=playbook.pk, values={})
    assert Conversation.objects.get(pk=result.run.conversation_id).origin == Conversation.Origin.PLAYBOOK
    conversation.refresh_from_db()
    assert conversation.origin == Conversation.Origin.CHAT
