"""Several writes in one round trip (issue 13: a turn's statements).

`together()` collects INSERTs and UPDATEs the ORM builds. On PostgreSQL they go out as one statement of
data-modifying CTEs when the block ends: one round trip, atomic on its own (no BEGIN and COMMIT of their
own), where a turn's answer used to take six. Elsewhere (SQLite, the embedded default) each runs at once, in
one transaction, with the same results. Either way a write can use an earlier one's new primary key
(`Written.pk`) and can be made to happen only if an earlier one touched a row (`when=`).

    with together() as writes:
        node = writes.insert(Node(...))
        writes.insert(Bubble(node_id=node.pk, ...))
        moved = writes.update(Conversation.objects.filter(pk=c, version=v), head_id=node.pk)
        writes.insert(OutboxJob(...), when=moved)
    node.obj.pk, moved.count                # known once the block has ended

In one statement every part reads the database as it was before the statement, so a part never sees what
another wrote: an UPDATE cannot find a row INSERTed beside it. `after` runs once the writes are done (for
the caller's in-memory copies).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connection, connections, models, transaction
from django.db.models.constants import OnConflict
from django.db.models.expressions import RawSQL
from django.db.models.sql import InsertQuery, UpdateQuery


class Written:
    """One write of a batch: its rows' primary keys once the batch ran."""

    def __init__(self, index: int, model: type[models.Model], obj: models.Model | None = None):
        self._index, self.obj = index, obj
        self.column = connection.ops.quote_name(model._meta.pk.column)
        self.pks: list[Any] | None = None

    @property
    def name(self) -> str:
        return f"written_{self._index}"

    @property
    def count(self) -> int:
        """How many rows it wrote (0 for a write whose `when` touched nothing)."""
        if self.pks is None:
            raise RuntimeError("the batch has not run yet")
        return len(self.pks)

    @property
    def pk(self) -> Any:
        """The new row's primary key: a value once known, or, inside the statement, a reference to it."""
        if self.pks is not None:
            return self.pks[0] if self.pks else None
        return _Reference(f"(SELECT {self.column} FROM {self.name})", self)


class _Reference(RawSQL):
    """An earlier write's new key, inside the statement; replaced by the value on the object once known."""

    def __init__(self, sql: str, written: Written):
        super().__init__(sql, ())
        self.written = written


