"""Model text to safe HTML for the chat pages.

Markdown is rendered with raw HTML turned off (and a single newline kept as a line break, as models
write it), then the result goes through nh3 (ammonia, a
well-kept sanitiser) with a short allow-list. Both layers would have to fail for markup from a
model to reach the page. Images are not rendered: an image URL written by a model can carry data
out of the conversation the moment the page loads it.

A fenced code block naming a language Pygments knows is highlighted here, on the server: spans with Pygments'
short class names (styled by static/arbor/code.css), the block's `language-…` class kept for its label.
"""

from __future__ import annotations

from functools import cache

import nh3
from django.utils.safestring import SafeString, mark_safe
from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.util import ClassNotFound

_TAGS = {
    "p", "br", "hr", "strong", "em", "del", "s", "code", "pre", "blockquote", "ul", "ol", "li",
    "h1", "h2", "h3", "h4", "h5", "h6", "a", "table", "thead", "tbody", "tr", "th", "td", "span",
}
_ATTRIBUTES = {"a": {"href", "title"}, "code": {"class"}, "ol": {"start"}, "span": {"class"}}
_HIGHLIGHT_MAX_CHARS = 20_000  # a longer block is shown plain: highlighting it would hold up the page


def _highlighted(code: str, language: str, _attributes: str) -> str:
    """markdown-it's highlight hook: the block's inner HTML, or "" to let markdown-it escape it plain."""
    if not language or len(code) > _HIGHLIGHT_MAX_CHARS:
        return ""
    try:
        lexer = get_lexer_by_name(language, stripnl=False, ensurenl=False)
    except ClassNotFound:
        return ""
    return highlight(code, lexer, HtmlFormatter(nowrap=True))


@cache
def _parser() -> MarkdownIt:
    return (MarkdownIt("commonmark", {"html": False, "breaks": True, "highlight": _highlighted})
            .enable(["table", "strikethrough"]).disable("image"))


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
