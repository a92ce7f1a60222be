import json

from django import template

from conversations.web.markdown import render_markdown

register = template.Library()


@register.filter
def markdown(text: str):
    """Render model or user text as sanitised Markdown (see conversations.markdown)."""
    return render_markdown(text)


_TOOL_STATUS = {
    "awaiting_approval": "waiting for your approval",
    "approved": "approved, running",
    "refused": "refused",
    "running": "running",
    "done": "done",
    "error": "failed",
}


@register.filter
def tool_status(status: str) -> str:
    return _TOOL_STATUS.get(status, status or "")


@register.filter
def pretty_json(value) -> str:
    """Indent JSON (tool arguments arrive as a JSON string); anything else is shown as it is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False)