class Together:
    def __init__(self, *, one_statement: bool):
        self.one_statement = one_statement
        self._parts: list[tuple[Written, str, tuple]] = []
        self._after: list[Callable[[], None]] = []
        self._inserted: dict[int, Written] = {}  # by id(obj)
        self._notices: list[tuple[str, str]] = []

    def insert(self, obj: models.Model, *, when: Written | None = None) -> Written:
        """INSERT `obj` (as `obj.save()` would, with its `auto_now_add` dates); skipped if `when` touched
        no row."""
        written = Written(len(self._parts), obj.__class__, obj)
        self._inserted[id(obj)] = written
        if not self.one_statement:
            if when is None or when.count:
                obj.save(force_insert=True)
                written.pks = [obj.pk]
            else:
                written.pks = []
            return written
        if obj.pk is None:  # as `Model._save_table`: a default key (a UUID) now, an auto one from the database
            obj.pk = obj._meta.pk.get_pk_value_on_save(obj)
        sql, params = _insert_sql([obj])
        if when is not None:  # one row: `INSERT INTO t (…) VALUES (…) RETURNING …` as `… SELECT … WHERE …`
            head, rest = sql.split(" VALUES (", 1)
            values, returning = rest.rsplit(") RETURNING ", 1)
            sql = f"{head} SELECT {values} WHERE EXISTS (SELECT 1 FROM {when.name}) RETURNING {returning}"
        self._parts.append((written, sql, params))
        return written

    def insert_once(self, obj: models.Model) -> Written:
        """INSERT `obj` unless a row with its unique key is there already (ON CONFLICT DO NOTHING): a value kept
        once for every row that names it, written with the first, at no extra round trip."""
        written = Written(len(self._parts), obj.__class__, obj)
        if not self.one_statement:
            obj.__class__.objects.bulk_create([obj], ignore_conflicts=True)
            written.pks = [obj.pk]
            return written
        self._parts.append((written, *_insert_sql([obj], on_conflict=OnConflict.IGNORE)))
        return written

    def insert_rows(self, objs: list[models.Model]) -> Written:
        """INSERT several rows of one model (as `bulk_create`); their keys are not kept on the objects."""
        model = objs[0].__class__
        written = Written(len(self._parts), model)
        if not self.one_statement:
            written.pks = [obj.pk for obj in model.objects.bulk_create(objs)]
            return written
        self._parts.append((written, *_insert_sql(objs)))
        return written

    def update(self, queryset: models.QuerySet, *, when: Written | None = None, **changes: Any) -> Written:
        """`queryset.update(**changes)`; skipped if `when` touched no row."""
        written = Written(len(self._parts), queryset.model)
        if not self.one_statement:
            written.pks = ([None] * queryset.update(**changes)) if when is None or when.count else []
            return written
        if when is not None:
            queryset = queryset.filter(RawSQL(f"EXISTS (SELECT 1 FROM {when.name})", (),
                                              output_field=models.BooleanField()))
        sql, params = update_sql(queryset, **changes)
        sql = f"{sql} RETURNING {connection.ops.quote_name(queryset.model._meta.db_table)}.{written.column}"
        self._parts.append((written, sql, tuple(params)))
        return written

    def pk_of(self, obj: models.Model) -> Any:
        """`obj`'s primary key: its value, or a reference to it while its INSERT waits in this batch."""
        written = self._inserted.get(id(obj))
        return written.pk if written is not None else obj.pk

    def after(self, step: Callable[[], None]) -> None:
        """Run `step` once the writes are done (at once, when they already are)."""
        if self.one_statement:
            self._after.append(step)
        else:
            step()

    def notify(self, channel: str, payload: str) -> None:
        """PostgreSQL's NOTIFY with the writes, in their statement: sent when they commit (`config.news`)."""
        self._notices.append((channel, payload))

    def run(self) -> None:
        notices = ", ".join("pg_notify(%s, %s)" for _ in self._notices)
        notice_params = tuple(p for notice in self._notices for p in notice)
        if self._parts:
            ctes = ", ".join(f"{written.name} AS ({sql})" for written, sql, _ in self._parts)
            columns = ", ".join(f"(SELECT array_agg({written.column}) FROM {written.name})"
                                for written, _, _ in self._parts)
            params = tuple(p for _, _, part in self._parts for p in part)
            with connection.cursor() as cursor:
                cursor.execute(f"WITH {ctes} SELECT {columns}{', ' if notices else ''}{notices}",
                               params + notice_params)
                row = cursor.fetchone()[:len(self._parts)]
            for (written, _, _), pks in zip(self._parts, row, strict=True):
                written.pks = list(pks or [])
            for written, _, _ in self._parts:
                if written.obj is not None:
                    _settle(written)
        elif notices:
            with connection.cursor() as cursor:
                cursor.execute(f"SELECT {notices}", notice_params)
        for step in self._after:
            step()


def _settle(written: Written) -> None:
    """The inserted object as `save()` leaves it: its key, saved state, and the keys it referred to."""
    obj = written.obj
    obj.pk = written.pk
    obj._state.adding, obj._state.db = False, connection.alias
    for field in obj._meta.concrete_fields:
        value = getattr(obj, field.attname)
        if isinstance(value, _Reference):
            setattr(obj, field.attname, value.written.pk)


def _insert_sql(objs: list[models.Model], on_conflict: OnConflict | None = None) -> tuple[str, tuple]:
    """The SQL and parameters of one INSERT of `objs` (one model), returning their keys."""
    meta = objs[0]._meta
    fields = [f for f in meta.local_concrete_fields
              if not f.generated and (f is not meta.auto_field or objs[0].pk is not None)]
    query = InsertQuery(objs[0].__class__, on_conflict=on_conflict)
    query.insert_values(fields, objs)
    compiler = query.get_compiler(connection=_database())
    compiler.returning_fields = [meta.pk]
    [(sql, params)] = compiler.as_sql()
    return sql, tuple(params)


def update_sql(queryset: models.QuerySet, **changes: Any) -> tuple[str, tuple]:
    """The SQL and parameters of `queryset.update(**changes)`, to run with more around it."""
    query = queryset.query.chain(UpdateQuery)
    query.add_update_values(changes)
    query.clear_select_clause()
    sql, params = query.get_compiler(connection=_database()).as_sql()
    return sql, tuple(params)


def _database():
    """The connection itself, not `django.db.connection`: a compiler given that proxy looks the connection up
    again (a thread- and task-local read) on each of its hundreds of uses; that was ~1 ms of a turn (issue 34)."""
    return connections[DEFAULT_DB_ALIAS]


@contextmanager
def together(into: Together | None = None) -> Iterator[Together]:
    """Collect writes; they run when the block ends (PostgreSQL) or as they come, in a transaction. With
    `into`, they join that batch instead (a service called by a caller who batches)."""
    if into is not None:
        yield into
    elif connection.vendor == "postgresql":
        batch = Together(one_statement=True)
        yield batch
        batch.run()
    else:
        with transaction.atomic():
            batch = Together(one_statement=False)
            yield batch
