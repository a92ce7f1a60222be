"""The sql_query tool and its bundled sample sales database."""

import hashlib
import json
import threading

import pytest

from conversations.tools.errors import ToolError
from conversations.tools.registry import get_tool
from conversations.tools.sales_db import ensure_sales_db
from conversations.tools.sql_query import describe_schema, sql_check, sql_query

MONTH = "2025-06"
TOP_10_SQL = """
    SELECT customer_name, total FROM monthly_sales
    WHERE month = '{month}' {extra}
    ORDER BY total DESC LIMIT 10
"""


@pytest.fixture
def sales_db(settings, tmp_path):
    settings.ARBOR_SALES_DB_PATH = tmp_path / "sales.sqlite3"
    return ensure_sales_db()


def query(sql, params=None):
    """sql_query's result with its rows read to the end (the tool runner reads them as far as its limit)."""
    result = sql_query(sql, params)
    rows = list(result["rows"])  # fills in row_count and truncated
    return {**result, "rows": rows}


def checksum(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dump_everything():
    return [
        query(f"SELECT * FROM {table} ORDER BY 1, 2, 3")["rows"]
        for table in ("customers", "products", "orders", "monthly_sales")
    ]


def test_database_builds_deterministically(settings, tmp_path):
    """Two independent builds of the sample database hold exactly the same data."""
    settings.ARBOR_SQL_ROW_CAP = 100_000
    settings.ARBOR_SALES_DB_PATH = tmp_path / "first.sqlite3"
    first = dump_everything()
    settings.ARBOR_SALES_DB_PATH = tmp_path / "second.sqlite3"
    second = dump_everything()

    assert first == second
    customers, products, orders, _ = first
    assert 50 <= len(customers) <= 70
    assert sum(row[4] for row in customers) >= 15  # overseas customers
    assert products
    assert len(orders) > 2000
    months = query("SELECT MIN(month), MAX(month), COUNT(DISTINCT month) FROM orders")["rows"]
    assert months == [["2024-01", "2027-12", 48]]


def test_ensure_sales_db_uses_the_setting_and_leaves_no_temp_file(sales_db, tmp_path):
    """The database is built at ARBOR_SALES_DB_PATH via a temp file that is renamed into place."""
    assert sales_db == tmp_path / "sales.sqlite3"
    assert [p.name for p in tmp_path.iterdir()] == ["sales.sqlite3"]
    before = checksum(sales_db)
    assert ensure_sales_db() == sales_db  # an existing, current file is reused as is
    assert checksum(sales_db) == before


def test_top_customers_including_overseas_differ_from_domestic_only(sales_db):
    """The top 10 customers of a month, overseas included, differ from the domestic-only top 10."""
    everyone = query(TOP_10_SQL.format(month=MONTH, extra=""))
    domestic = query(TOP_10_SQL.format(month=MONTH, extra="AND is_overseas = 0"))

    assert everyone["columns"] == ["customer_name", "total"]
    assert everyone["row_count"] == domestic["row_count"] == 10
    assert everyone["truncated"] is False
    assert everyone["rows"] != domestic["rows"]
    overseas = {row[0] for row in query("SELECT name FROM customers WHERE is_overseas = 1")["rows"]}
    assert overseas & {row[0] for row in everyone["rows"]}
    assert not overseas & {row[0] for row in domestic["rows"]}


@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO products (id, name, category, unit_price) VALUES (999, 'x', 'y', 1)",
        "UPDATE orders SET amount = 0",
        "DELETE FROM orders",
        "DROP TABLE orders",
        "CREATE TEMP TABLE scratch (x)",
        "ATTACH DATABASE ':memory:' AS other",
        "PRAGMA writable_schema = ON",
        "PRAGMA query_only = OFF",
        "VACUUM",
    ],
)
def test_writes_are_refused_and_the_file_is_unchanged(sales_db, sql):
    """Writing statements, ATTACH and state-changing PRAGMAs raise ToolError and leave the file as it was."""
    before = checksum(sales_db)
    with pytest.raises(ToolError, match="read-only database: writes are refused"):
        query(sql)
    assert checksum(sales_db) == before


def test_attach_cannot_create_or_read_other_files(sales_db, tmp_path):
    """ATTACH of another file is refused before SQLite opens (or creates) that file."""
    other = tmp_path / "other.sqlite3"
    with pytest.raises(ToolError, match="writes are refused"):
        query(f"ATTACH DATABASE '{other}' AS other")
    assert not other.exists()


