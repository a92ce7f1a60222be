"""The playbook format and its validation: pure functions, no Django database (P1).

A playbook definition is a JSON object:

    {"name": "...", "description": "...",
     "parameters": [{"name": "month", "type": "string", "description": "...", "default": "2026-10",
                     "pattern": "^[0-9]{4}-[0-9]{2}$"}],
     "steps": [{"tool": "sql_query", "arguments": {"sql": "... WHERE month = '{{month}}' ..."}},
               {"instruction": "List the customers with their totals."}],
     "expected_output": "..."}

`{{name}}` in a tool step's arguments (or an instruction) is replaced by the parameter's value. An
argument that is exactly `{{name}}` takes the value with its type; inside longer text it is written
as text (booleans as `true`/`false`).

SQL is different: a value is never written into it (S1). In an `sql_query` step's `sql`, a reference
stands for one whole value, written bare (`month = {{month}}`) or as a whole quoted literal
(`month = '{{month}}'`); both become the named placeholder `:month`, and the typed value goes into the
tool's `params`, which the database binds as data. A reference anywhere else in SQL (inside a longer
literal, inside double quotes or brackets, in a comment, glued to a word, or as the whole query) is
refused by `validate` and by `render_step`.

`validate` returns a list of messages, each naming the step or parameter and the field, e.g.
`steps[1].arguments.sql: SQL error: no such column: amount`, because they are fed back to the model.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterator
from typing import Any

import jsonschema

from conversations.tools import all_tools, get_tool
from conversations.tools.errors import ToolError
from conversations.tools.sql_query import sql_check

PARAMETER_TYPES = ("string", "integer", "number", "boolean")
_NAME = r"^[a-z_][a-z0-9_]{0,63}$"
_REFERENCE = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")
_WHOLE_REFERENCE = re.compile(r"^\{\{\s*([A-Za-z0-9_]+)\s*\}\}$")

PLAYBOOK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["name", "description", "parameters", "steps", "expected_output"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 200},
        "description": {"type": "string", "maxLength": 2000},
        "parameters": {
            "type": "array",
            "maxItems": 20,
            "items": {
                "type": "object",
                "required": ["name", "type", "description"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": _NAME},
                    "type": {"enum": list(PARAMETER_TYPES)},
                    "description": {"type": "string", "maxLength": 500},
                    "default": {},
                    "enum": {"type": "array", "minItems": 1, "maxItems": 50},
                    "pattern": {"type": "string", "maxLength": 200},
                },
            },
        },
        "steps": {
            "type": "array",
            "minItems": 1,
            "maxItems": 20,
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "required": ["tool", "arguments"],
                        "additionalProperties": False,
                        "properties": {"tool": {"type": "string", "minLength": 1},
                                       "arguments": {"type": "object"}},
                    },
                    {
                        "type": "object",
                        "required": ["instruction"],
                        "additionalProperties": False,
                        "properties": {"instruction": {"type": "string", "minLength": 1, "maxLength": 4000}},
                    },
                ]
            },
        },
        "expected_output": {"type": "string", "minLength": 1, "maxLength": 2000},
    },
}

_SAMPLES: dict[str, Any] = {"string": "sample", "integer": 1, "number": 1.0, "boolean": True}
_JSON_TYPES = {"string": str, "integer": int, "number": int | float, "boolean": bool}


def _where(path: Iterator[Any] | list[Any]) -> str:
    """A JSON path as `steps[1].arguments.sql`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text or "(the playbook)"


def parse(text: str) -> tuple[dict[str, Any] | None, list[str]]:
    """Read a model's draft: a JSON object, possibly fenced in Markdown."""
    body = text.strip()
    fenced = re.match(r"^```(?:json)?\s*(.*?)\s*```$", body, re.DOTALL)
    if fenced:
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except json.JSONDecodeError as error:
        return None, [f"(the answer): not valid JSON: {error.msg} at line {error.lineno} column {error.colno}; "
                      "answer with one JSON object and nothing else"]
    if not isinstance(data, dict):
        return None, ["(the answer): the playbook must be one JSON object"]
    return data, []


def validate(definition: Any) -> list[str]:
    """Every problem with a playbook definition, each naming where it is; an empty list means valid."""
    shape = _shape_errors(definition)
    if shape:
        return shape
    errors = _parameter_errors(definition["parameters"])
    names = [p["name"] for p in definition["parameters"]]
    samples = sample_values(definition["parameters"])
    used: set[str] = set()
    for index, step in enumerate(definition["steps"]):
        where = f"steps[{index}]"
        unknown = []
        for path, text in _texts(step):
            found = set(_REFERENCE.findall(text))
            used |= found
            unknown.extend(f"{_where([where, *path])}: unknown parameter {{{{{name}}}}}; declare it in parameters "
                           f"(declared: {', '.join(names) or 'none'})" for name in sorted(found - set(names)))
        errors.extend(unknown)
        if "tool" in step and not unknown:
            errors.extend(_tool_step_errors(where, step, samples))
    errors.extend(f"parameters[{i}].name: parameter {name!r} is not used by any step; use it as {{{{{name}}}}} "
                  "or remove it" for i, name in enumerate(names) if name not in used)
    return errors


