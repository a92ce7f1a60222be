"""Issue 26.3, the leftovers of "sql_query's time limit and Stop do not bound one query … count running tools".

- printf runs once a row: its helper connection for SQLite's own printf is made once a thread, not once a call.
- Tools running are counted per person, in the one place every tool run passes (`run_tool_call`): a thread that
  still runs (a query not yet interrupted, a stopped or timed-out tool) counts until it ends, and past
  ARBOR_MAX_TOOLS_PER_USER a new call is not started and the model reads why.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import sqlite3
import threading
import time
from collections import Counter

import pytest

from conversations import items as it
from conversations.tools import registry
from conversations.tools.cancel import cancelled
from conversations.tools.errors import ToolError
from conversations.tools.registry import Tool
from conversations.tools.runner import run_tool_call, running_tools
from conversations.tools.sales_db import ensure_sales_db

sql_module = importlib.import_module("conversations.tools.sql_query")

ALICE, BOB = 1001, 1002
TEN_THOUSAND = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 10000) "


@pytest.fixture
def sales_db(settings, tmp_path):
    settings.ARBOR_SALES_DB_PATH = tmp_path / "sales.sqlite3"
    return ensure_sales_db()


def _in_new_thread(function):
    """`function()`'s value, run in a thread of its own (so its thread-local state starts empty)."""
    outcome = {}

    def run():
        try:
            outcome["value"] = function()
        except BaseException as error:  # pragma: no cover - shown by the assertion below
            outcome["error"] = error

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive() and "error" not in outcome, outcome
    return outcome["value"]


def _query(sql, params=None):
    result = sql_module.sql_query(sql, params)
    return list(result["rows"])


# --- printf's helper connection ---------------------------------------------------------------------------------


def test_issue_26_3_printf_over_10000_rows_makes_one_helper_connection_per_thread(sales_db, monkeypatch):
    """Issue 26.3: printf (registered for every row) reuses one plain connection a thread: 10,000 calls in a
    thread open one, and another thread opens its own (a sqlite3 connection stays in its thread)."""
    made: Counter[str] = Counter()
    calls: Counter[str] = Counter()
    connect, bounded = sqlite3.connect, sql_module._bounded_printf

    def counting_connect(database, *args, **kwargs):
        if database == ":memory:":
            made[threading.current_thread().name] += 1
        return connect(database, *args, **kwargs)

    def counting_printf(*args):
        calls[threading.current_thread().name] += 1
        return bounded(*args)

    monkeypatch.setattr(sqlite3, "connect", counting_connect)
    monkeypatch.setattr(sql_module, "_bounded_printf", counting_printf)
    sql = TEN_THOUSAND + "SELECT count(*), sum(length(printf('%05d', i))), sum(length(format('%x', i))) FROM n"

    for _ in range(2):
        assert _in_new_thread(lambda: _query(sql) + _query(sql)) == [[10000, 50000, 35635]] * 2
    assert sorted(calls.values()) == [40000, 40000]  # printf and format, twice, in each thread
    assert sorted(made.values()) == [1, 1] and made.keys() == calls.keys()


ORDINARY = [
    ("%d", 42),
    ("%5.2f", 3.14159),
    ("%-8s|", "ab"),
    ("%08.3f", -2.5),
    ("%x %X %o", 255, 255, 8),
    ("%e", 12345.678),
    ("%g", 0.0001),
    ("%c", "xyz"),
    ("%q", "it's"),
    ("%Q", "it's"),
    ("%Q", None),
    ("%w", 'a"b'),
    ("%%%s", "x"),
    ("%*d|", 6, 7),
    ("%-*d|", 6, 7),
    ("%.*s", 3, "abcdef"),
    ("%s", None),
    ("%s", b"bytes"),
    ("%d", "12abc"),
    ("%,d", 1234567),
    ("%!.3g", 2.0),
    ("%lld", 2**40),
    ("%d %d", 1),
    ("%s é %s", "ü", 3),
    ("no fields",),
    (None,),
    (42,),
    ("%10000d", 1),
    ("%.10000f", 1.5),
    ("%*d", -10000, 5),
]


