"""Issue 32 (X3, F3, D4, C4, D5): tools from real MCP servers (conftest.py starts them) offered to the model as
`SERVER__TOOL`, run at once only when they say they only read, otherwise only after a person's Approve; every call
gets a result, errors included; results are bounded; a crashed server is started again; a slow call times out
or is stopped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model
from mcp_types import CallToolResult

from conversations.models import Conversation, Node, ToolApproval, ToolServer
from conversations.tools import catalog
from conversations.tools.catalog import get_tool, offered_tools
from conversations.tools.mcp import connection
from conversations.tools.mcp.servers import BadServer, configured, forget, parse_servers
from conversations.tools.mcp.tools import _usable, result_text
from conversations.tools.runner import run_tool_call
from tests.conversations.helpers import answer, ask
from tests.conversations.mcp.conftest import NOTES, TIME

pytestmark = pytest.mark.django_db


def _call(name: str, **arguments) -> dict:
    return {"type": "tool_call", "id": f"call-{name}-{time.monotonic_ns()}", "name": name,
            "arguments": json.dumps(arguments)}


def _turn(api, conversation_id, content):
    return api.post(f"/api/conversations/{conversation_id}/turns/", {"content": content}, format="json")


def _results(conversation: Conversation) -> list[dict]:
    """Every tool result on the conversation's current path, oldest first."""
    conversation.refresh_from_db()
    path = Node.objects.get(pk=conversation.head_id).ancestors(include_self=True)
    return [item for node in path for item in node.sent if item.get("type") == "tool_result"]


def _notes_count() -> int:
    text = run_tool_call(_call("notes__count_notes"))["content"]
    return int(text.split()[0])


def test_x3_a_read_only_mcp_tool_is_offered_by_name_and_runs_at_once_in_a_turn(mcp_servers, conversation):
    mcp_servers({"notes": NOTES})
    names = {tool.name: tool for tool in offered_tools(None)}
    assert {"notes__lookup", "notes__write_note", "sql_query", "send_email"} <= names.keys()
    assert names["notes__lookup"].server == "notes" and not names["notes__lookup"].needs_approval
    assert names["notes__lookup"].parameters["required"] == ["word"], "the server's own input schema"
    events = ask(conversation, '#tool notes__lookup {"word": "oak"}')
    assert events[-1].type == "done" and answer(events).startswith("echo:")
    (result,) = _results(conversation)
    assert result["name"] == "notes__lookup" and not result["is_error"]
    assert result["content"].startswith("oak: a word of 3 letters"), "the server's answer, recorded (F1, T4)"
    assert not ToolApproval.objects.exists(), "read-only and closed-world: nobody was asked"


def test_x3_f3_a_tool_with_effects_waits_for_a_persons_approve_and_runs_once(mcp_servers, api):
    mcp_servers({"notes": NOTES})
    before = _notes_count()
    cid = api.post("/api/conversations/", {}, format="json").json()["id"]
    paused = _turn(api, cid, '#tool notes__write_note {"text": "buy milk"}')
    assert paused.status_code == 202, paused.content
    (card,) = paused.json()["approval_required"]
    assert card["name"] == "notes__write_note" and json.loads(card["arguments"]) == {"text": "buy milk"}, \
        "the card shows the exact call that will run"
    assert _notes_count() == before, "nothing ran before the person decided (D4)"
    done = api.post(f"/api/conversations/{cid}/approvals/", {"call_id": card["call_id"], "approve": True},
                    format="json")
    assert done.status_code == 201, done.content
    assert _notes_count() == before + 1
    again = api.post(f"/api/conversations/{cid}/approvals/", {"call_id": card["call_id"], "approve": True},
                     format="json")
    assert again.status_code in (404, 409) and _notes_count() == before + 1, "an approval runs the action once"
    (result,) = _results(Conversation.objects.get(pk=cid))
    assert result["content"].startswith("noted #") and "buy milk" in result["content"]


