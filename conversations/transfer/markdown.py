"""The current path as Markdown: what a person reads, for sharing."""

from __future__ import annotations

from conversations.models import Bubble, Conversation
from conversations.screen import path_bubbles


def export_markdown(conversation: Conversation) -> str:
    """The current path as a person saw it: questions, answers, tool calls, failures."""
    lines = [f"# {conversation.title or f'Conversation {conversation.pk}'}", ""]
    for view in path_bubbles(conversation=conversation):
        bubble = view.bubble
        if bubble.role == Bubble.Role.USER:
            lines += ["## Question", "", bubble.content, ""]
        elif bubble.role == Bubble.Role.ASSISTANT:
            lines += ["## Answer", "", bubble.content, ""]
        elif bubble.role == Bubble.Role.TOOL:
            data = bubble.data
            lines += [f"**Tool `{data.get('name', bubble.content)}`** ({data.get('status', '')})", "",
                      "```json", str(data.get("arguments", "")), "```", ""]
            if data.get("result") is not None:
                lines += ["```", str(data["result"]), "```", ""]
        elif bubble.role == Bubble.Role.ERROR:
            lines += [f"> The call failed ({bubble.data.get('reason', 'error')}): {bubble.content}", ""]
        else:  # the compaction marker
            lines += ["---", f"*{bubble.content}*", ""]
    return "\n".join(lines).rstrip() + "\n"
