"""The ``sql_query`` tool: one read-only SELECT against the bundled sample sales database."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

from django.conf import settings

from conversations.tools.cancel import cancelled
from conversations.tools.errors import ToolError
from conversations.tools.registry import Tool, register
from conversations.tools.sales_db import DOMESTIC, FIRST_YEAR, LAST_YEAR, OVERSEAS, PRODUCTS, ensure_sales_db

DEFAULT_ROW_CAP = 200
DEFAULT_TIME_LIMIT_SECONDS = 2.0
PROGRESS_EVERY = 1_000  # SQLite VM instructions between deadline checks
# What one statement may build (issue 26): a deadline is checked between VM instructions, so one instruction that
# builds a huge value (printf('%.*c', 900000000, 'x'), zeroblob, replace) once ran 21 s and took 900 MB. SQLite
# refuses any string or blob past LENGTH, and these bound the statement's text, a LIKE pattern, and nesting.
_LIMITS = {
    sqlite3.SQLITE_LIMIT_LENGTH: 1_000_000,
    sqlite3.SQLITE_LIMIT_SQL_LENGTH: 100_000,
    sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH: 1_000,
    sqlite3.SQLITE_LIMIT_EXPR_DEPTH: 200,
    sqlite3.SQLITE_LIMIT_COMPOUND_SELECT: 50,
}

# The authorizer is an allow-list: anything a plain SELECT does not need is denied at
# prepare time. mode=ro and query_only already stop writes to the database, but not
# ATTACH (which can read, or even create, other files), VACUUM INTO (which creates a
# file before failing) or PRAGMA (which could switch query_only back off).
_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_RECURSIVE,
}
# printf's width and precision repeat a character in one VM instruction, inside SQLite, without a look at the
# deadline or LENGTH until the end: `printf('%.*c', 900000000, 'x')` ran 16 s. Over this, printf gives NULL (as
# SQLite's own printf does for a result past LENGTH).
MAX_PRINTF_WIDTH = 10_000
_PRINTF_FIELD = re.compile(r"%[-+ 0#,!]*(\*|\d+)?(?:\.(\*|\d+))?([a-zA-Z%])")


def _bounded_printf(fmt: Any, *args: Any) -> Any:
    """SQLite's printf (and format), with every width and precision at most MAX_PRINTF_WIDTH."""
    if isinstance(fmt, str):
        taken = 0
        for field in _PRINTF_FIELD.finditer(fmt):
            for size in field.group(1, 2):
                if size == "*":
                    value, taken = (args[taken] if taken < len(args) else 0), taken + 1
                    size = value if isinstance(value, int) else 0
                if size is not None and abs(int(size)) > MAX_PRINTF_WIDTH:
                    return None
            if field.group(3) != "%":
                taken += 1
    marks = ", ".join("?" * (1 + len(args)))
    return _plain_connection().execute(f"SELECT printf({marks})", (fmt, *args)).fetchone()[0]


# printf runs once a row: each thread keeps one plain connection for SQLite's own printf instead of opening one a
# call (a sqlite3 connection is used only in the thread that made it; it closes when its thread ends).
_plain = threading.local()


def _plain_connection() -> sqlite3.Connection:
    """This thread's plain in-memory connection (no limits, no functions of ours), made on first use."""
    conn = getattr(_plain, "connection", None)
    if conn is None:
        conn = _plain.connection = sqlite3.connect(":memory:")
    return conn


# A statement's first keyword, after any whitespace and comments.
_LEADING_EXPLAIN = re.compile(r"(?:\s+|--[^\n]*(?:\n|$)|/\*.*?(?:\*/|$))*(?:EXPLAIN|QUERY)\b",
                              re.IGNORECASE | re.DOTALL)
_READ_ONLY_PRAGMAS = {"table_info", "table_xinfo", "index_list", "index_info", "foreign_key_list"}