def test_multiple_statements_are_refused(sales_db):
    """A string holding a second statement is refused and neither statement runs."""
    before = checksum(sales_db)
    with pytest.raises(ToolError, match="only a single SQL statement"):
        query("SELECT 1; DELETE FROM orders")
    assert checksum(sales_db) == before


def test_row_cap_truncates(sales_db, settings):
    """At most ARBOR_SQL_ROW_CAP rows come back, and truncated says that more existed."""
    settings.ARBOR_SQL_ROW_CAP = 5
    capped = query("SELECT id FROM orders ORDER BY id")
    assert capped == {"columns": ["id"], "rows": [[1], [2], [3], [4], [5]], "row_count": 5, "truncated": True}

    exact = query("SELECT id FROM orders ORDER BY id LIMIT 5")
    assert exact["row_count"] == 5
    assert exact["truncated"] is False


def test_slow_query_is_stopped_by_the_time_limit(sales_db, settings):
    """A query running past ARBOR_SQL_TIME_LIMIT_SECONDS is aborted with a ToolError."""
    settings.ARBOR_SQL_TIME_LIMIT_SECONDS = 0.2
    slow = (
        "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n WHERE x < 1000000000) "
        "SELECT COUNT(*) FROM n"
    )
    with pytest.raises(ToolError, match=r"query took longer than 0\.2 s"):
        query(slow)


def test_syntax_error_gives_a_clear_message(sales_db):
    """Malformed SQL raises a ToolError that says it is a syntax error and where."""
    with pytest.raises(ToolError, match='syntax error: near "SELEC"'):
        query("SELEC * FROM orders")
    with pytest.raises(ToolError, match="no such table: invoices"):
        query("SELECT * FROM invoices")


def test_statement_without_result_set_is_refused(sales_db):
    """An empty or comment-only statement is reported instead of returning an empty result."""
    with pytest.raises(ToolError, match="single SELECT"):
        query("-- nothing here")


def test_tool_is_registered_with_the_schema(sales_db):
    """The registered tool needs no approval, requires a string "sql" and describes every table."""
    tool = get_tool("sql_query")
    assert tool is not None
    assert tool.function is sql_query
    assert tool.needs_approval is False
    assert tool.parameters["required"] == ["sql"]
    assert tool.parameters["properties"]["sql"]["type"] == "string"
    assert describe_schema() in tool.description
    for name in ("customers", "products", "orders", "monthly_sales", "is_overseas", "order_date", "amount"):
        assert name in tool.description


def _count(month_value):
    sql = "SELECT count(*) FROM monthly_sales WHERE month = :month"
    return query(sql, {"month": month_value})["rows"][0][0]


@pytest.mark.parametrize("value", ["0 OR 1=1", "2025-06' OR '1'='1", "0 UNION SELECT name, 1 FROM customers"])
def test_params_are_bound_as_data_never_as_sql(sales_db, value):
    """S1: a value in `params` is bound to its :name placeholder: injected SQL matches nothing."""
    assert _count(MONTH) > 0
    assert _count(value) == 0


def test_params_bind_typed_values_and_a_missing_one_is_an_error(sales_db):
    sql = "SELECT count(*) FROM monthly_sales WHERE month = :month AND (is_overseas = 0 OR :overseas) LIMIT :limit"
    everyone = query(sql, {"month": MONTH, "overseas": True, "limit": 5})["rows"][0][0]
    domestic = query(sql, {"month": MONTH, "overseas": False, "limit": 5})["rows"][0][0]
    assert everyone > domestic > 0
    with pytest.raises(ToolError, match="binding parameter :limit"):
        query(sql, {"month": MONTH, "overseas": True})
    with pytest.raises(ToolError, match="binding parameter :limit"):
        sql_check(sql, {"month": MONTH, "overseas": True})
    sql_check(sql, {"month": MONTH, "overseas": True, "limit": 5})


@pytest.mark.parametrize("sql", ["QUERY PLAN SELECT 1", "query plan select * from orders",
                                 "/* note */ QUERY PLAN SELECT 1", "-- note\nEXPLAIN SELECT 1",
                                 "EXPLAIN QUERY PLAN SELECT 1"])
def test_sql_check_refuses_what_sql_query_would_not_run_as_a_query(sales_db, sql):
    """S2: `QUERY PLAN SELECT` compiles behind EXPLAIN but fails as a query: the check refuses it too."""
    with pytest.raises(ToolError, match="not an EXPLAIN"):
        sql_check(sql)


def test_sql_check_uses_the_same_allow_list(sales_db, tmp_path):
    with pytest.raises(ToolError, match="read-only"):
        sql_check(f"ATTACH DATABASE '{tmp_path / 'x.db'}' AS x")
    with pytest.raises(ToolError, match="read-only"):
        sql_check("DELETE FROM orders")
    assert not (tmp_path / "x.db").exists()


