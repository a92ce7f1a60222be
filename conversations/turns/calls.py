"""Tool calls still open at the end of a path, the people's decisions on them (F3), and their results (C4, T4).

An open call is one on the path's last (succeeded) node with no result yet: its result goes out first in
the next call's sent items. A call to a tool that acts on the outside world runs only after a person on
this server approved it (D4): the decision is a `ToolApproval` row, and its result is stored with it so
the action never runs twice.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings

from conversations import items as it
from conversations import services, tracing
from conversations.context import PathNode
from conversations.models import Node, ToolApproval
from conversations.tools import get_tool
from conversations.tools.runner import run_tool_call


def open_calls(tip: PathNode | None) -> list[it.Item]:
    """Tool calls on the path's last node that have no result yet: their results must go out first."""
    if tip is None or tip.status != Node.Status.SUCCEEDED:
        return []
    return it.tool_calls(tip.received)


CLIENT_RESULT = "not run here: the client that offered this tool runs it, and sent no output for this call"


def is_clients(call: it.Item) -> bool:
    """A call to a tool of the client's own (the OpenAI-compatible surface): never run or approved here, whatever
    its name, not even by a later turn from the chat page or the API."""
    return call.get("client") is True


def needs_approval(call: it.Item) -> bool:
    if is_clients(call):
        return False
    tool = get_tool(call["name"])
    return bool(tool and tool.needs_approval)


def undecided(tip: PathNode | None, *, owner: int) -> list[it.Item]:
    """The open calls on `owner`'s node `tip` that wait for a person's decision (F3)."""
    calls = [c for c in open_calls(tip) if needs_approval(c)]
    if not calls:
        return []
    decided = set(ToolApproval.objects.filter(owner_id=owner, node_id=tip.id).values_list("call_id", flat=True))
    return [c for c in calls if c["id"] not in decided]


NOT_OFFERED = ("error: this conversation does not have that tool's server on, or the call may not use that tool (on "
               "/v1, only the tools of the MCP servers it named that need no person's approval), so it was not run")


def resolve(node: PathNode, *, run: bool, owner_id: int, note: str = "",
            stop_requested: Callable[[], bool] = lambda: False,
            allowed: Callable[[str], bool] = lambda name: True, conversation_id: int | None = None,
            answered: set[str] = frozenset()) -> list[it.Item]:
    """Results for `node`'s open calls (C4: every call gets one). Without `run`, nothing new executes:
    a call with no stored result gets an error result that says `note`; nor does a call to a tool `allowed`
    refuses (an MCP server the conversation has off). A stop asked while a tool runs leaves it with a result that
    says so. `owner_id`: the node's (issue 34). The model's own calls count against `owner_id`'s running tools
    (issue 26); an approved action does not: a person's click paces it, and a refusal would spend the approval."""
    calls = [call for call in open_calls(node) if call["id"] not in answered]  # results the caller sent: theirs
    # Read whatever the tool says of itself now: an MCP tool's annotations (or staff's override) may have changed
    # since the person decided, and a result stored must never be run again, nor a decision go unread (F3, D4).
    decisions = ({a.call_id: a for a in ToolApproval.objects.filter(owner_id=owner_id, node_id=node.id)}
                 if any(not is_clients(c) for c in calls) else {})
    # A round's results share a quarter of what a node may store (the answer may take half).
    share = settings.ARBOR_NODE_MAX_BYTES // 4 // max(1, len(calls))
    results = []
    for call in calls:
        decision = decisions.get(call["id"])
        if decision is not None and decision.result:
            results.append(decision.result)
        elif is_clients(call):
            results.append(it.tool_result(call["id"], call["name"], CLIENT_RESULT, is_error=True))
        elif not run:
            results.append(it.tool_result(call["id"], call["name"], note, is_error=True))
        elif not allowed(call["name"]):
            results.append(it.tool_result(call["id"], call["name"], NOT_OFFERED, is_error=True))
        elif decision is not None:
            with tracing.tool_span(call, node_id=node.id, conversation_id=conversation_id):
                result = run_tool_call(call, approved=decision.approved, max_bytes=share, stop_requested=stop_requested)
            services.approval_store_result(node_id=node.id, owner=owner_id, call_id=call["id"], result=result)
            results.append(result)
        else:
            with tracing.tool_span(call, node_id=node.id, conversation_id=conversation_id) as span:
                results.append(run_tool_call(call, max_bytes=share, stop_requested=stop_requested, owner_id=owner_id))
                if span is not None and results[-1].get("is_error"):
                    span.set_attribute("error.type", "tool_error")
    return results