def _shape_errors(definition: Any) -> list[str]:
    """Where the definition breaks the JSON Schema; a step that fits neither kind says why in its own kind."""
    validator = jsonschema.Draft202012Validator(PLAYBOOK_SCHEMA)
    errors = []
    for error in sorted(validator.iter_errors(definition), key=lambda e: list(e.absolute_path)):
        kind = None
        if error.validator == "oneOf" and isinstance(error.instance, dict):
            kind = 0 if "tool" in error.instance else 1 if "instruction" in error.instance else None
        inner = [e for e in error.context or [] if e.schema_path and e.schema_path[0] == kind]
        if inner:
            errors.extend(f"{_where(e.absolute_path)}: {e.message}" for e in inner)
        elif error.validator == "oneOf":
            errors.append(f"{_where(error.absolute_path)}: a step is either {{\"tool\": NAME, \"arguments\": {{...}}}} "
                          "or {\"instruction\": TEXT}")
        else:
            errors.append(f"{_where(error.absolute_path)}: {error.message}")
    return errors


def _parameter_errors(parameters: list[dict[str, Any]]) -> list[str]:
    errors: list[str] = []
    seen: set[str] = set()
    for index, parameter in enumerate(parameters):
        where = f"parameters[{index}]"
        if parameter["name"] in seen:
            errors.append(f"{where}.name: parameter {parameter['name']!r} is declared twice")
        seen.add(parameter["name"])
        if "pattern" in parameter:
            try:
                re.compile(parameter["pattern"])
            except re.error as error:
                errors.append(f"{where}.pattern: not a valid regular expression ({error})")
                continue
        for value in parameter.get("enum", []):
            problem = value_problem(parameter, value, check_enum=False)
            if problem:
                errors.append(f"{where}.enum: {value!r} {problem}")
        if "default" in parameter:
            problem = value_problem(parameter, parameter["default"])
            if problem:
                errors.append(f"{where}.default: {parameter['default']!r} {problem}")
    return errors


def value_problem(parameter: dict[str, Any], value: Any, *, check_enum: bool = True) -> str | None:
    """Why `value` does not fit `parameter` (its type, choices and pattern), or None if it fits.

    The pattern must match the whole value; a number must be finite (a form's `nan` or `inf` is not).
    """
    kind = parameter["type"]
    if isinstance(value, bool) != (kind == "boolean") or not isinstance(value, _JSON_TYPES[kind]):
        return f"is not a{'n' if kind == 'integer' else ''} {kind}"
    if isinstance(value, float) and not math.isfinite(value):
        return "is not a finite number"
    if check_enum and "enum" in parameter and value not in parameter["enum"]:
        return f"is not one of {', '.join(map(repr, parameter['enum']))}"
    if "pattern" in parameter and kind == "string" and not re.fullmatch(parameter["pattern"], value):
        return f"does not match the pattern {parameter['pattern']}"
    return None


def sample_values(parameters: list[dict[str, Any]]) -> dict[str, Any]:
    """A value for every parameter to check the steps with: its default, its first choice, or a sample."""
    values = {}
    for parameter in parameters:
        if "default" in parameter:
            values[parameter["name"]] = parameter["default"]
        elif parameter.get("enum"):
            values[parameter["name"]] = parameter["enum"][0]
        else:
            values[parameter["name"]] = _SAMPLES[parameter["type"]]
    return values


def _texts(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], str]]:
    """Every string inside `value`, with its path: where parameter references can be."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _texts(item, (*path, key))
    elif isinstance(value, list):
        for position, item in enumerate(value):
            yield from _texts(item, (*path, position))


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def render(value: Any, values: dict[str, Any]) -> Any:
    """`value` with every `{{name}}` replaced: a whole-string reference keeps the value's type."""
    if isinstance(value, str):
        whole = _WHOLE_REFERENCE.match(value)
        if whole:
            return values[whole.group(1)]
        return _REFERENCE.sub(lambda m: _text(values[m.group(1)]), value)
    if isinstance(value, dict):
        return {key: render(item, values) for key, item in value.items()}
    if isinstance(value, list):
        return [render(item, values) for item in value]
    return value


class UnsafeReference(ValueError):
    """A step's SQL uses a parameter where it could change the statement, not only a value (S1)."""

    def __init__(self, problems: list[str]):
        super().__init__("; ".join(problems))
        self.problems = problems


_WORD = re.compile(r"[A-Za-z0-9_$]")
_CLOSERS = {'"': '"', "`": "`", "[": "]"}


def _literal_end(sql: str, start: int, quote: str) -> int:
    """The index just past the literal or quoted name opening at `start` (a doubled quote stays inside)."""
    closer = _CLOSERS.get(quote, quote)
    i = start + 1
    while i < len(sql):
        if sql[i] == closer:
            if closer != "]" and sql[i + 1:i + 2] == closer:
                i += 2
                continue
            return i + 1
        i += 1
    return len(sql)


