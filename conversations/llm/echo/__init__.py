"""arbor/echo: the offline model (DESIGN.md, "Offline model"), a provider of Arbor's own (`llm.OwnProvider`).

It needs no network, so the app, its tests and its demo run anywhere, and a test can see exactly what
context the model got. It reads directives from the last user message: `#tool NAME {json}` (one tool call
per round), `#fail` (provider error), `#overflow` (context-window error), `#cut` (its first five words, then
stopped as at an output limit: finish_reason "length"), `#slow` (one word every
`ARBOR_ECHO_WORD_SECONDS`, 0.1 s by default), `#title` at the start (a title call: it answers the
conversation's first question's first six words). Asked to summarise (a compaction), it answers
`summary of N messages: <digest>` and also streams an opaque compaction item that only it can read back
(its digest shows it as `user:summary of N messages...`). Other apps may add answers of their own
(`register_answerer`): the playbooks app drafts playbooks. `arbor/echo-embed` is its embedding model (embed.py).

The seam calls it directly, so its answers need no litellm import (issue 34); litellm has it as a custom provider
too once litellm is loaded (`llm/custom.py`). Its failures are litellm's own exceptions, as a hosted provider's
come out: only a failing call loads litellm.
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

from django.conf import settings

from conversations import llm
from conversations.llm import estimate_tokens
from conversations.llm.echo import embed

PROVIDER = "arbor"
_OPAQUE = "<arbor-compaction:"


TOOL_DIRECTIVE = re.compile(r"#tool\s+([A-Za-z0-9_\-]+)\s*")


_FILE_LABEL = re.compile(r"\[(image|file) ([^\]\n]*)\]\n?")


def text_of(content: Any) -> str:
    """A message's text: its text parts, without the labelled files of a question (`context.user_content`)."""
    if isinstance(content, list):  # OpenAI content parts
        text = "".join(part.get("text", "") for part in content
                       if isinstance(part, dict) and not _FILE_LABEL.match(part.get("text", "")))
    else:
        text = content or ""
    return _read_opaque(text) if text.startswith(_OPAQUE) else text


def _opaque(summary: str) -> str:
    return f"{_OPAQUE}{base64.b64encode(summary.encode()).decode()}>"


def _read_opaque(text: str) -> str:
    try:
        return base64.b64decode(text[len(_OPAQUE):].rstrip(">")).decode()
    except ValueError:
        return text


def digest(messages: list[dict]) -> str:
    """`role:<first 30 characters>` for every message; tool calls and results as DESIGN.md shows."""
    parts: list[str] = []
    for message in messages:
        role = message.get("role", "")
        text = text_of(message.get("content"))
        if role == "assistant" and message.get("tool_calls"):
            if text:
                parts.append(f"assistant:{text[:30]}")
            parts.extend(f"assistant:[call {c['function']['name']}]" for c in message["tool_calls"])
        else:
            parts.append(" ".join([f"{role}:{text[:30]}", *_files_seen(message.get("content"))]))
    return " | ".join(parts)


def _files_seen(content: Any) -> list[str]:
    """A question's files as the digest shows them (X1): `[image NAME]` for an image part that came, `[file
    NAME: <first 30 characters of its text>]` for a document's text."""
    seen: list[str] = []
    label = None
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        if part.get("type") == "image_url":
            seen.append(f"[image {label or '?'}]")
        found = _FILE_LABEL.match(part.get("text", "")) if part.get("type") == "text" else None
        label = found.group(2) if found and found.group(1) == "image" else None
        if found and found.group(1) == "file":
            rest = part["text"][found.end():]
            seen.append(f"[file {found.group(2)}: {rest[:30]}]" if rest else f"[file {found.group(2)}]")
    return seen


def _tool_directives(text: str) -> list[tuple[str, str]]:
    decoder = json.JSONDecoder()
    found: list[tuple[str, str]] = []
    for match in TOOL_DIRECTIVE.finditer(text):
        try:
            arguments, _ = decoder.raw_decode(text, match.end())
        except json.JSONDecodeError:
            arguments = {}
        found.append((match.group(1), json.dumps(arguments, ensure_ascii=False)))
    return found