@pytest.mark.parametrize("fmt_and_args", ORDINARY, ids=repr)
def test_issue_26_3_bounded_printf_gives_what_sqlites_own_printf_gives(sales_db, fmt_and_args):
    """Issue 26.3: within the width bound, printf and format give exactly SQLite's own result, called directly
    and through a query, on a reused helper connection."""
    marks = ", ".join("?" * len(fmt_and_args))
    with contextlib.closing(sqlite3.connect(":memory:")) as plain:
        expected = plain.execute(f"SELECT printf({marks})", fmt_and_args).fetchone()[0]
    assert sql_module._bounded_printf(*fmt_and_args) == expected
    assert sql_module._bounded_printf(*fmt_and_args) == expected  # again, on the same thread's connection
    names = [f"a{n}" for n in range(len(fmt_and_args))]
    columns = ", ".join(f"{function}({', '.join(':' + name for name in names)})" for function in ("printf", "format"))
    assert _query(f"SELECT {columns}", dict(zip(names, fmt_and_args, strict=True))) == [[expected, expected]]


def test_issue_26_3_printf_past_the_width_bound_still_gives_null(sales_db):
    """Issue 26.3: the reuse keeps the bound: a width or precision over MAX_PRINTF_WIDTH gives NULL, given or `*`."""
    over = sql_module.MAX_PRINTF_WIDTH + 1
    assert sql_module._bounded_printf(f"%{over}d", 1) is None
    assert sql_module._bounded_printf("%.*c", over, "x") is None
    assert sql_module._bounded_printf("%*d", -over, 1) is None
    assert _query(
        "SELECT printf(:f, :n, 'x'), length(printf('%.*c', :m, 'x'))", {"f": "%.*c", "n": over, "m": over - 1}
    ) == [[None, over - 1]]


# --- running tools per person -----------------------------------------------------------------------------------


def _call(name: str, arguments: dict | None = None, call_id: str = "call_1") -> it.Item:
    return it.tool_call(call_id, name, json.dumps(arguments or {}))


def _eventually(condition, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time allowed"
        time.sleep(0.01)


@pytest.fixture
def slow_tool(monkeypatch):
    """A tool that runs until `gate` is set (or, with `patient`, until the runner cancels it); what it started."""
    state = {"gate": threading.Event(), "started": Counter(), "ended": Counter()}

    def slow(who: str = "") -> str:
        state["started"][who] += 1
        try:
            state["gate"].wait(20)
            return "done"
        finally:
            state["ended"][who] += 1

    def patient() -> str:
        deadline = time.monotonic() + 20
        while not cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        return "noticed the cancel"

    def raising() -> str:
        raise ValueError("broken")

    def refusing() -> str:
        raise ToolError("bad input")

    schema = {"type": "object", "properties": {"who": {"type": "string"}}}
    for tool in (
        Tool("slow", "Waits.", schema, slow),
        Tool("patient", "Waits for a cancel.", {"type": "object"}, patient),
        Tool("raising", "Raises.", {"type": "object"}, raising),
        Tool("refusing", "Refuses.", {"type": "object"}, refusing),
    ):
        monkeypatch.setitem(registry._TOOLS, tool.name, tool)
    yield state
    state["gate"].set()  # no thread of this test runs on into another test
    _eventually(lambda: running_tools(ALICE) == running_tools(BOB) == 0)


def _in_background(call: it.Item, owner_id: int) -> tuple[threading.Thread, dict]:
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=run_tool_call(call, owner_id=owner_id)))
    thread.start()
    return thread, outcome


