"""Model text to safe HTML for the chat pages.

Markdown is rendered with raw HTML turned off (and a single newline kept as a line break, as models
write it), then the result goes through nh3 (ammonia, a
well-kept sanitiser) with a short allow-list. Both layers would have to fail for markup from a
model to reach the page. Images are not rendered: an image URL written by a model can carry data
out of the conversation the moment the page loads it.
"""

from __future__ import annotations

from functools import cache

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt

_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "s", "code", "pre", "blockquote", "ul", "ol", "li",
    "h1", "h2", "h3", "h4", "h5", "h6", "a", "table", "thead", "tbody", "tr", "th", "td",
}
_ATTRIBUTES = {"a": {"href", "title"}, "code": {"class"}, "ol": {"start"}}


@cache
def _parser() -> MarkdownIt:
    return MarkdownIt("commonmark", {"html": False, "breaks": True}).enable(["table", "strikethrough"]).disable("image")


def render_markdown(text: str) -> SafeString:
    """Return `text` as sanitised HTML."""
    html = _parser().render(text or "")
    clean = nh3.clean(
        html,
        tags=_TAGS,
        attributes=_ATTRIBUTES,
        url_schemes={"http", "https", "mailto"},
        link_rel="noopener noreferrer nofollow",
    )
    return mark_safe(clean)  # noqa: S308 - sanitised by nh3 just above
