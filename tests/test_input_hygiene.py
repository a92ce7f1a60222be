"""Issue 14, low findings: input no column can hold, nesting no decoder should recurse into, and a socket Origin
check that ignored the port.

A NUL character (PostgreSQL text holds none), a lone surrogate (no UTF-8 encodes it), an integer outside the signed
64-bit range and JSON nested 100,000 deep each get a clear 4xx wherever they come in: an API body (400, the API's
JSON error naming the problem and its JSON path), an imported file, a chat socket frame (an error frame, the socket
stays open) or a page's form (the form refused, as the pages refuse bad input). An id in a URL that no database
integer can hold is a 404, like any id that does not exist. A refused request changes nothing.
"""

from __future__ import annotations

import json
import re

import pytest
from channels.testing import WebsocketCommunicator
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import URLResolver, get_resolver

from config.asgi import application
from config.origin import origin_allowed
from conversations.models import Bubble, Conversation, Node, Preferences, ToolApproval
from playbooks import services as playbook_services
from playbooks.models import Playbook, PlaybookRun
from tests.conversations.helpers import ask
from tests.playbooks.helpers import sales_conversation
from tests.support.async_db import in_own_thread
from tests.support.sockets import chat_socket, receive_until, session_cookie

pytestmark = pytest.mark.django_db

HUGE_ID = "99999999999999999999"  # > 2**63 - 1: no id column can hold it
DEEP = "[" * 100_000 + "]" * 100_000

NUL_REFUSED = "a NUL character (\\u0000) cannot be stored"
INT_REFUSED = "expected a whole number from -9223372036854775808 to 9223372036854775807"
# kind -> (the bad value as JSON text, what the error says about it)
BAD_VALUES = {
    "nul": (json.dumps("a\x00b"), NUL_REFUSED),
    "lone-surrogate": (json.dumps("a\ud800b"), "a lone surrogate (\\ud800) is not a character"),
    "int-2**70": (str(2**70), INT_REFUSED),
    "int-minus-2**70": (str(-(2**70)), INT_REFUSED),
    "deep-nesting": (DEEP, "nests deeper than 32 levels"),
}


def _state() -> dict:
    """Everything a refused request must leave as it was."""
    return {
        "conversations": list(Conversation.objects.order_by("pk").values_list(
            "pk", "title", "model", "instructions", "head_id", "version")),
        "nodes": Node.objects.count(), "bubbles": Bubble.objects.count(),
        "approvals": ToolApproval.objects.count(), "playbooks": Playbook.objects.count(),
        "runs": PlaybookRun.objects.count(),
        "preferences": list(Preferences.objects.values_list("user_id", "instructions")),
    }


def _body(valid: dict, key: str, raw: str) -> str:
    """`valid` as JSON text with `key` set to the raw JSON value `raw`."""
    return json.dumps({**valid, key: "__BAD__"}).replace('"__BAD__"', raw)


def _assert_refused(response, needle: str, *, path: str | None, code: str = "bad_input") -> None:
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == code, error
    assert needle in error["message"], error["message"]
    if path is not None:
        assert path in error["message"]
        if code == "bad_input":
            assert error["path"] == path


# --- A, B: API bodies ---------------------------------------------------------------------------------------

# name -> (method, path, a valid body given the conversation's first node, the field the endpoint reads)
ENDPOINTS = {
    "create": ("post", "/api/conversations/", lambda node: {"title": "t"}, "title"),
    "update": ("patch", "/api/conversations/{c}/", lambda node: {"title": "t"}, "title"),
    "turn": ("post", "/api/conversations/{c}/turns/", lambda node: {"content": "q"}, "content"),
    "edit": ("post", "/api/conversations/{c}/edit/", lambda node: {"node": node, "content": "q"}, "content"),
    "regenerate": ("post", "/api/conversations/{c}/regenerate/", lambda node: {"node": node}, "node"),
    "switch": ("post", "/api/conversations/{c}/switch/", lambda node: {"node": node}, "node"),
    "approval": ("post", "/api/conversations/{c}/approvals/",
                 lambda node: {"tool_call_id": "call_1", "approve": True}, "tool_call_id"),
}


