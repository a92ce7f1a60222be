"""What people spend (issue 31): the usage ledger read back, budgets, and the check that ledger and tree agree.

The ledger (`UsageEntry`) is written by the node recorder with each call's ending (`records.succeed`), never here.
A budget is checked before a turn takes its lock (`start._under_lock`): past it, the turn is refused with nothing
recorded. The budget is read by the statement that takes the turn lock, so a person without one costs no query.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass
from typing import Any

from django.db.models import Count, Sum
from django.utils import timezone

from config.errors import ArborError, BadInput
from conversations.models import Node, UsageBudget, UsageEntry
from conversations.turns.records import (  # the recorder makes the rows: one definition
    CLIENT,
    charged_partly,
    ledger_entry,
)

GROUPS = {"day": "day", "model": "model", "conversation": "conversation_id", "project": "project_id"}


class BudgetExceeded(ArborError):
    code = "budget_exceeded"
    status = 402


def month_start(now: dt.datetime | None = None) -> dt.date:
    return (now or timezone.now()).date().replace(day=1)


def spent_this_month(owner_id: int) -> dict[str, Any]:
    totals = UsageEntry.objects.filter(owner_id=owner_id, day__gte=month_start()).aggregate(
        input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"), cost_usd=Sum("cost_usd"))
    tokens = (totals["input_tokens"] or 0) + (totals["output_tokens"] or 0)
    return {"tokens": tokens, "cost_usd": round(totals["cost_usd"] or 0.0, 6)}


def check_budget(owner_id: int, monthly_tokens: int | None, monthly_cost_usd: float | None) -> None:
    """Refuse a turn (402 `budget_exceeded`) when its person has spent this month's budget (read with the turn
    lock: a person without one costs no query)."""
    if monthly_tokens is None and monthly_cost_usd is None:
        return
    spent = spent_this_month(owner_id)
    if monthly_tokens is not None and spent["tokens"] >= monthly_tokens:
        raise BudgetExceeded(f"This month's budget of {monthly_tokens} tokens is spent ({spent['tokens']} used); "
                             "it renews on the 1st (UTC), or ask an administrator to raise it.")
    if monthly_cost_usd is not None and spent["cost_usd"] >= monthly_cost_usd:
        raise BudgetExceeded(f"This month's budget of ${monthly_cost_usd:.2f} is spent (${spent['cost_usd']:.2f} "
                             "used); it renews on the 1st (UTC), or ask an administrator to raise it.")


def budget_of(owner) -> dict[str, Any]:
    budget = UsageBudget.objects.filter(owner=owner).first()
    return {"monthly_tokens": budget and budget.monthly_tokens, "monthly_cost_usd": budget and budget.monthly_cost_usd,
            "spent_this_month": spent_this_month(owner.pk)}


def set_budget(owner, body: Any) -> dict[str, Any]:
    """`monthly_tokens` (a whole number ≥ 1) and `monthly_cost_usd` (a number > 0), each null for no limit."""
    if not isinstance(body, dict) or not set(body) <= {"monthly_tokens", "monthly_cost_usd"} or not body:
        raise BadInput("Send `monthly_tokens` and/or `monthly_cost_usd` (null for no limit), nothing else.")
    tokens, cost = body.get("monthly_tokens"), body.get("monthly_cost_usd")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise BadInput("`monthly_tokens` must be a whole number of at least 1, or null.", param="monthly_tokens")
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float) or cost <= 0):
        raise BadInput("`monthly_cost_usd` must be a number above 0, or null.", param="monthly_cost_usd")
    budget, _ = UsageBudget.objects.get_or_create(owner=owner)
    for name in ("monthly_tokens", "monthly_cost_usd"):
        if name in body:
            setattr(budget, name, body[name])
    budget.save()
    return budget_of(owner)


def _day(value: str | None, name: str) -> dt.date | None:
    if value is None:
        return None
    try:
        return dt.date.fromisoformat(value)
    except ValueError:
        raise BadInput(f"`{name}` must be a date (YYYY-MM-DD).", param=name) from None


def summary(owner_id: int, query) -> dict[str, Any]:
    """`GET /api/usage/`: the calls, tokens and cost of `owner_id` from `from` to `to` (days, both included),
    in `group`s (day, model, conversation or project)."""
    group = query.get("group", "day")
    if group not in GROUPS:
        raise BadInput("`group` must be day, model, conversation or project.", param="group")
    entries = UsageEntry.objects.filter(owner_id=owner_id)
    start, end = _day(query.get("from"), "from"), _day(query.get("to"), "to")
    if start:
        entries = entries.filter(day__gte=start)
    if end:
        entries = entries.filter(day__lte=end)
    sums = {"calls": Count("id"), "input_tokens": Sum("input_tokens"), "output_tokens": Sum("output_tokens"),
            "cost_usd": Sum("cost_usd")}
    total = entries.aggregate(**sums)
    rows = entries.values(GROUPS[group]).annotate(**sums).order_by(GROUPS[group])

    def said(row: dict) -> dict[str, Any]:
        return {"calls": row["calls"] or 0, "input_tokens": row["input_tokens"] or 0,
                "output_tokens": row["output_tokens"] or 0, "cost_usd": round(row["cost_usd"] or 0.0, 6)}

    groups = [{"key": str(row[GROUPS[group]]), **said(row)} for row in rows]
    return {**said(total), "groups": groups}


_FIGURES = ("owner_id", "conversation_id", "project_id", "model", "input_tokens", "output_tokens", "cached_tokens",
            "cost_usd", "estimated")


def disagreements() -> list[str]:
    """Every difference between the ledger and the nodes: a turn's call that reached a provider with no row
    (a turn's call is known by the settings it sent, which an imported node or a compaction root never has; one
    that failed counts when output had arrived), a row whose figures are not its node's, a row of a node that
    reached no provider. Nodes deleted since are no difference: rows outlive them."""
    found: list[str] = []
    rows = {row.node_id: row for row in UsageEntry.objects.all()}
    calls = Node.objects.filter(kind=Node.Kind.TURN, call_settings__isnull=False).exclude(provider=CLIENT)
    answered = calls.filter(status=Node.Status.SUCCEEDED).values_list("pk", flat=True)
    broken_off = [(pk, parent, settings) for pk, parent, settings, received in calls.filter(
        status=Node.Status.FAILED).values_list("pk", "parent_id", "call_settings_id", "received").iterator()
        if charged_partly(received) and pk not in rows]
    found += [f"node {pk}: a call that reached a provider has no ledger row"
              for pk in itertools.chain(answered.iterator(), (pk for pk, _, _ in broken_off)) if pk not in rows
              and not _answered_late(pk, broken_off, rows)]
    for node in Node.objects.filter(pk__in=list(rows)).select_related("conversation").iterator(chunk_size=500):
        row = rows[node.pk]
        charged = node.status == Node.Status.SUCCEEDED or (node.status == Node.Status.FAILED
                                                            and charged_partly(node.received))
        if not charged or node.provider == CLIENT:
            found.append(f"node {node.pk}: a ledger row for a call that reached no provider")
            continue
        expected = ledger_entry(node)
        differs = [name for name in _FIGURES if getattr(expected, name) != getattr(row, name)]
        if differs:
            found.append(f"node {node.pk}: the ledger differs in {', '.join(differs)}")
    return found


def _answered_late(pk: int, broken_off: list[tuple[int, int | None, int]], rows: dict) -> bool:
    """A call the sweep failed while its process was only slow: the answer it brought later went on a sibling (the
    same parent and settings), whose row replaced the sweep's estimate (`records._settle`): one call, one row."""
    found = next((entry for entry in broken_off if entry[0] == pk), None)
    if found is None:
        return False
    _, parent, settings = found
    later = Node.objects.filter(parent_id=parent, call_settings_id=settings, pk__gt=pk).values_list("pk", flat=True)
    return any(sibling in rows for sibling in later)