def test_issue_26_3_past_the_limit_a_persons_call_is_refused_while_anothers_tool_runs(settings, slow_tool):
    """Issue 26.3: Alice's timed-out, stopped and waiting tools all still run, so they count; her next call is not
    started and the model reads why (an is_error result). Bob's tool runs meanwhile, and he may start another.
    Once her tools end she can run tools again."""
    settings.ARBOR_MAX_TOOLS_PER_USER = 3
    settings.ARBOR_TOOL_TIMEOUT_SECONDS = 0.3
    timed_out = run_tool_call(_call("slow", {"who": "alice"}), owner_id=ALICE)
    assert timed_out["is_error"] and "did not finish within 0.3 s" in timed_out["content"]
    stopped = run_tool_call(_call("slow", {"who": "alice"}), owner_id=ALICE, stop_requested=lambda: True)
    assert stopped["is_error"] and stopped["content"].startswith("stopped")
    settings.ARBOR_TOOL_TIMEOUT_SECONDS = 30
    waiting, waited = _in_background(_call("slow", {"who": "alice"}), ALICE)
    bobs, bobs_outcome = _in_background(_call("slow", {"who": "bob"}), BOB)
    _eventually(lambda: slow_tool["started"] == {"alice": 3, "bob": 1})
    assert running_tools(ALICE) == 3 and running_tools(BOB) == 1

    refused = run_tool_call(_call("slow", {"who": "alice"}, call_id="call_4"), owner_id=ALICE)
    assert refused == it.tool_result("call_4", "slow", refused["content"], is_error=True)
    assert refused["content"].startswith("You already have 3 tools running; slow was not started.")
    assert slow_tool["started"]["alice"] == 3 and running_tools(ALICE) == 3  # not started, not counted
    assert slow_tool["ended"]["bob"] == 0 and bobs.is_alive()  # Bob's tool still runs, and he may start another
    bobs_second, _ = _in_background(_call("slow", {"who": "bob"}), BOB)
    _eventually(lambda: slow_tool["started"]["bob"] == 2)

    slow_tool["gate"].set()
    for thread in (waiting, bobs, bobs_second):
        thread.join(10)
    assert waited["result"]["content"] == bobs_outcome["result"]["content"] == "done"
    _eventually(lambda: running_tools(ALICE) == 0)  # the stopped and timed-out threads ended too
    assert run_tool_call(_call("slow", {"who": "alice"}), owner_id=ALICE)["content"] == "done"
    assert running_tools(ALICE) == running_tools(BOB) == 0


@pytest.mark.parametrize("ending", ["success", "tool error", "exception", "timeout", "stop", "bad arguments"])
def test_issue_26_3_the_count_goes_down_however_a_tool_ends(settings, slow_tool, ending):
    """Issue 26.3: with a limit of one, a tool that ended in any way (success, an error, an exception, a timeout,
    Stop) gives its place back: the person's next call runs. A timed-out or stopped one gives it back when its
    thread ends (here at once, as it notices the cancel); a call refused before it started never took one."""
    settings.ARBOR_MAX_TOOLS_PER_USER = 1
    settings.ARBOR_TOOL_TIMEOUT_SECONDS = 0.3
    call, stop = {
        "success": (_call("slow"), lambda: False),
        "tool error": (_call("refusing"), lambda: False),
        "exception": (_call("raising"), lambda: False),
        "timeout": (_call("patient"), lambda: False),
        "stop": (_call("patient"), lambda: True),
        "bad arguments": (_call("slow", {"who": 1}), lambda: False),
    }[ending]
    slow_tool["gate"].set()  # "slow" answers at once here
    first = run_tool_call(call, owner_id=ALICE, stop_requested=stop)
    assert first["is_error"] == (ending != "success")
    _eventually(lambda: running_tools(ALICE) == 0)
    assert run_tool_call(_call("slow"), owner_id=ALICE)["content"] == "done"