def test_x3_a_refused_call_never_runs_and_open_world_tools_ask_too(mcp_servers, api):
    mcp_servers({"notes": NOTES})
    before = _notes_count()
    cid = api.post("/api/conversations/", {}, format="json").json()["id"]
    (card,) = _turn(api, cid, '#tool notes__write_note {"text": "no"}').json()["approval_required"]
    refused = api.post(f"/api/conversations/{cid}/approvals/", {"call_id": card["call_id"], "approve": False},
                       format="json")
    assert refused.status_code == 201 and _notes_count() == before
    (result,) = _results(Conversation.objects.get(pk=cid))
    assert result["is_error"] and result["content"].startswith("refused"), "a refusal is a result too (C4)"
    assert get_tool("notes__search_web").needs_approval, "readOnlyHint with openWorldHint: a person approves"
    assert get_tool("notes__write_note").needs_approval and not get_tool("notes__count_notes").needs_approval
    unapproved = run_tool_call(_call("notes__write_note", text="sneaky"))
    assert unapproved["is_error"] and _notes_count() == before, "the runner refuses an unapproved action itself"


def test_x3_staff_override_the_annotations_per_tool(mcp_servers, api):
    mcp_servers({"notes": {**NOTES, "approval": {"write_note": "auto", "lookup": "ask"}}})
    assert not get_tool("notes__write_note").needs_approval and get_tool("notes__lookup").needs_approval
    cid = api.post("/api/conversations/", {}, format="json").json()["id"]
    assert _turn(api, cid, '#tool notes__lookup {"word": "x"}').status_code == 202
    listed = {tool["name"]: tool for tool in api.get("/api/tools/").json()["tools"]}
    assert listed["notes__lookup"]["needs_approval"] is True and listed["notes__write_note"]["needs_approval"] is False


def test_issue_32_the_tools_api_lists_every_tool_and_says_which_server_is_down(mcp_servers, api):
    mcp_servers({"notes": NOTES, "gone": {"command": ["/nonexistent/mcp-server"]}})
    body = api.get("/api/tools/").json()
    listed = {tool["name"]: tool for tool in body["tools"]}
    assert listed["sql_query"]["server"] is None and listed["send_email"]["needs_approval"] is True
    assert listed["notes__lookup"] == {"name": "notes__lookup", "server": "notes", "needs_approval": False,
                                       "description": "Look a word up in the test dictionary.",
                                       "parameters": listed["notes__lookup"]["parameters"]}
    servers = {server["name"]: server for server in body["servers"]}
    assert servers["notes"]["reachable"] and servers["notes"]["transport"] == "stdio"
    assert not servers["gone"]["reachable"] and "/nonexistent/mcp-server" in servers["gone"]["error"]
    assert not any(name.startswith("gone__") for name in listed)


def test_c4_d5_errors_and_oversized_results_are_results_and_bounded(mcp_servers, settings):
    mcp_servers({"notes": NOTES})
    failed = run_tool_call(_call("notes__fail"))
    assert failed["is_error"] and "fail" in failed["content"]
    settings.ARBOR_TOOL_OUTPUT_MAX_BYTES = 5000
    big = run_tool_call(_call("notes__big", size=300_000))
    assert not big["is_error"] and len(big["content"].encode()) <= 5000
    assert "limit" in big["content"][-200:], "cut visibly: the model and the person see it was cut"
    wrong = run_tool_call(_call("notes__lookup", word=5))
    assert wrong["is_error"] and "invalid arguments" in wrong["content"], "checked against the server's schema"


def test_issue_32_a_crashed_server_gives_a_result_and_is_started_again(mcp_servers):
    mcp_servers({"notes": NOTES})
    first = run_tool_call(_call("notes__lookup", word="a"))["content"]
    kept = run_tool_call(_call("notes__lookup", word="b"))["content"]
    pid = re.search(r"pid (\d+)", first)[1]
    assert re.search(r"pid (\d+)", kept)[1] == pid, "a stdio server is kept by the process, not started per call"
    crashed = run_tool_call(_call("notes__crash"))
    assert crashed["is_error"] and "ended while crash ran" in crashed["content"]
    after = run_tool_call(_call("notes__lookup", word="c"))
    assert not after["is_error"] and re.search(r"pid (\d+)", after["content"])[1] != pid, "started again"


def test_issue_32_a_slow_call_times_out_and_stop_interrupts_one(mcp_servers):
    mcp_servers({"notes": {**NOTES, "timeout": 1}})
    started = time.monotonic()
    late = run_tool_call(_call("notes__slow", seconds=20))
    assert late["is_error"] and time.monotonic() - started < 10, late
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    mcp_servers({"notes": NOTES})
    started = time.monotonic()
    stopped = run_tool_call(_call("notes__slow", seconds=20), stop_requested=stop.is_set)
    assert stopped["is_error"] and stopped["content"].startswith("stopped") and time.monotonic() - started < 5
    assert not run_tool_call(_call("notes__lookup", word="next"))["is_error"], "the server serves the next call"


