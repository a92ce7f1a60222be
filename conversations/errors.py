"""The conversation domain's errors; the generic ones (bad input, not found, too large) are `config.errors`."""

from __future__ import annotations

from config.errors import ArborError


class TurnInProgress(ArborError):
    code = "turn_in_progress"
    status = 409

    def __init__(self, message: str = "A turn is running on this conversation; try again when it ends."):
        super().__init__(message)


class TooManyTurns(ArborError):
    """The person already has ARBOR_MAX_CONCURRENT_TURNS_PER_USER turns running (fairness, issue 13)."""

    code = "too_many_turns"
    status = 429


class ApprovalPending(ArborError):
    code = "approval_pending"
    status = 409


class NotABranch(ArborError):
    """A well-formed mark the node cannot take as it is now (a side call, a detached node, a star where the
    conversation could not open): the node's state, not the request, is the conflict."""

    code = "not_a_branch"
    status = 409


class BeforeCompaction(ArborError):
    code = "before_compaction"
    status = 409


# A failed model call's reason (T1) as an HTTP status.
FAILURE_STATUS = {"rate_limit": 503, "timeout": 503, "context_overflow": 502, "provider_error": 502,
                  "unavailable": 503}


class ProviderFailed(ArborError):
    """A model call failed; `code` is its failure reason, and the failed node is recorded."""

    def __init__(self, reason: str, message: str, **extra):
        super().__init__(message, code=reason, status=FAILURE_STATUS.get(reason, 502), **extra)


class CorruptTree(ArborError):
    code = "corrupt_tree"
    status = 500
