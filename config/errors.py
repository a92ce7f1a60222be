"""The errors every app raises. Each carries the API's error code and HTTP status; nothing here knows about DRF.

The apps' own domain errors (a turn in progress, a playbook still invalid) subclass `ArborError`.
"""

from __future__ import annotations


class ArborError(Exception):
    code = "error"
    status = 400

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None, **extra):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if status:
            self.status = status
        self.extra = extra


class BadInput(ArborError):
    code = "bad_input"
    status = 400


class NotFound(ArborError):
    code = "not_found"
    status = 404


class TooManyStreams(ArborError):
    """The person already follows ARBOR_MAX_STREAMS_PER_USER streams in this process (issue 26)."""

    code = "too_many_streams"
    status = 429


class TooLarge(ArborError):
    code = "too_large"
    status = 413