@pytest.mark.parametrize("kind", list(BAD_VALUES))
@pytest.mark.parametrize("endpoint", list(ENDPOINTS))
def test_issue_14_low_an_api_body_with_nul_a_surrogate_a_huge_int_or_deep_nesting_is_400_and_changes_nothing(
        api, conversation, endpoint, kind):
    """Issue 14, low: NUL bytes, lone surrogates, integers past 64 bits (PostgreSQL: DataError, encoding error,
    overflow, all 500s) and 100,000-deep nesting (RecursionError, 500) in an API body are refused by the one JSON
    parser (config.api.StrictJSONParser) before the view reads them: 400 `bad_input` naming the value's path."""
    ask(conversation, "hello")
    conversation.refresh_from_db()
    method, path, valid, field = ENDPOINTS[endpoint]
    raw, needle = BAD_VALUES[kind]
    before = _state()
    response = getattr(api, method)(path.format(c=conversation.pk), data=_body(valid(conversation.head_id), field, raw),
                                    content_type="application/json")
    _assert_refused(response, needle, path=None if kind == "deep-nesting" else f"$.{field}")
    assert _state() == before


@pytest.mark.parametrize("kind", list(BAD_VALUES))
def test_issue_14_low_a_bad_value_anywhere_in_a_body_is_refused_an_unknown_field_included(api, conversation, kind):
    """Issue 14, low: the parser reads the whole body, not the fields a view knows: a NUL nested in a field the
    view would ignore (which used to start the turn) is refused just the same, its path named."""
    raw, needle = BAD_VALUES[kind]
    before = _state()
    response = api.post(f"/api/conversations/{conversation.pk}/turns/",
                        data=_body({"content": "q"}, "extra", f'{{"list": [{raw}]}}'), content_type="application/json")
    _assert_refused(response, needle, path=None if kind == "deep-nesting" else "$.extra.list[0]")
    assert _state() == before


@pytest.mark.parametrize(("body", "needle", "path"), [
    pytest.param('{"content": "q", "a\\u0000": 1}', "a key with a NUL character", '$["a\\u0000"]', id="nul-in-a-key"),
    pytest.param('{"content": "q", "\\udfff": 1}', "a key with a lone surrogate (\\udfff)", '$["\\udfff"]',
                 id="surrogate-in-a-key"),
    pytest.param('{"content": "q", "x": 1e999}', "expected a finite number", "$.x", id="float-overflow"),
    pytest.param('{"content": "q", "x": [NaN]}', "expected a finite number", "$.x[0]", id="nan"),
    pytest.param('{"content": "q", "x": -Infinity}', "expected a finite number", "$.x", id="infinity"),
    pytest.param('{"content": "q", "x": 1' + "0" * 5000 + "}", INT_REFUSED, "$.x",
                 id="5000-digits"),
    pytest.param('{"content": "q", "x": 9223372036854775808}', INT_REFUSED, "$.x",
                 id="int64-max-plus-one"),
])
def test_issue_14_low_keys_non_finite_numbers_and_the_int64_edge_are_refused_too(api, conversation, body, needle,
                                                                                  path):
    """Issue 14, low: a key is text too, NaN and infinities are not JSON numbers a column can hold, and the range
    ends exactly at 2**63 - 1."""
    before = _state()
    response = api.post(f"/api/conversations/{conversation.pk}/turns/", data=body, content_type="application/json")
    _assert_refused(response, needle, path=path)
    assert _state() == before