def test_issue_32_streamable_http_with_headers_and_the_same_approval_rule(mcp_servers, http_notes_server, api):
    mcp_servers({"web": {"url": http_notes_server, "headers": {"Authorization": "Bearer t0ken"}}})
    who = run_tool_call(_call("web__whoami"))
    assert who["content"].startswith("authorization=Bearer t0ken"), who
    assert not run_tool_call(_call("web__lookup", word="elm"))["is_error"]
    cid = api.post("/api/conversations/", {}, format="json").json()["id"]
    assert _turn(api, cid, '#tool web__write_note {"text": "over http"}').status_code == 202


def test_issue_32_a_stdio_server_gets_its_own_environment_not_arbors(mcp_servers, monkeypatch):
    monkeypatch.setenv("ARBOR_SECRET_PROBE", "leaked")
    mcp_servers({"envy": {**NOTES, "env": {"MODE": "test"}}})
    assert run_tool_call(_call("envy__whoami"))["content"].endswith("secret=-"), "Arbor's secrets stay Arbor's"


def test_issue_32_a_published_reference_server_over_stdio(mcp_servers, conversation):
    """modelcontextprotocol/servers' time server (mcp-server-time on PyPI), started as a staff member would."""
    mcp_servers({"time": TIME})
    tool = get_tool("time__get_current_time")
    assert tool is not None and not tool.needs_approval, "it says it only reads"
    ask(conversation, '#tool time__get_current_time {"timezone": "Asia/Seoul"}')
    (result,) = _results(conversation)
    assert json.loads(result["content"])["timezone"] == "Asia/Seoul"


def test_issue_32_a_conversation_or_project_chooses_its_servers(mcp_servers, api, stub):
    mcp_servers({"notes": NOTES, "time": TIME})
    project = api.post("/api/projects/", {"name": "P", "tool_servers": ["time"]}, format="json").json()
    cid = api.post("/api/conversations/", {"project": project["id"], "model": "openai/stub-model"},
                   format="json").json()["id"]
    _turn(api, cid, "hello")
    offered = {spec["function"]["name"] for spec in stub.requests[-1]["tools"]}
    assert "time__get_current_time" in offered and not any(n.startswith("notes__") for n in offered)
    api.patch(f"/api/conversations/{cid}/", {"tool_servers": ["notes"]}, format="json")
    _turn(api, cid, "again")
    offered = {spec["function"]["name"] for spec in stub.requests[-1]["tools"]}
    assert "notes__lookup" in offered and not any(n.startswith("time__") for n in offered)
    before = Conversation.objects.get(pk=cid).tool_servers
    refused = api.patch(f"/api/conversations/{cid}/", {"tool_servers": ["nope"]}, format="json")
    assert refused.status_code == 400 and "nope" in refused.json()["error"]["message"]
    assert Conversation.objects.get(pk=cid).tool_servers == before, "bad input changes nothing"


def test_x3_v1_callers_are_never_offered_arbors_mcp_tools(mcp_servers, user, stub):
    from rest_framework.authtoken.models import Token
    from rest_framework.test import APIClient

    mcp_servers({"notes": NOTES})
    v1 = APIClient()
    v1.credentials(HTTP_AUTHORIZATION="Bearer " + Token.objects.create(user=user).key)
    mine = {"type": "function", "function": {"name": "mine", "parameters": {"type": "object"}}}
    for tools in ([], [mine]):
        response = v1.post("/v1/chat/completions", {"model": "openai/stub-model", "tools": tools,
                                                    "messages": [{"role": "user", "content": "hi"}]}, format="json")
        assert response.status_code == 200, response.content
        offered = [spec["function"]["name"] for spec in stub.requests[-1].get("tools") or []]
        assert offered == [t["function"]["name"] for t in tools], "only the caller's own tools"