def describe_schema() -> str:
    """The schema text shown to the model, so that it can write SQL without exploring."""
    segments = sorted({row[-1] for row in DOMESTIC + OVERSEAS})
    countries = sorted({row[1] for row in OVERSEAS})
    categories = sorted({row[1] for row in PRODUCTS})
    return (
        "Tables:\n"
        "- customers(id INTEGER PRIMARY KEY, name TEXT, country TEXT, region TEXT, is_overseas INTEGER, "
        "segment TEXT)\n"
        f"  country is an ISO code: 'KR' for domestic customers, overseas ones in {', '.join(countries)}; "
        "is_overseas is 0 for domestic (KR) and 1 for overseas; "
        f"segment is one of {', '.join(segments)}.\n"
        "- products(id INTEGER PRIMARY KEY, name TEXT, category TEXT, unit_price REAL)"
        f"\n  category is one of {', '.join(categories)}; unit_price is in KRW.\n"
        "- orders(id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id), "
        "product_id INTEGER REFERENCES products(id), order_date TEXT, month TEXT, quantity INTEGER, "
        "amount REAL)\n"
        "  order_date is 'YYYY-MM-DD', month is 'YYYY-MM'; amount is the sale in KRW after discounts.\n"
        "View:\n"
        "- monthly_sales(month TEXT, customer_id INTEGER, customer_name TEXT, is_overseas INTEGER, "
        "total REAL)\n"
        "  one row per customer per month with orders: total = SUM(orders.amount).\n"
        f"Orders cover every month from {FIRST_YEAR}-01 to {LAST_YEAR}-12."
    )


@contextlib.contextmanager
def _read_only_connection() -> Iterator[tuple[sqlite3.Connection, list[int], float]]:
    """The sample database, read-only, behind the allow-list and the time limit; yields the refusals list."""
    time_limit = float(getattr(settings, "ARBOR_SQL_TIME_LIMIT_SECONDS", DEFAULT_TIME_LIMIT_SECONDS))
    path = ensure_sales_db()

    denied: list[int] = []  # authorizer refusals, to explain the error that follows

    def authorize(action: int, arg1: str | None, arg2: str | None, *_: Any) -> int:
        if action in _ALLOWED_ACTIONS or (
            action == sqlite3.SQLITE_PRAGMA and arg1 in _READ_ONLY_PRAGMAS and arg2
        ):
            return sqlite3.SQLITE_OK
        denied.append(action)
        return sqlite3.SQLITE_DENY

    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as conn:
        conn.execute("PRAGMA query_only=ON")
        conn.set_authorizer(authorize)
        for limit, value in _LIMITS.items():
            conn.setlimit(limit, value)
        for name in ("printf", "format"):
            conn.create_function(name, -1, _bounded_printf, deterministic=True)
        deadline = time.monotonic() + time_limit
        # A non-zero return from the progress handler makes SQLite abort with "interrupted": past the deadline,
        # or once the runner stopped waiting (a timeout, or the turn stopped).
        conn.set_progress_handler(lambda: time.monotonic() > deadline or cancelled(), PROGRESS_EVERY)
        yield conn, denied, time_limit


