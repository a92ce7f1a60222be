"""The API's token check: DRF's `TokenAuthentication`, its look-up compiled once.

Every API request looks its key up. Through the ORM that meant building the same query each time: 9–11% of a
quick API turn's Python time in bench_load's profile (issue 34), the largest single share. The statement is the
ORM's own, compiled once per database and run with each key; the objects it gives, and every answer and error, are
DRF's.
"""

from __future__ import annotations

import functools
from typing import Any

from django.db import connections, router
from django.utils.translation import gettext_lazy as _
from rest_framework import authentication, exceptions
from rest_framework.authtoken.models import Token


@functools.cache
def _compiled(alias: str) -> tuple[str, list, int]:
    """The look-up's SQL on `alias`, its columns, and how many of them are the token's (the user's follow)."""
    query = Token.objects.select_related("user").filter(key="").query
    compiler = query.get_compiler(using=alias)
    sql, params = compiler.as_sql()
    if list(params) != [""]:  # the key must be the statement's only parameter
        raise RuntimeError(f"unexpected parameters in the token look-up: {params!r}")
    columns = [column for column, _, _ in compiler.select]
    return sql, columns, next(i for i, column in enumerate(columns) if column.target.model is not Token)


_KEY_CHARS = Token._meta.get_field("key").max_length


def token_and_user(key: str) -> Token | None:
    """The token with this key, its user loaded with it (as `select_related("user")`), or None."""
    if not key or len(key) > _KEY_CHARS or "\x00" in key:  # no key is that (PostgreSQL refuses a NUL: a 500)
        return None
    alias = router.db_for_read(Token)
    sql, columns, split = _compiled(alias)
    connection = connections[alias]
    with connection.cursor() as cursor:
        cursor.execute(sql, [key])
        row = cursor.fetchone()
    if row is None:
        return None
    values: list[Any] = list(row)
    for position, column in enumerate(columns):  # the backend's converters (SQLite's dates), as the ORM applies them
        for convert in connection.ops.get_db_converters(column) + column.get_db_converters(connection):
            values[position] = convert(values[position], column, connection)
    names = [column.target.attname for column in columns]
    token = Token.from_db(alias, names[:split], values[:split])
    token.user = Token.user.field.related_model.from_db(alias, names[split:], values[split:])
    return token


class TokenAuthentication(authentication.TokenAuthentication):
    def authenticate_credentials(self, key):
        if self.get_model() is not Token:  # a subclass's own token model: DRF's look-up
            return super().authenticate_credentials(key)
        token = token_and_user(key)
        if token is None:
            raise exceptions.AuthenticationFailed(_("Invalid token."))
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed(_("User inactive or deleted."))
        return token.user, token