@dataclass
class Plan:
    """What arbor/echo will do for one call; a pure function of the messages, so tests can rely on it."""

    words: list[str]
    tool_call: tuple[str, str] | None
    slow: bool
    prompt_tokens: int
    opaque_summary: str | None = None
    cut: bool = False  # stopped at the output limit (finish_reason "length")

    @property
    def completion_tokens(self) -> int:
        return max(1, len("".join(self.words)) // 4)


SUMMARY_CHARS = 240


def make_plan(messages: list[dict], *, tools_offered: bool, compaction: bool = False) -> Plan:
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    question = text_of(messages[last_user].get("content")) if last_user >= 0 else ""
    prompt_tokens = estimate_tokens(messages)
    if prompt_tokens > settings.ARBOR_ECHO_MAX_INPUT_TOKENS:
        _refuse("ContextWindowExceededError", f"arbor/echo: {prompt_tokens} input tokens exceed the limit of "
                f"{settings.ARBOR_ECHO_MAX_INPUT_TOKENS}")
    if compaction:  # the summary: every message but the prompt, newest kept when it runs long
        earlier = messages[:last_user] if last_user >= 0 else messages
        summary = f"summary of {len(earlier)} messages: {digest(earlier)[-SUMMARY_CHARS:]}"
        return Plan(words=re.findall(r"\S+\s*|\s+", summary), tool_call=None, slow=False,
                    prompt_tokens=prompt_tokens, opaque_summary=_opaque(summary))
    round_index = sum(1 for m in messages[last_user + 1 :] if m.get("role") == "tool")
    directives = _tool_directives(question) if tools_offered else []
    if round_index < len(directives):
        return Plan(words=[], tool_call=directives[round_index], slow=False, prompt_tokens=prompt_tokens)
    if question.startswith("#title"):  # a title call: the conversation's first question, cut short
        first = next((text_of(m.get("content")) for m in messages if m.get("role") == "user"), "")
        title = " ".join(first.split()[:6]) or "Untitled"
        return Plan(words=re.findall(r"\S+\s*|\s+", title), tool_call=None, slow=False,
                    prompt_tokens=prompt_tokens)
    if "#fail" in question:
        _refuse("InternalServerError", "arbor/echo: #fail asked for a provider error")
    if "#overflow" in question:
        _refuse("ContextWindowExceededError", "arbor/echo: #overflow asked for a context-window error")
    answer = next((a for answerer in _answerers if (a := answerer(messages, question)) is not None),
                  f"echo: {question}\nseen: {digest(messages)}")
    words = re.findall(r"\S+\s*|\s+", answer)
    cut = "#cut" in question
    return Plan(words=words[:5] if cut else words, tool_call=None, slow="#slow" in question,
                prompt_tokens=prompt_tokens, cut=cut)


def _refuse(kind: str, message: str, *, model: str = "echo") -> NoReturn:
    """Raise litellm's exception `kind` (a failure as a hosted provider's comes out; T1 classifies it)."""
    raise getattr(llm.litellm_module(), kind)(message=message, model=model, llm_provider=PROVIDER)


class EchoModel:
    """The offline provider (`llm.OwnProvider`): answers from what it received, with no network."""

    def stream(self, model: str, messages: list[dict], *, tools: list[dict] | None,
               compaction: bool) -> Iterator[dict]:
        """Plan the answer now (a refusal raises here, before any chunk), then stream it."""
        return _echo_chunks(make_plan(messages, tools_offered=bool(tools), compaction=compaction))

    def embed(self, model: str, texts: list[str]) -> list[list[float]]:
        """`arbor/echo-embed` (embed.py): a vector a text; any other model of this provider is refused."""
        if model != embed.MODEL:
            _refuse("BadRequestError", f"arbor/{model} is not an embedding model; use arbor/{embed.MODEL}",
                    model=model)
        return [embed.embed_text(str(text)) for text in texts]


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:20]}"


def pause(seconds: float) -> None:
    """`#slow`'s wait before each word (tests may replace it)."""
    time.sleep(seconds)


def _echo_chunks(plan: Plan) -> Iterator[dict]:
    """The plan as litellm's `GenericStreamingChunk`s (plain dicts), one a word; usage with the last."""
    usage = {
        "prompt_tokens": plan.prompt_tokens,
        "completion_tokens": plan.completion_tokens,
        "total_tokens": plan.prompt_tokens + plan.completion_tokens,
    }
    if plan.tool_call:
        name, arguments = plan.tool_call
        yield dict(
            text="",
            tool_use={"id": _call_id(), "type": "function", "function": {"name": name, "arguments": arguments},
                      "index": 0},
            is_finished=True,
            finish_reason="tool_calls",
            usage=usage,
            index=0,
        )
        return
    for position, word in enumerate(plan.words):
        if plan.slow:
            pause(settings.ARBOR_ECHO_WORD_SECONDS)
        last = position == len(plan.words) - 1
        yield dict(
            text=word,
            tool_use=None,
            is_finished=last,
            finish_reason=("length" if plan.cut else "stop") if last else "",
            usage=usage if last else None,
            index=0,
            provider_specific_fields={"arbor_compaction": plan.opaque_summary}
            if plan.opaque_summary and position == 0 else None,
        )


def register() -> None:
    """Make `arbor/echo` a provider of the seam (called once the apps are ready)."""
    llm.register_provider(PROVIDER, EchoModel(), llm.ProviderFacts(
        count_tokens=estimate_tokens, max_input_tokens=lambda: settings.ARBOR_ECHO_MAX_INPUT_TOKENS,
        native_compaction=True))


Answerer = Callable[[list[dict], str], "str | None"]
_answerers: list[Answerer] = []


def register_answerer(answerer: Answerer) -> None:
    """Let another app teach the echo model an answer: `answerer(messages, question)` returns its answer
    text, or None to pass. The playbooks app drafts playbooks this way; the seam knows nothing of them."""
    if answerer not in _answerers:
        _answerers.append(answerer)