def test_issue_26_3_a_query_not_yet_interrupted_counts_until_it_is(sales_db, settings):
    """Issue 26.3: a stopped sql_query counts against its person until its progress handler has interrupted it;
    then the person may query again."""
    settings.ARBOR_MAX_TOOLS_PER_USER = 1
    settings.ARBOR_SQL_TIME_LIMIT_SECONDS = 60
    forever = {"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"}
    stopped = run_tool_call(_call("sql_query", forever), owner_id=ALICE, stop_requested=lambda: True)
    assert stopped["is_error"] and stopped["content"].startswith("stopped")
    _eventually(lambda: running_tools(ALICE) == 0, seconds=5)
    again = run_tool_call(_call("sql_query", {"sql": "SELECT 1 AS one"}), owner_id=ALICE)
    assert json.loads(again["content"])["rows"] == [[1]]


def test_issue_26_3_the_count_is_thread_safe(settings, slow_tool):
    """Issue 26.3: twelve calls of one person at the same moment, limit three: exactly three start, nine are
    refused, and the count ends at zero."""
    settings.ARBOR_MAX_TOOLS_PER_USER = 3
    barrier = threading.Barrier(12)
    results: list[it.Item] = []

    def call(n: int) -> None:
        barrier.wait()
        results.append(run_tool_call(_call("slow", {"who": "alice"}, call_id=f"call_{n}"), owner_id=ALICE))

    threads = [threading.Thread(target=call, args=(n,)) for n in range(12)]
    for thread in threads:
        thread.start()
    _eventually(lambda: len(results) == 9)  # the refused ones answer at once
    assert all(r["content"].startswith("You already have 3 tools running") for r in results)
    assert running_tools(ALICE) == 3
    _eventually(lambda: slow_tool["started"]["alice"] == 3)  # the three admitted reach their tool in their threads
    slow_tool["gate"].set()
    for thread in threads:
        thread.join(10)
    assert [r["content"] for r in results[9:]] == ["done"] * 3 and running_tools(ALICE) == 0


def test_issue_26_3_no_limit_at_zero_and_no_count_without_a_person(settings, slow_tool):
    """Issue 26.3: ARBOR_MAX_TOOLS_PER_USER=0 turns the limit off; a run for nobody in particular is not counted."""
    settings.ARBOR_MAX_TOOLS_PER_USER = 0
    for _ in range(3):
        assert run_tool_call(_call("slow"), owner_id=ALICE, stop_requested=lambda: True)["is_error"]
    assert running_tools(ALICE) == 3
    settings.ARBOR_MAX_TOOLS_PER_USER = 1
    assert run_tool_call(_call("slow"), stop_requested=lambda: True)["content"].startswith("stopped")
    assert run_tool_call(_call("slow"), owner_id=ALICE)["content"].startswith("You already have 3 tools running")
    slow_tool["gate"].set()
    _eventually(lambda: running_tools(ALICE) == 0)


@pytest.mark.django_db
def test_issue_26_3_a_turns_tool_counts_against_its_owner_and_an_approved_action_does_not(
        conversation, settings, monkeypatch):
    """Issue 26.3, T4, F3: a turn's own tool call passes its person to the count: at the limit, the model reads
    why the tool did not start (the result is the next node's sent item, T4). A person's approved action is not
    refused by the count: their click paces it, and a refusal would spend the approval."""
    from conversations.tools import runner
    from conversations.turns.detached import run_here
    from conversations.turns.start import turn_decide
    from tests.conversations.helpers import ask, head

    settings.ARBOR_MAX_TOOLS_PER_USER = 2
    monkeypatch.setitem(runner._running, conversation.owner_id, 2)  # two of the person's tools still run
    ask(conversation, '#tool sql_query {"sql": "select 1"}')
    (result,) = head(conversation).sent
    assert result["is_error"] and "You already have 2 tools running; sql_query was not started" in result["content"]

    events = ask(conversation, '#tool send_email {"to": "a@b.example", "subject": "s", "body": "b"}')
    assert events[-1].type == "approval_required"
    (call,) = it.tool_calls(head(conversation).received)
    run_here(turn_decide(user=conversation.owner, conversation_id=conversation.pk, call_id=call["id"], approve=True))
    (sent,) = head(conversation).sent
    assert not sent["is_error"], sent["content"]
    assert running_tools(conversation.owner_id) == 2, "what ran was counted and let go; the held two remain"