def test_the_tool_schema_allows_a_params_object_of_scalars(sales_db):
    params = get_tool("sql_query").parameters["properties"]["params"]
    assert params["type"] == "object"
    assert params["additionalProperties"] == {"type": ["string", "number", "boolean", "null"]}


def test_issue_26_one_query_cannot_build_a_huge_value(sales_db):
    """Issue 26: a single VM instruction that builds 900 MB used to run 21 s past the 2 s limit; SQLite's own
    limits refuse it at once, with a clear error."""
    import time

    began = time.monotonic()
    assert query("select length(printf('%.*c', 900000000, 'x'))")["rows"] == [[None]], "printf gives up: NULL"
    with pytest.raises(ToolError, match="longer than 1,000,000 bytes"):
        query("select length(zeroblob(900000000))")
    with pytest.raises(ToolError, match="pattern too complex"):
        query("select count(*) from customers where name like :p", {"p": "%" * 5000})
    assert time.monotonic() - began < 2


def test_issue_26_a_query_nobody_waits_for_any_more_is_interrupted(sales_db, settings):
    """Issue 26: the runner cancels a tool it stopped waiting for (a timeout, or the turn stopped): the query is
    interrupted within a progress check instead of running on in its thread."""
    import threading
    import time

    from conversations.tools.cancel import running_with

    settings.ARBOR_SQL_TIME_LIMIT_SECONDS = 60
    cancel = threading.Event()
    outcome = {}

    def run() -> None:
        running_with(cancel)
        began = time.monotonic()
        try:
            query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c")
        except ToolError as error:
            outcome["error"], outcome["took"] = str(error), time.monotonic() - began

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)
    cancel.set()
    thread.join(5)
    assert not thread.is_alive() and "stopped" in outcome["error"] and outcome["took"] < 2


def test_issue_26_the_runner_cancels_a_tool_on_timeout_and_on_stop(sales_db, settings):
    """Issue 26: Stop frees the turn at once, and the query thread does not run on: the runner sets the call's
    cancel event, which the query's progress handler reads."""
    import time

    from conversations.tools.runner import run_tool_call

    settings.ARBOR_SQL_TIME_LIMIT_SECONDS = 60
    forever = json.dumps({"sql": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                                 "SELECT count(*) FROM c"})
    asked = time.monotonic()
    stopped = run_tool_call({"type": "tool_call", "id": "c1", "name": "sql_query", "arguments": forever},
                            stop_requested=lambda: time.monotonic() - asked > 0.3)
    assert stopped["is_error"] and stopped["content"].startswith("stopped")
    settings.ARBOR_TOOL_TIMEOUT_SECONDS = 0.5
    timed_out = run_tool_call({"type": "tool_call", "id": "c2", "name": "sql_query", "arguments": forever})
    assert timed_out["is_error"] and "did not finish within 0.5 s" in timed_out["content"]
    deadline = time.monotonic() + 5
    from conversations.tools import runner

    while any(thread.name.startswith("arbor-tool") and _busy(runner._pool) for thread in threading.enumerate()):
        assert time.monotonic() < deadline, "a cancelled query still runs"
        time.sleep(0.05)


def _busy(pool) -> bool:
    """Whether any of the pool's threads runs a task (its queue empty and every thread idle, it is 0)."""
    return pool._work_queue.qsize() > 0 or pool._idle_semaphore._value < len(pool._threads)


def test_issue_26_printf_keeps_working_within_its_bounds(sales_db):
    """Issue 26: printf and format are SQLite's own, with widths and precisions (given or `*`) bounded."""
    rows = query("select printf('%.2f', 3.14159), printf('%*d|%-5s|', 4, 7, 'ab'), format('%%%s', 'x'), "
                 "printf('%*c', 20000, 'x'), printf(NULL)")["rows"]
    assert rows == [["3.14", "   7|ab   |", "%x", None, None]]


def test_issue_26_a_query_that_slows_down_between_rows_is_stopped_while_it_is_read(sales_db, settings):
    """The time limit holds while rows are read too: the first rows come at once, the third would take ages (the
    driver steps one row ahead of the one it hands over)."""
    settings.ARBOR_SQL_TIME_LIMIT_SECONDS = 0.5
    result = sql_query("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
                       "SELECT x FROM c WHERE x <= 2 OR x % 500000000 = 0")
    rows = result["rows"]
    assert next(rows) == [1]
    with pytest.raises(ToolError, match="was stopped"):
        next(rows)
