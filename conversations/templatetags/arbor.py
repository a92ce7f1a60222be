import json

from django import template

from conversations.models import ToolStatus
from conversations.web.markdown import render_markdown

register = template.Library()


@register.filter
def markdown(text: str):
    """Render model or user text as sanitised Markdown (see conversations.markdown)."""
    return render_markdown(text)


@register.filter
def tool_status(status: str) -> str:
    """A tool bubble's status as a person reads it (`ToolStatus`' labels)."""
    return dict(ToolStatus.choices).get(status, status or "")


# What a failed call (T1) means for the person, in a plain sentence; the provider's own words go behind a
# "Details" disclosure. The chat page's script shows the same sentences (json_script "failure-sentences").
FAILURE_SENTENCES = {
    "provider_error": "The model provider failed. Retry?",
    "timeout": "The model took too long to answer. Retry?",
    "rate_limit": "The model provider is getting too many requests right now. Wait a moment, then retry.",
    "context_overflow": "This message did not fit in the model's input limit, so it was not sent.",
    "cancelled": "Stopped.",
    "interrupted": "The server stopped while this answer was being written. Retry?",
    "round_limit": "The model called tools more times than one answer may. Retry, or ask another way.",
    "server_error": "Something went wrong on the server. Retry?",
}


@register.simple_tag
def failure_sentences() -> dict[str, str]:
    return FAILURE_SENTENCES


@register.filter
def failure_sentence(reason: str) -> str:
    return FAILURE_SENTENCES.get(reason, FAILURE_SENTENCES["server_error"])


@register.filter
def pretty_json(value) -> str:
    """Indent JSON (tool arguments arrive as a JSON string); anything else is shown as it is."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False)