def test_issue_14_low_the_int64_range_itself_and_real_characters_are_read(api):
    """The edges are exact: 2**63 - 1 and -2**63 are read; escaped emoji (a surrogate pair) and U+0001 are text."""
    body = '{"title": "\\ud83d\\ude00 \\u0001 ok", "extra": [9223372036854775807, -9223372036854775808, 1e308]}'
    response = api.post("/api/conversations/", data=body, content_type="application/json")
    assert response.status_code == 201, response.content
    assert Conversation.objects.get(pk=response.json()["id"]).title == "\U0001f600 \x01 ok"


@pytest.fixture
def playbook(conversation):
    sales_conversation(conversation)
    return playbook_services.playbook_convert(user=conversation.owner, conversation_id=conversation.pk)


@pytest.mark.parametrize("kind", list(BAD_VALUES))
def test_issue_14_low_a_playbook_run_with_a_bad_value_is_400_and_runs_nothing(api, playbook, kind):
    """Issue 14, low: a run's `values` go into a JSON column and a prompt; 2**70 as `limit` used to run."""
    raw, needle = BAD_VALUES[kind]
    body = json.dumps({"values": {"month": "2026-09", "limit": "__BAD__"}}).replace('"__BAD__"', raw)
    before = _state()
    response = api.post(f"/api/playbooks/{playbook.pk}/runs/", data=body, content_type="application/json")
    _assert_refused(response, needle, path=None if kind == "deep-nesting" else "$.values.limit")
    assert _state() == before


# --- A, B: imported files --------------------------------------------------------------------------------------


def _tree(text="q", node_id=1, content="q"):
    """Arbor's export file: one turn node and its question's bubble."""
    return {"format": "arbor.tree", "version": 1,
            "conversation": {"title": "imported", "model": "", "instructions": "", "head": node_id},
            "nodes": [{"id": node_id, "parent": None, "kind": "turn", "status": "succeeded",
                       "sent": [{"type": "user", "text": text}], "received": [{"type": "text", "text": "a"}]}],
            "bubbles": [{"node": node_id, "role": "user", "content": content, "data": {}}], "approvals": []}


def _chatgpt(text):
    return [{"title": "c", "mapping": {
        "root": {"parent": None, "message": None},
        "q": {"parent": "root", "message": {"author": {"role": "user"},
                                            "content": {"content_type": "text", "parts": [text]}}}}}]


IMPORTS = [
    pytest.param(json.dumps(_tree(text="a\x00b")), NUL_REFUSED, "$.nodes[0].sent[0].text",
                 id="nul-in-arbor-node-text"),
    pytest.param(json.dumps(_tree(content="a\ud800b")), "is not a character", "$.bubbles[0].content",
                 id="surrogate-in-arbor-bubble"),
    pytest.param(json.dumps(_tree(node_id=2**70)), INT_REFUSED, "$.conversation.head",
                 id="int-2**70-as-arbor-node-id"),
    pytest.param(json.dumps(_chatgpt("a\x00b")), NUL_REFUSED, "$[0].mapping.q.message.content.parts[0]",
                 id="nul-in-chatgpt-message"),
    pytest.param(json.dumps(_chatgpt("\udc00")), "is not a character", "$[0].mapping.q.message.content.parts[0]",
                 id="surrogate-in-chatgpt-message"),
    # LibreChat's files nest two levels a message: an import may nest two levels a node it may hold (issue 28)
    pytest.param("[" * 250_000 + "]" * 250_000, "nests deeper than 200008 levels", None, id="deep-nesting"),
]


@pytest.mark.parametrize(("body", "needle", "path"), IMPORTS)
def test_issue_14_low_an_imported_file_with_a_bad_value_is_refused_and_creates_nothing(api, body, needle, path):
    """Issue 14, low: the importer reads a file with the API's strict decoder: a NUL in a message (stored on
    SQLite, 503 on PostgreSQL), a lone surrogate (500) or an id past 64 bits is 400 `import_refused`, naming
    where it is in the file."""
    before = _state()
    response = api.post("/api/conversations/import/", data=body.encode(), content_type="application/json")
    _assert_refused(response, needle, path=path, code="import_refused")
    assert _state() == before


