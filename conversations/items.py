"""Provider-neutral items: the parts of messages that nodes store as `sent` and `received`.

An item is a plain dict with a `type`:
- `user` / `system`: `text`
- `text`: assistant text
- `tool_call`: `id`, `name`, `arguments` (the JSON text exactly as the model produced it)
- `tool_result`: `call_id`, `name`, `content`, `is_error`
- `reasoning`: `provider`, `text`, `data` (the provider's opaque block, kept verbatim)
- `summary`: what a compaction root holds first (C2): `text`, or a provider-native opaque compaction
  result, `provider` and `data`, that only that provider can read (C3)
Any item may carry `ephemeral: true` (R2). Opaque provider fields are never rewritten here.
"""

from typing import Any, Literal, NotRequired, TypedDict, get_type_hints


class _Marks(TypedDict, total=False):
    ephemeral: bool  # R2: retrieved for one call
    source: dict[str, Any]  # where a retrieved item came from


class UserItem(_Marks):
    type: Literal["user"]
    text: str
    files: NotRequired[list[dict[str, Any]]]  # X1: references {id, name, kind} to the person's files, never bytes


class SystemItem(_Marks):
    type: Literal["system"]
    text: str


class TextItem(_Marks):
    type: Literal["text"]
    text: str


class ToolCallItem(_Marks):
    type: Literal["tool_call"]
    id: str
    name: str
    arguments: str


class ToolResultItem(_Marks):
    type: Literal["tool_result"]
    call_id: str
    name: str
    content: str
    is_error: bool


class ReasoningItem(_Marks):
    type: Literal["reasoning"]
    provider: NotRequired[str]
    text: NotRequired[str]
    data: NotRequired[Any]


class SummaryItem(_Marks):
    type: Literal["summary"]
    text: str
    provider: NotRequired[str]
    data: NotRequired[Any]


SHAPES: dict[str, type] = {"user": UserItem, "system": SystemItem, "text": TextItem, "tool_call": ToolCallItem,
                           "tool_result": ToolResultItem, "reasoning": ReasoningItem, "summary": SummaryItem}

# Each item type's required fields and their Python types, read from the shapes above: what the import
# validator checks and what assembly reads, from one definition.
ITEM_FIELDS: dict[str, dict[str, type]] = {
    name: {key: hint for key, hint in get_type_hints(shape).items() if key in shape.__required_keys__ and key != "type"}
    for name, shape in SHAPES.items()
}

Item = UserItem | SystemItem | TextItem | ToolCallItem | ToolResultItem | ReasoningItem | SummaryItem

ASSISTANT_TYPES = frozenset({"text", "tool_call", "reasoning"})


def user(text: str, files: list[dict[str, Any]] | None = None) -> Item:
    item: Item = {"type": "user", "text": text}
    if files:
        item["files"] = files
    return item


def file_ids(items: list[Item]) -> list[int]:
    """The files (X1) these items' questions refer to, in order."""
    return [ref["id"] for item in items if item.get("type") == "user" for ref in item.get("files", ())]


def system(text: str) -> Item:
    return {"type": "system", "text": text}


def text(value: str) -> Item:
    return {"type": "text", "text": value}


def tool_call(call_id: str, name: str, arguments: str, *, client: bool = False) -> Item:
    """`client`: a call to the client's own tool (the OpenAI-compatible surface), which only the client runs."""
    item: Item = {"type": "tool_call", "id": call_id, "name": name, "arguments": arguments}
    if client:
        item["client"] = True
    return item


def summary(value: str, *, provider: str | None = None, data: Any = None) -> Item:
    item: Item = {"type": "summary", "text": value}
    if provider:
        item.update(provider=provider, data=data)
    return item


def tool_result(call_id: str, name: str, content: str, *, is_error: bool = False) -> Item:
    return {"type": "tool_result", "call_id": call_id, "name": name, "content": content, "is_error": is_error}


def question_item(items: list[Item]) -> Item | None:
    """The user item these sent items open a turn with (its files too), if they do."""
    return next((item for item in items if item.get("type") == "user"), None)


def question_of(items: list[Item]) -> str | None:
    """Return the user text that these sent items open a turn with, if they do."""
    question = question_item(items)
    return None if question is None else question.get("text", "")


def answer_text(items: list[Item]) -> str:
    """The answer's text: a call's one text item, or several (an import's) as paragraphs."""
    return "\n\n".join(item["text"] for item in items if item.get("type") == "text" and item["text"])


def tool_calls(items: list[Item]) -> list[Item]:
    return [item for item in items if item.get("type") == "tool_call"]