@pytest.mark.parametrize(("raw", "says"), [
    ("{", "not valid JSON"),
    ('["a"]', "JSON object"),
    ('{"a__b": {"command": ["x"]}}', "without '__'"),
    ('{"a": {"command": ["x"], "url": "http://h/"}}', "exactly one of"),
    ('{"a": {"url": "file:///etc/passwd"}}', "http(s) address"),
    ('{"a": {"command": "x"}}', "list of strings"),
    ('{"a": {"command": ["x"], "approval": {"t": "yes"}}}', '"ask" or "auto"'),
    ('{"a": {"command": ["x"], "timeout": 0}}', "`timeout`"),
    ('{"a": {"command": ["x"], "colour": 1}}', "unknown keys"),
])
def test_issue_32_a_wrong_server_list_is_refused_with_its_reason(raw, says):
    with pytest.raises(BadServer, match=re.escape(says)):
        parse_servers(raw)


def test_issue_32_a_wrong_server_list_stops_the_start():
    env = {"ARBOR_MCP_SERVERS": '{"bad name": {"command": ["x"]}}', "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "manage.py", "check"], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert done.returncode != 0 and "ImproperlyConfigured" in done.stderr and "'bad name'" in done.stderr


def test_issue_32_staff_add_a_server_in_the_admin_and_its_tools_appear(mcp_servers, client, api,
                                                                        django_capture_on_commit_callbacks):
    mcp_servers({})
    staff = get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-12345")
    client.force_login(staff)
    form = {"name": "notes", "command": json.dumps(NOTES["command"]), "env": "{}", "url": "", "headers": "{}",
            "timeout": "", "approval": "{}", "enabled": "on"}
    bad = client.post("/admin/conversations/toolserver/add/", {**form, "url": "http://also.example/"})
    assert bad.status_code == 200 and "exactly one of" in bad.content.decode() and not ToolServer.objects.exists()
    with django_capture_on_commit_callbacks(execute=True):
        saved = client.post("/admin/conversations/toolserver/add/", form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    names = {tool["name"] for tool in api.get("/api/tools/").json()["tools"]}
    assert "notes__lookup" in names, "at once in this process (others read it again within seconds)"
    page = client.get(f"/admin/conversations/toolserver/{ToolServer.objects.get().pk}/change/").content.decode()
    assert "notes__write_note (asks a person)" in page and "notes__lookup (runs at once)" in page
    forget()


def test_issue_32_the_settings_page_lists_servers_and_tools(mcp_servers, page):
    mcp_servers({"notes": NOTES, "gone": {"command": ["/nonexistent/mcp-server"]}})
    html = page.get("/settings/").content.decode()
    assert "<code>notes__write_note</code>" in html and "asks you" in html
    assert "The tool server gone cannot be reached now" in html


def test_issue_32_results_name_what_is_not_text_and_tools_a_provider_refuses_are_left_out(mcp_servers):
    mcp_servers({"notes": NOTES})
    mixed = run_tool_call(_call("notes__mixed"))["content"]
    assert mixed.splitlines() == ["[image image/png]", "[resource file:///notes/1]", "note two"]
    assert get_tool("notes__dotted.name") is None and "notes__dotted.name" not in {t.name for t in offered_tools(None)}
    structured = CallToolResult(content=[], structured_content={"rows": 2})
    assert result_text(structured) == '{"rows": 2}', "structured content, when there is no text"
    assert not _usable({"type": 5}) and not _usable({"type": "array"}) and _usable({"type": "object"})


def test_issue_32_a_server_that_is_down_offers_nothing_and_names_no_tool(mcp_servers, monkeypatch):
    monkeypatch.setattr(connection, "START_SECONDS", 1.0)
    mcp_servers({"mute": {"command": ["sleep", "30"]}, "closed": {"url": "http://127.0.0.1:9/mcp"}})
    assert [tool.name for tool in offered_tools(None) if tool.server] == []
    assert get_tool("mute__anything") is None and get_tool("closed__anything") is None
    assert get_tool("nobody__anything") is None and get_tool("no_separator") is None
    body = catalog.listing()[1]
    reasons = {state.name: state.error for state in body}
    assert "did not start within 1 s" in reasons["mute"] and reasons["closed"], reasons


def test_issue_32_an_admin_row_that_breaks_the_rules_is_left_out(mcp_servers):
    mcp_servers({})
    ToolServer.objects.create(name="both", command=["x"], url="http://h.example/")
    ToolServer.objects.create(name="fine", url="http://127.0.0.1:9/mcp", enabled=True)
    ToolServer.objects.create(name="off", url="http://127.0.0.1:9/mcp", enabled=False)
    forget()
    assert [server.name for server in configured()] == ["fine"]


@pytest.mark.parametrize(("raw", "says"), [
    ("  ", None),
    ('{"a": 5}', "an object with"),
    ('{"a": {"url": "http://h/", "env": {"K": "v"}}}', "`env` is for"),
    ('{"a": {"command": ["x"], "headers": {"K": "v"}}}', "`headers` are for"),
    ('{"a": {"command": ["x"], "env": {"K": 1}}}', "object of strings"),
    ('{"arbor": {"command": ["x"]}}', "names Arbor's own tools on /v1"),
])
def test_issue_32_more_wrong_server_lists(raw, says):
    if says is None:
        assert parse_servers(raw) == []
        return
    with pytest.raises(BadServer, match=re.escape(says)):
        parse_servers(raw)


def test_issue_32_closed_connections_start_again_on_the_next_call(mcp_servers):
    mcp_servers({"notes": NOTES})
    first = run_tool_call(_call("notes__lookup", word="a"))["content"]
    connection.close_all()
    again = run_tool_call(_call("notes__lookup", word="b"))["content"]
    assert re.search(r"pid (\d+)", first)[1] != re.search(r"pid (\d+)", again)[1]


def test_x3_a_call_to_a_server_the_conversation_has_off_is_not_run(mcp_servers, api):
    """The model (or an approval of a card shown before the switch) names a tool of a server that is off for the
    conversation: it gets an error result and nothing runs, read-only or not."""
    mcp_servers({"notes": NOTES, "time": TIME})
    before = _notes_count()
    cid = api.post("/api/conversations/", {"tool_servers": ["time"]}, format="json").json()["id"]
    done = _turn(api, cid, '#tool notes__lookup {"word": "off"}')
    assert done.status_code == 201, done.content
    (result,) = _results(Conversation.objects.get(pk=cid))
    assert result["is_error"] and "does not have that tool's server on" in result["content"]
    api.patch(f"/api/conversations/{cid}/", {"tool_servers": None}, format="json")
    (card,) = _turn(api, cid, '#tool notes__write_note {"text": "then off"}').json()["approval_required"]
    api.patch(f"/api/conversations/{cid}/", {"tool_servers": []}, format="json")
    api.post(f"/api/conversations/{cid}/approvals/", {"call_id": card["call_id"], "approve": True}, format="json")
    assert _notes_count() == before, "switched off before the click: not run"
    assert "does not have that tool's server on" in _results(Conversation.objects.get(pk=cid))[-1]["content"]


def test_issue_32_a_server_that_lists_its_tools_in_pages_offers_them_all(mcp_servers):
    """A low-level SDK server that pages its tool list (paged_server.py): every page is read."""
    mcp_servers({"paged": {"command": [sys.executable, str(Path(__file__).with_name("paged_server.py"))]}})
    assert [tool.name for tool in offered_tools(None) if tool.server] == [f"paged__echo_{n}" for n in range(5)]
    assert run_tool_call(_call("paged__echo_4", text="hi"))["content"] == "echo_4: hi"


def test_issue_32_a_changed_configuration_replaces_a_connection_never_opened(mcp_servers):
    first = parse_servers(json.dumps({"idle": NOTES}))[0]
    second = parse_servers(json.dumps({"idle": {**NOTES, "timeout": 5}}))[0]
    _, held = connection.connection(first)
    _, replaced = connection.connection(second)
    assert replaced is not held and replaced.server == second
    _, again = connection.connection(second)
    assert again is replaced, "the same configuration keeps its connection"


def test_issue_32_a_server_whose_listing_fails_is_shown_down_with_why(mcp_servers):
    paged = [sys.executable, str(Path(__file__).with_name("paged_server.py"))]
    mcp_servers({"broken": {"command": paged, "env": {"PAGED_LISTING_FAILS": "1"}}})
    (state,) = catalog.listing()[1]
    assert not state.reachable and "did not list its tools" in state.error


def test_f3_d4_a_decided_call_keeps_its_result_after_the_tool_stops_asking(mcp_servers, api):
    """Staff turn the tool to "auto" (or the server changes its annotations) after a person approved a call: the
    call's stored result is what any later resolution gives (a crash recovered, a retry); it never runs again."""
    from conversations.selectors import path_node
    from conversations.turns import calls

    mcp_servers({"notes": NOTES})
    cid = api.post("/api/conversations/", {}, format="json").json()["id"]
    (card,) = _turn(api, cid, '#tool notes__write_note {"text": "pay 100"}').json()["approval_required"]
    api.post(f"/api/conversations/{cid}/approvals/", {"call_id": card["call_id"], "approve": True}, format="json")
    asking = ToolApproval.objects.get(call_id=card["call_id"]).node
    mcp_servers({"notes": {**NOTES, "approval": {"write_note": "auto"}}})
    for run in (True, False):
        (result,) = calls.resolve(path_node(asking), run=run, owner_id=asking.owner_id, note="NOT RUN")
        assert result["content"].startswith("noted #") and "pay 100" in result["content"]
    notes = run_tool_call(_call("notes__count_notes"))["content"]  # the server as configured now (a new process)
    assert "pay 100" not in notes, "run once, whatever the tool says of itself now"


def _children() -> set[int]:
    """This process's child processes (Linux /proc)."""
    pids = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        pids |= {int(pid) for pid in (task / "children").read_text().split()}
    return pids


def test_issue_32_a_server_that_died_while_idle_is_started_before_the_next_call(mcp_servers):
    mcp_servers({"notes": NOTES})
    first = run_tool_call(_call("notes__lookup", word="a"))["content"]
    os.kill(int(re.search(r"pid (\d+)", first)[1]), signal.SIGKILL)
    time.sleep(0.2)
    after = run_tool_call(_call("notes__lookup", word="b"))
    assert not after["is_error"], "the call went to a server started again, not to the dead one"


def test_issue_32_a_start_nobody_waits_for_ends_its_process_and_is_not_retried_at_once(mcp_servers, monkeypatch):
    monkeypatch.setattr(connection, "START_SECONDS", 1.0)
    before = _children()
    mcp_servers({"mute": {"command": ["sleep", "30"]}})
    server = configured()[0]
    with pytest.raises(connection.CallStopped):
        connection.run(server, lambda held: held.tools(), timeout=0.3)  # a Stop during the start
    deadline = time.monotonic() + 5
    while _children() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _children() - before, "the process of a start nobody waits for ends"
    started = time.monotonic()
    with pytest.raises(connection.ServerDown):
        connection.list_tools(server)  # it times out once…
    with pytest.raises(connection.ServerDown, match="tried again after"):
        connection.list_tools(server)  # …and is not started again on the next turn
    assert time.monotonic() - started < 3


def test_c4_a_tool_whose_schema_points_nowhere_gets_an_error_result(mcp_servers):
    paged = [sys.executable, str(Path(__file__).with_name("paged_server.py"))]
    mcp_servers({"refs": {"command": paged, "env": {"PAGED_BAD_REF": "1"}}})
    result = run_tool_call(_call("refs__bad_ref", x=1))
    assert result["is_error"] and "argument schema is broken" in result["content"]
    assert run_tool_call({**_call("refs__echo_0"), "arguments": '"text"'})["content"] == \
        "error: invalid arguments: 'text' is not of type 'object'"


@pytest.mark.parametrize("name", ["notes_", "_notes", "a__b"])
def test_issue_32_a_server_name_that_would_blur_its_tools_names_is_refused(name):
    with pytest.raises(BadServer, match="not ending in '_'"):
        parse_servers(json.dumps({name: NOTES}))


def test_issue_32_only_superusers_manage_mcp_servers_in_the_admin(client, django_user_model):
    from django.contrib.auth.models import Permission

    staff = django_user_model.objects.create_user("ops", password="pw-ops-12345", is_staff=True)
    staff.user_permissions.set(Permission.objects.filter(codename__endswith="toolserver"))
    client.force_login(staff)
    assert client.get("/admin/conversations/toolserver/").status_code == 403
    assert client.post("/admin/conversations/toolserver/add/", {"name": "x", "command": '["sh"]'}).status_code == 403
    assert not ToolServer.objects.exists()


def test_issue_32_a_server_slow_to_answer_the_liveness_question_is_not_restarted(mcp_servers, monkeypatch):
    mcp_servers({"notes": NOTES})
    first = run_tool_call(_call("notes__lookup", word="a"))["content"]
    monkeypatch.setattr(connection, "PING_SECONDS", 0.000001)  # every check times out: the server is slow
    second = run_tool_call(_call("notes__lookup", word="b"))["content"]
    assert re.search(r"pid (\d+)", first)[1] == re.search(r"pid (\d+)", second)[1], "slow is not gone"