@pytest.mark.parametrize(("body", "needle", "path"), IMPORTS[:2])
def test_issue_14_low_the_import_page_refuses_the_same_files_and_creates_nothing(page, body, needle, path):
    """Issue 14, low: uploaded through the import page (multipart), the same file is refused with the message
    shown, as the page refuses any bad file; nothing is created."""
    before = _state()
    response = page.post("/chat/import/", {"file": SimpleUploadedFile("export.json", body.encode())}, follow=True)
    html = response.content.decode()
    assert response.redirect_chain and needle in html and path in html
    assert _state() == before


# --- A: ids in URLs ---------------------------------------------------------------------------------------------


def _api_routes_with_ids() -> list[tuple[str, str]]:
    """(method, path) for every /api/ route that takes an id and every method its view answers."""
    found = []

    def walk(patterns, prefix):
        for pattern in patterns:
            route = prefix + str(pattern.pattern)
            if isinstance(pattern, URLResolver):
                walk(pattern.url_patterns, route)
            elif route.startswith("api/") and "<int:" in route:
                view = pattern.callback.cls
                found.extend((method, "/" + route) for method in ("get", "post", "patch", "delete")
                             if hasattr(view, method))

    walk(get_resolver().url_patterns, "")
    return found


API_ROUTES = _api_routes_with_ids()
ANY_BODY = {"content": "q", "node": 1, "title": "t", "tool_call_id": "c", "approve": True, "values": {}}


@pytest.mark.parametrize(("method", "route", "digits"), [
    *((method, route, HUGE_ID) for method, route in API_ROUTES),
    ("get", "/api/conversations/<int:conversation_id>/", "9" * 5000),  # past int()'s 4300 digits
    ("post", "/api/conversations/<int:conversation_id>/turns/", "9" * 5000),
], ids=[*(f"{m}-{r}" for m, r in API_ROUTES), "get-5000-digits", "post-turns-5000-digits"])
def test_issue_14_low_an_id_no_column_can_hold_in_an_api_url_is_a_json_404_and_changes_nothing(
        api, conversation, method, route, digits):
    """Issue 14, low: /api/conversations/99999999999999999999/ and every other /api/ path with an id past 64 bits
    is the API's 404 (`not_found`), like an id that does not exist (none can), on every method; never a 500."""
    assert len(API_ROUTES) >= 20, "every /api/ route with an id is found"
    before = _state()
    response = getattr(api, method)(re.sub(r"<int:\w+>", digits, route), data=ANY_BODY, format="json")
    assert response.status_code == 404, response.content[:300]
    assert response.json()["error"]["code"] == "not_found"
    assert _state() == before


@pytest.mark.parametrize(("method", "path"), [
    ("get", f"/chat/{HUGE_ID}/"), ("get", f"/chat/{HUGE_ID}/messages/"), ("get", f"/chat/{HUGE_ID}/compare/?a=1&b=2"),
    ("post", f"/chat/{HUGE_ID}/update/"), ("post", f"/chat/{HUGE_ID}/switch/"), ("post", f"/chat/{HUGE_ID}/clear/"),
    ("post", f"/chat/{HUGE_ID}/compact/"), ("post", f"/chat/{HUGE_ID}/delete/"),
    ("get", f"/chat/nodes/{HUGE_ID}/seen/"),
    ("get", f"/playbooks/{HUGE_ID}/"), ("get", f"/playbooks/{HUGE_ID}/run/"), ("post", f"/playbooks/{HUGE_ID}/edit/"),
    ("get", f"/playbooks/1/runs/{HUGE_ID}/"), ("post", f"/playbooks/from-conversation/{HUGE_ID}/"),
    pytest.param("get", "/chat/" + "9" * 5000 + "/", id="get-/chat/5000-digits/"),
])
def test_issue_14_low_an_id_no_column_can_hold_in_a_page_url_is_a_404(page, conversation, method, path):
    """Issue 14, low: /chat/99999999999999999999/ and the other pages' ids past 64 bits are a 404."""
    before = _state()
    response = getattr(page, method)(path, {"title": "t", "node": "1"} if method == "post" else None)
    assert response.status_code == 404
    assert _state() == before


