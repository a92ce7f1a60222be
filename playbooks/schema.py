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
as text (booleans as `true`/`false`, which SQLite reads as 1/0).

`validate` returns a list of messages, each naming the step or parameter and the field, e.g.
`steps[1].arguments.sql: SQL error: no such column: amount`, because they are fed back to the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
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
    """Why `value` does not fit `parameter` (its type, choices and pattern), or None if it fits."""
    kind = parameter["type"]
    if isinstance(value, bool) != (kind == "boolean") or not isinstance(value, _JSON_TYPES[kind]):
        return f"is not a{'n' if kind == 'integer' else ''} {kind}"
    if check_enum and "enum" in parameter and value not in parameter["enum"]:
        return f"is not one of {', '.join(map(repr, parameter['enum']))}"
    if "pattern" in parameter and kind == "string" and not re.search(parameter["pattern"], value):
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


def render(value: Any, values: dict[str, Any], escape: Callable[[str], str] = str) -> Any:
    """`value` with every `{{name}}` replaced; `escape` is applied to text put inside a longer string."""
    if isinstance(value, str):
        whole = _WHOLE_REFERENCE.match(value)
        if whole:
            return values[whole.group(1)]
        return _REFERENCE.sub(lambda m: escape(_text(values[m.group(1)])), value)
    if isinstance(value, dict):
        return {key: render(item, values, escape) for key, item in value.items()}
    if isinstance(value, list):
        return [render(item, values, escape) for item in value]
    return value


def _sql_text(value: str) -> str:
    """A value written into SQL text is written into a quoted literal: a quote in it must not end it."""
    return value.replace("'", "''")


# Tool arguments whose text is code: the escaping a value written into them needs.
_ESCAPES: dict[str, Callable[[str], str]] = {"sql_query": _sql_text}


def render_step(step: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """A step with its references replaced by `values`."""
    if "tool" in step:
        return {"tool": step["tool"], "arguments": render(step["arguments"], values, _ESCAPES.get(step["tool"], str))}
    return {"instruction": render(step["instruction"], values)}


def _tool_step_errors(where: str, step: dict[str, Any], values: dict[str, Any]) -> list[str]:
    tool = get_tool(step["tool"])
    if tool is None:
        known = ", ".join(t.name for t in all_tools())
        return [f"{where}.tool: there is no tool named {step['tool']!r}; the tools are: {known}"]
    arguments = render_step(step, values)["arguments"]
    problems = sorted(jsonschema.Draft202012Validator(tool.parameters).iter_errors(arguments),
                      key=lambda e: list(e.absolute_path))
    if problems:
        return [f"{_where([where, 'arguments', *e.absolute_path])}: {e.message}" for e in problems]
    if tool.name == "sql_query":
        try:
            sql_check(arguments["sql"])
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