def sql_query(sql: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run one read-only statement and return its columns and (capped) rows.

    `params` are bound to the statement's named placeholders (`:name`): a value is always data, never SQL.
    The rows are an iterator, read by the tool runner only as far as its output limit goes; the connection
    stays open until it is read to the end or closed. `row_count` and `truncated` are filled in as it is
    read, so they follow `rows` in the result.
    """
    row_cap = int(getattr(settings, "ARBOR_SQL_ROW_CAP", DEFAULT_ROW_CAP))
    opened = contextlib.ExitStack()
    conn, denied, time_limit = opened.enter_context(_read_only_connection())
    try:
        # The driver refuses a second statement at prepare time ("You can only execute
        # one statement at a time"), before anything runs.
        cursor = conn.execute(sql, params or {})
        if cursor.description is None:
            raise ToolError("the statement returned no rows: send a single SELECT query")
    except (sqlite3.Error, sqlite3.Warning) as exc:
        opened.close()
        raise _tool_error(exc, denied, time_limit) from exc
    except BaseException:
        opened.close()
        raise
    result: dict[str, Any] = {"columns": [column[0] for column in cursor.description], "rows": None,
                              "row_count": 0, "truncated": False}

    def rows() -> Iterator[list[Any]]:
        with opened:
            try:
                for row in cursor:
                    if result["row_count"] == row_cap:
                        result["truncated"] = True
                        return
                    yield list(row)
                    # Counted when the reader asks for the next row: a row it could not fit is not counted.
                    result["row_count"] += 1
            except (sqlite3.Error, sqlite3.Warning) as exc:
                raise _tool_error(exc, denied, time_limit) from exc

    result["rows"] = rows()
    return result


def sql_check(sql: str, params: dict[str, Any] | None = None) -> None:
    """Raise the ToolError `sql_query` would give for `sql` (and `params`), without running it or reading a row.

    `EXPLAIN QUERY PLAN` compiles the statement through the same connection and allow-list, so unknown
    tables or columns, syntax errors, writes, second statements and missing placeholder values are refused
    as a run would refuse them. A statement that is itself an EXPLAIN (or the tail of one, `QUERY PLAN
    SELECT ...`, which only compiles behind the prefix) is refused: a check must never pass what a run
    refuses.
    """
    if not sql.strip():
        raise ToolError("the statement is empty: send a single SELECT query")
    if _LEADING_EXPLAIN.match(sql):
        raise ToolError("send the query itself (a SELECT or WITH ... SELECT), not an EXPLAIN or QUERY PLAN of it")
    with _read_only_connection() as (conn, denied, time_limit):
        try:
            conn.execute(f"EXPLAIN QUERY PLAN {sql}", params or {})
        except (sqlite3.Error, sqlite3.Warning) as exc:
            raise _tool_error(exc, denied, time_limit) from exc


def _tool_error(exc: Exception, denied: list[int], time_limit: float) -> ToolError:
    message = str(exc)
    name = getattr(exc, "sqlite_errorname", "")
    if name == "SQLITE_INTERRUPT":
        return ToolError(f"query took longer than {time_limit} s and was stopped")
    if name == "SQLITE_TOOBIG":
        return ToolError(f"a value the query builds is longer than {_LIMITS[sqlite3.SQLITE_LIMIT_LENGTH]:,} bytes "
                         "(or the statement or a LIKE pattern is too long): build smaller values")
    if denied or name == "SQLITE_READONLY":
        return ToolError("read-only database: writes are refused; only a single SELECT query may run")
    if "one statement at a time" in message:
        return ToolError("only a single SQL statement is allowed; remove everything after the first ';'")
    if "syntax error" in message or message == "incomplete input":
        return ToolError(f"syntax error: {message.removesuffix(': syntax error')}")
    return ToolError(f"SQL error: {message}")


TOOL = register(
    Tool(
        name="sql_query",
        description=(
            "Run one read-only SQLite query on the sample sales database; returns {columns, rows, row_count, "
            "truncated}. One SELECT (or WITH ... SELECT) only; writes are refused. params binds :name values. "
            "Rows are capped (truncated=true: more existed) and slow queries stopped: aggregate, ORDER BY, LIMIT. "
            "Dates are text; for last month use "
            "month = strftime('%Y-%m', 'now', 'start of month', '-1 month').\n" + describe_schema()
        ),
        parameters={
            "type": "object",
            "properties": {
                "sql": {"type": "string", "description": "A single SQLite SELECT statement."},
                "params": {"type": "object", "additionalProperties": {"type": ["string", "number", "boolean", "null"]}},
            },
            "required": ["sql"],
            "additionalProperties": False,
        },
        function=sql_query,
        needs_approval=False,
    )
)