# --- A: the pages' forms ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["title", "instructions"])
def test_issue_14_low_a_nul_in_the_chat_settings_form_is_refused_and_changes_nothing(page, conversation, field):
    """Issue 14, low: the chat's rename/instructions form holds text to the API's rules (NUL refused), so it comes
    back with the reason, as the page refuses any bad value, and nothing is saved."""
    before = _state()
    response = page.post(f"/chat/{conversation.pk}/update/", {field: "a\x00b"}, follow=True)
    html = response.content.decode()
    assert response.redirect_chain[0][1] == 302 and "Nothing was changed" in html
    assert "Null characters are not allowed" in html
    assert _state() == before


def test_issue_14_low_a_nul_in_a_persons_instructions_is_a_400_form_and_saves_nothing(page, user):
    """Issue 14, low: the settings form shown again after a refusal answers 400, not 200, and saves nothing."""
    before = _state()
    response = page.post("/settings/", {"instructions": "a\x00b"})
    assert response.status_code == 400 and "Null characters are not allowed" in response.content.decode()
    assert _state() == before
    assert page.post("/settings/", {"instructions": "fine"}).status_code == 302, "a good form still saves"


@pytest.mark.parametrize(("params", "status"), [
    pytest.param({"node": str(2**70)}, 404, id="switch-to-node-2**70"),
    pytest.param({"node": "1\x00"}, 302, id="switch-to-a-node-with-nul"),
])
def test_issue_14_low_a_head_switch_form_with_an_impossible_node_changes_nothing(page, conversation, params, status):
    """Issue 14, low: a node id past 64 bits is a node that does not exist (404); one that is no number is refused
    back to the page. The head stays."""
    ask(conversation, "hello")
    before = _state()
    assert page.post(f"/chat/{conversation.pk}/switch/", params).status_code == status
    assert page.get(f"/chat/{conversation.pk}/compare/?a={2**70}&b=1").status_code == 404
    assert _state() == before


@pytest.mark.parametrize(("values", "needle"), [
    pytest.param({"limit": str(2**70)}, f"limit: {INT_REFUSED}", id="limit-2**70"),
    pytest.param({"limit": str(-(2**70))}, f"limit: {INT_REFUSED}", id="limit-minus-2**70"),
    pytest.param({"limit": "9" * 5000}, f"limit: {INT_REFUSED}", id="limit-5000-digits"),
    pytest.param({"month": "2026-09\x00"}, f"month: {NUL_REFUSED}", id="nul-in-month"),
])
def test_issue_14_low_a_playbook_run_form_with_an_impossible_value_is_400_and_runs_nothing(page, playbook, values,
                                                                                          needle):
    """Issue 14, low: the run form used to run with limit 2**70 and answered 500 for 5000 digits; now the form
    comes back (400) naming the parameter, and no run or conversation is made."""
    before = _state()
    response = page.post(f"/playbooks/{playbook.pk}/run/", values)
    assert response.status_code == 400 and needle in response.content.decode()
    assert _state() == before


# --- A, B: chat socket frames ----------------------------------------------------------------------------------

