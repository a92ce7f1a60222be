"""Playbook errors, in the project's error shape (conversations.errors.ArborError)."""

from __future__ import annotations

from config.errors import ArborError


class PlaybookInvalid(ArborError):
    """P1: the last try's draft still fails validation; `errors` are its messages, `nodes` every try."""

    code = "playbook_invalid"
    status = 422
