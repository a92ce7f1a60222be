"""A conversation that answers the seeds' sales question through a tool call, as a user would have it."""

from __future__ import annotations

import json

from conversations.models import Conversation
from tests.conversations.helpers import ask

# "Top customers by sales for a month, without overseas" (seeds/000): the month, the limit and the
# domestic-only filter become the playbook's parameters.
SALES_SQL = ("SELECT customer_name, total FROM monthly_sales WHERE month = '2026-10' AND is_overseas = 0 "
             "ORDER BY total DESC LIMIT 5")


def sales_question(directives: str = "") -> str:
    return f"Top 5 domestic customers by sales in 2026-10 {directives} #tool sql_query {json.dumps({'sql': SALES_SQL})}"


def sales_conversation(conversation: Conversation, directives: str = "") -> Conversation:
    ask(conversation, sales_question(directives))
    conversation.refresh_from_db()
    return conversation