SOCKET_FRAMES = [
    ('{"type": "ask", "content": "q", "note": "a\\u0000b"}', NUL_REFUSED, "$.note"),
    ('{"type": "ask", "content": "a\\ud800b"}', "a lone surrogate (\\ud800) is not a character", "$.content"),
    ('{"type": "edit", "node": %d, "content": "q"}' % 2**70, INT_REFUSED, "$.node"),
    ('{"type": "regenerate", "node": %d}' % -(2**70), INT_REFUSED, "$.node"),
    ('{"type": "ask", "content": "q", "a\\u0000": 1}', "a key with a NUL character", '$["a\\u0000"]'),
    ('{"type": "ask", "content": "q", "deep": ' + DEEP + "}", "nests deeper than 32 levels", None),
    (DEEP, "nests deeper than 32 levels", None),
]


@pytest.mark.django_db(transaction=True)
async def test_issue_14_low_a_socket_frame_with_a_bad_value_or_deep_nesting_gets_an_error_and_changes_nothing(user):
    """Issue 14, low: socket frames are read with the API's strict decoder: each bad frame gets a `bad_input`
    error frame naming the problem and its path (a NUL in an unknown field used to start a turn, 2**70 as a node
    was a 404), the socket stays open, and nothing is recorded."""
    conversation, cookie = await in_own_thread(
        lambda: (Conversation.objects.create(owner=user, title="t"), session_cookie(user)))()
    before = await in_own_thread(_state)()
    socket = chat_socket(conversation.pk, cookie)
    connected, _ = await socket.connect()
    assert connected
    for frame, needle, path in SOCKET_FRAMES:
        await socket.send_to(text_data=frame)
        error = await socket.receive_json_from(timeout=10)
        assert error["type"] == "error" and error["code"] == "bad_input", (frame[:60], error)
        assert needle in error["message"], (frame[:60], error)
        assert error.get("path") == path, (frame[:60], error)
    await socket.send_json_to({"type": "stop"})
    assert (await receive_until(socket, "stopped"))[-1] == {"type": "stopped"}, "the socket is still open"
    await socket.disconnect()
    assert await in_own_thread(_state)() == before


@pytest.mark.django_db(transaction=True)
async def test_issue_14_low_a_socket_url_with_an_id_no_column_can_hold_closes_as_not_found(user):
    """Issue 14, low: /ws/conversations/99999999999999999999/ is closed 4404, like any conversation not the
    caller's."""
    cookie = await in_own_thread(lambda: session_cookie(user))()
    socket = chat_socket(HUGE_ID, cookie)
    connected, _ = await socket.connect()
    assert connected, "accepted first, so a browser gets the reason"
    assert await socket.receive_output(timeout=10) == {"type": "websocket.close", "code": 4404}


# --- C: the socket's Origin check -----------------------------------------------------------------------------


def _scope(origin: str | None, host: str | None, **extra) -> dict:
    headers = [(b"origin", origin.encode())] if origin is not None else []
    headers += [(b"host", host.encode())] if host is not None else []
    headers += [(name.encode(), value.encode()) for name, value in extra.pop("headers", {}).items()]
    return {"type": "websocket", "path": "/ws/conversations/1/", "headers": headers, **extra}


