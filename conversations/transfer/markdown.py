"""The current path as Markdown: what a person reads, for sharing."""

from __future__ import annotations

from collections.abc import Iterator

from conversations.models import Bubble, Conversation
from conversations.screen import ShownBubble, history_bubbles
from conversations.transfer.chunks import joined, snapshot


def _lines(bubble: ShownBubble) -> list[str]:
    if bubble.role == Bubble.Role.USER:
        files = [f"- {'Image' if f.get('kind') == 'image' else 'File'}: {f.get('name', '')}"
                 for f in (bubble.data or {}).get("files", ())]  # X1: named; the bytes stay in Arbor
        return ["## Question", "", bubble.content, "", *([*files, ""] if files else [])]
    if bubble.role == Bubble.Role.ASSISTANT:
        return ["## Answer", "", bubble.content, ""]
    if bubble.role == Bubble.Role.TOOL:
        data = bubble.data
        lines = [f"**Tool `{data.get('name', bubble.content)}`** ({data.get('status', '')})", "",
                 "```json", str(data.get("arguments", "")), "```", ""]
        if data.get("result") is not None:
            lines += ["```", str(data["result"]), "```", ""]
        return lines
    if bubble.role == Bubble.Role.ERROR:
        return [f"> The call failed ({bubble.data.get('reason', 'error')}): {bubble.content}", ""]
    return ["---", f"*{bubble.content}*", ""]  # the compaction marker


def markdown_chunks(conversation: Conversation) -> Iterator[str]:
    """The current path as a person saw it (questions, answers, tool calls, failures), as text in parts: the
    bubbles are read a chunk of nodes at a time (issue 13). White space at the very end is dropped, once."""
    with snapshot():
        shown = history_bubbles(conversation.head_id, owner=conversation.owner_id)
        lines = (line for bubble in shown for line in _lines(bubble))
        title = [f"# {conversation.title or f'Conversation {conversation.pk}'}", ""]
        pending = ""  # white space that ends what is made so far: dropped if nothing else follows
        for part in joined((line for chunk in (title, lines) for line in chunk), separator="\n"):
            text = pending + part
            kept = text.rstrip()
            pending = text[len(kept):]
            if kept:
                yield kept
        yield "\n"


def export_markdown(conversation: Conversation) -> str:
    """`markdown_chunks` as one text: for tests and small conversations."""
    return "".join(markdown_chunks(conversation))