def sql_placeholders(sql: str) -> tuple[str, list[str], list[str]]:
    """`sql` with every reference turned into a `:name` placeholder, the names in order, and the problems.

    A reference is accepted only where a value goes: bare between non-word characters, or as a whole
    single-quoted literal `'{{name}}'` (the quotes go too: the placeholder binds a string as a string).
    """
    if _WHOLE_REFERENCE.match(sql.strip()):
        return sql, [], [f"{sql.strip()} is the whole query: a parameter can only stand for a value, "
                         "e.g. WHERE month = {{month}}"]
    out: list[str] = []
    names: list[str] = []
    problems: list[str] = []
    i = 0

    def refuse(text: str, where: str) -> None:
        problems.extend(f"{{{{{name}}}}} is {where}: a parameter in SQL can only be a whole value, "
                        f"e.g. month = {{{{month}}}}" for name in _REFERENCE.findall(text))

    while i < len(sql):
        char = sql[i]
        if sql.startswith("--", i) or sql.startswith("/*", i):
            end = sql.find("\n", i) if char == "-" else sql.find("*/", i + 2)
            end = len(sql) if end < 0 else end + (1 if char == "-" else 2)
            refuse(sql[i:end], "inside a comment")
            out.append(sql[i:end])
            i = end
        elif char in "'\"`[":
            end = _literal_end(sql, i, char)
            inner = sql[i + 1:end - 1]
            whole = _WHOLE_REFERENCE.match(inner) if char == "'" and sql[end - 1:end] == "'" else None
            if whole:
                names.append(whole.group(1))
                out.append(f":{whole.group(1)}")
            else:
                refuse(inner, "inside a longer quoted text" if char == "'" else "inside a quoted name")
                out.append(sql[i:end])
            i = end
        elif (match := _REFERENCE.match(sql, i)) is not None:
            before, after = sql[i - 1:i], sql[match.end():match.end() + 1]
            if _WORD.match(before) or _WORD.match(after) or before in {":", "@", "?", "."}:
                refuse(match.group(0), "part of a name or word")
                out.append(match.group(0))
            else:
                names.append(match.group(1))
                out.append(f":{match.group(1)}")
            i = match.end()
        else:
            out.append(char)
            i += 1
    return "".join(out), names, problems


def render_step(step: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A step with its references replaced by `values`; an `sql_query` step's SQL values become bound `params`.

    Raises UnsafeReference for SQL that `validate` refuses (a definition stored before that check).
    """
    if "tool" not in step:
        return {"instruction": render(step["instruction"], values)}
    arguments = step["arguments"]
    if step["tool"] == "sql_query" and isinstance(arguments.get("sql"), str):
        sql, names, problems = sql_placeholders(arguments["sql"])
        if problems:
            raise UnsafeReference(problems)
        rendered = render({k: v for k, v in arguments.items() if k != "sql"}, values)
        if names:
            given = rendered.get("params") if isinstance(rendered.get("params"), dict) else {}
            rendered["params"] = {**given, **{name: values[name] for name in names}}
        return {"tool": step["tool"], "arguments": {"sql": sql, **rendered}}
    return {"tool": step["tool"], "arguments": render(arguments, values)}


def _tool_step_errors(where: str, step: dict[str, Any], values: dict[str, Any]) -> list[str]:
    tool = get_tool(step["tool"])
    if tool is None:
        known = ", ".join(t.name for t in all_tools())
        return [f"{where}.tool: there is no tool named {step['tool']!r}; the tools are: {known}"]
    if tool.name == "sql_query" and isinstance(step["arguments"].get("sql"), str):
        unsafe = sql_placeholders(step["arguments"]["sql"])[2]
        if unsafe:
            return [f"{where}.arguments.sql: {problem}" for problem in unsafe]
    arguments = render_step(step, values)["arguments"]
    problems = sorted(jsonschema.Draft202012Validator(tool.parameters).iter_errors(arguments),
                      key=lambda e: list(e.absolute_path))
    if problems:
        return [f"{_where([where, 'arguments', *e.absolute_path])}: {e.message}" for e in problems]
    if tool.name == "sql_query":
        try:
            sql_check(arguments["sql"], arguments.get("params"))
        except ToolError as error:
            return [f"{where}.arguments.sql: {error}"]
    return []


def bind_values(parameters: list[dict[str, Any]], supplied: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The values a run uses (supplied, else the default), and every problem, each naming its parameter."""
    declared = {p["name"] for p in parameters}
    errors = [f"{name}: there is no such parameter (parameters: {', '.join(sorted(declared)) or 'none'})"
              for name in supplied if name not in declared]
    values: dict[str, Any] = {}
    for parameter in parameters:
        name = parameter["name"]
        if name not in supplied and "default" not in parameter:
            errors.append(f"{name}: a value is required ({parameter['type']})")
            continue
        value = supplied.get(name, parameter.get("default"))
        problem = value_problem(parameter, value)
        if problem:
            errors.append(f"{name}: {value!r} {problem}")
        values[name] = value
    return values, errors