LOW_SHARE = 0.8  # the chat page says what is left once this much of a budget is spent


def budget_left_note(owner_id: int) -> str:
    """What the chat page says when a person's month runs low (issue 31): "" while it does not."""
    budget = UsageBudget.objects.filter(owner_id=owner_id).first()
    if budget is None or (budget.monthly_tokens is None and budget.monthly_cost_usd is None):
        return ""
    spent = spent_this_month(owner_id)
    notes = []
    if budget.monthly_tokens and spent["tokens"] >= LOW_SHARE * budget.monthly_tokens:
        notes.append(f"{max(0, budget.monthly_tokens - spent['tokens']):,} of {budget.monthly_tokens:,} tokens")
    if budget.monthly_cost_usd and spent["cost_usd"] >= LOW_SHARE * budget.monthly_cost_usd:
        notes.append(f"${max(0.0, budget.monthly_cost_usd - spent['cost_usd']):.2f} of ${budget.monthly_cost_usd:.2f}")
    return f"This month's budget runs low: {' and '.join(notes)} left." if notes else ""


@dataclass(frozen=True)
class Bar:
    label: str
    tokens: int
    cost_usd: float
    calls: int
    height: float  # of CHART_HEIGHT, by tokens
    x: float

    @property
    def y(self) -> float:
        return round(CHART_HEIGHT - self.height, 1)


CHART_HEIGHT, BAR_STEP = 120.0, 22.0


def chart(entries, *, by: str, limit: int = 31) -> list[Bar]:
    """Bars for the admin's usage page, drawn on the server (no script): tokens in and out per `by` ("day", the
    latest `limit` days, oldest first; "model", the `limit` biggest), from the ledger rows `entries`."""
    rows = entries.values(by).annotate(calls=Count("id"), tokens=Sum("input_tokens") + Sum("output_tokens"),
                                       cost=Sum("cost_usd"))
    rows = (sorted(rows.order_by(f"-{by}")[:limit], key=lambda row: row[by]) if by == "day"
            else list(rows.order_by("-tokens", by)[:limit]))
    top = max((row["tokens"] or 0 for row in rows), default=0) or 1
    return [Bar(label=str(row[by]), tokens=row["tokens"] or 0, cost_usd=round(row["cost"] or 0.0, 4),
                calls=row["calls"], height=round(CHART_HEIGHT * (row["tokens"] or 0) / top, 1), x=index * BAR_STEP)
            for index, row in enumerate(rows)]