@pytest.mark.parametrize(("origin", "host", "extra", "allowed"), [
    pytest.param("http://localhost:8000", "localhost:8000", {}, True, id="same-origin"),
    pytest.param("http://localhost", "localhost", {}, True, id="same-origin-default-port"),
    pytest.param("http://localhost:80", "localhost", {}, True, id="default-port-written-out"),
    pytest.param("http://LOCALHOST:8000", "localhost:8000", {}, True, id="host-case-ignored"),
    pytest.param("http://[::1]:8000", "[::1]:8000", {}, True, id="ipv6"),
    pytest.param("http://localhost:9999", "localhost:8000", {}, False, id="other-port-same-host"),
    pytest.param("http://localhost:8000", "localhost", {}, False, id="port-where-the-server-has-none"),
    pytest.param("https://localhost:8000", "localhost:8000", {}, False, id="https-page-to-ws"),
    pytest.param("http://127.0.0.1:8000", "localhost:8000", {}, False, id="other-host-same-port"),
    pytest.param("http://evil.example", "localhost", {}, False, id="other-site"),
    pytest.param("http://evil.example", "evil.example", {}, False, id="host-not-allowed-dns-rebinding"),
    pytest.param(None, "localhost", {}, False, id="no-origin"),
    pytest.param("null", "localhost", {}, False, id="null-origin"),
    pytest.param("http://localhost:99999", "localhost:99999", {}, False, id="bad-port"),
    pytest.param("http://localhost", None, {}, False, id="no-host"),
    pytest.param("https://localhost", "localhost", {"scheme": "wss"}, True, id="wss-and-https-page"),
    pytest.param("http://localhost", "localhost", {"scheme": "wss"}, False, id="wss-and-http-page"),
])
def test_issue_14_low_c_the_socket_origin_must_match_scheme_host_and_port(origin, host, extra, allowed):
    """Issue 14, low C: channels' AllowedHostsOriginValidator matched the host without the port, so a page on
    http://localhost:9999 could open a socket with the session of a server on localhost:8000. The Origin must
    be the request's own origin: scheme, host and port."""
    assert origin_allowed(_scope(origin, host, **extra)) is allowed


@pytest.mark.parametrize(("trusted", "origin", "allowed"), [
    pytest.param(["https://app.example.com"], "https://app.example.com", True, id="exact"),
    pytest.param(["https://app.example.com"], "https://app.example.com:443", True, id="exact-default-port"),
    pytest.param(["https://app.example.com"], "https://app.example.com:8443", False, id="other-port"),
    pytest.param(["https://app.example.com"], "http://app.example.com", False, id="other-scheme"),
    pytest.param(["https://*.example.com"], "https://chat.example.com", True, id="wildcard"),
    pytest.param(["https://*.example.com"], "https://chat.example.com:444", False, id="wildcard-other-port"),
    pytest.param(["https://*.example.com"], "https://example.org", False, id="wildcard-other-domain"),
])
def test_issue_14_low_c_csrf_trusted_origins_are_accepted_with_their_port(settings, trusted, origin, allowed):
    """Issue 14, low C: an origin in CSRF_TRUSTED_ORIGINS (a page served elsewhere) is let in, port included."""
    settings.CSRF_TRUSTED_ORIGINS = trusted
    assert origin_allowed(_scope(origin, "localhost:8000")) is allowed


def test_issue_14_low_c_behind_a_tls_proxy_the_proxy_header_makes_the_origin_https(settings):
    """Issue 14, low C: SECURE_PROXY_SSL_HEADER counts as for Django's own CSRF check (`request.is_secure()`)."""
    settings.SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    proxied = {"headers": {"x-forwarded-proto": "https"}}
    assert origin_allowed(_scope("https://localhost", "localhost", **proxied))
    assert not origin_allowed(_scope("http://localhost", "localhost", **proxied))
    assert not origin_allowed(_scope("https://localhost", "localhost"))


@pytest.mark.django_db(transaction=True)
async def test_issue_14_low_c_through_the_real_application_another_port_is_refused_the_own_one_connects(user):
    """Issue 14, low C: through config.asgi's application, a handshake from http://localhost:9999 to a server
    on localhost:8000 is refused (403) before the consumer runs; from http://localhost:8000 it connects."""
    conversation, cookie = await in_own_thread(
        lambda: (Conversation.objects.create(owner=user, title="t"), session_cookie(user)))()

    def socket(origin: bytes) -> WebsocketCommunicator:
        headers = [(b"origin", origin), (b"host", b"localhost:8000"), (b"cookie", cookie)]
        return WebsocketCommunicator(application, f"/ws/conversations/{conversation.pk}/", headers=headers)

    refused = socket(b"http://localhost:9999")
    connected, _ = await refused.connect()
    assert not connected
    own = socket(b"http://localhost:8000")
    connected, _ = await own.connect()
    assert connected
    await own.disconnect()
