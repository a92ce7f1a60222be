"""How many rows a statement reads, by PostgreSQL's own count: each statement is run again under
`EXPLAIN (ANALYZE, FORMAT JSON)`, inside a transaction that is rolled back, and every scan's rows (those it returned
and those its filters threw away) are summed over its loops. A query whose work grows with data that is not its
own (another conversation of the same person, say) shows it here, however fast the machine is; a timed test could
not say so reliably (issue 34).

The statements are planned as on a large table: a test's tables are small, and PostgreSQL reads a small table whole
by choice (a sequential scan, a hash join over it) where a large one would be read through an index. With those
plans off, a statement still reads rows that grow with others' data only where no index lets it do otherwise."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from django.db import IntegrityError, connection, transaction
from psycopg import errors

# `QuerySet.iterator()` reads through a server-side cursor: its query is the one after `FOR`.
_CURSOR = re.compile(r'^\s*DECLARE\s+"[^"]+"\s+NO SCROLL CURSOR(?:\s+WITH(?:OUT)?\s+HOLD)?\s+FOR\s+', re.IGNORECASE)
_READS = ("SELECT", "WITH", "UPDATE", "INSERT", "DELETE", "(")
_NOT_READS = ("SAVEPOINT", "RELEASE", "ROLLBACK", "COMMIT", "BEGIN", "SET")  # a transaction's own statements
# `executemany` is captured as "N times: <SQL with placeholders>", which cannot be run again; an INSERT … VALUES is
# counted as the one row each of its N runs may meet (a conflicting key), anything else is raised.
_MANY = re.compile(r"^(\d+) times: ")
_INSERT_VALUES = re.compile(r"^\s*INSERT\s+INTO\s+\S+\s*\([^)]*\)\s*VALUES\s*\(", re.IGNORECASE)


@dataclass(frozen=True)
class Read:
    sql: str
    rows: int  # rows the statement's scans read (returned and filtered out), over all their loops


def _rows(plan: dict) -> int:
    """The rows the plan's scans of tables read: a Bitmap Index Scan's are its heap scan's, and a CTE's or a
    subquery's scan reads rows counted where they were read."""
    own = 0
    if "Relation Name" in plan:  # Seq Scan, Index Scan, Index Only Scan, Bitmap Heap Scan
        per_loop = (plan.get("Actual Rows", 0) + plan.get("Rows Removed by Filter", 0)
                    + plan.get("Rows Removed by Index Recheck", 0))
        own = per_loop * max(1, plan.get("Actual Loops", 1))
    return own + sum(_rows(child) for child in plan.get("Plans", []))


def rows_read(statements: list[str]) -> list[Read]:
    """Each statement (SQL as the database got it, values in place) with the rows it reads when run again now.
    A write whose second run fails on a key it inserts (taken by its first run) is left out; a statement neither
    read nor a transaction's own, or any other failure, is raised: a statement is never silently not counted."""
    found = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; "
                           "SET LOCAL enable_mergejoin = off")
        for sql in statements:
            sql = _CURSOR.sub("", sql)
            if (many := _MANY.match(sql)) and _INSERT_VALUES.match(sql[many.end():]):
                found.append(Read(sql, int(many.group(1))))
                continue
            words = sql.lstrip().upper()
            if words.startswith(_NOT_READS):
                continue
            if not words.startswith(_READS):
                raise ValueError(f"not a statement rows_read knows how to count: {sql[:200]}")
            try:
                with transaction.atomic(), connection.cursor() as cursor:
                    cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql)
                    plan = cursor.fetchone()[0]
            except IntegrityError as error:
                if not isinstance(error.__cause__, errors.UniqueViolation):
                    raise
                continue  # a key it inserts is taken now (the turn's run, say): no scan to count
            plan = json.loads(plan) if isinstance(plan, str) else plan
            found.append(Read(sql, _rows(plan[0]["Plan"])))
        transaction.set_rollback(True)
    return found
