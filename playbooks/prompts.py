"""What the model is told: the conversion request, the retry with errors, and a run's question.

A run's question lists its tool steps as `#tool NAME {json}` lines with the arguments already
rendered: a real model reads them as "call NAME with exactly these arguments" (the header says so),
and arbor/echo executes them as its own directives, one tool call a round. Either way the calls go
through the one turn runner, so tool approval (F3) applies as in any turn.
"""

from __future__ import annotations

import json
from typing import Any

from conversations import items as it
from conversations.tools import all_tools
from playbooks.echo_draft import PLAYBOOK_DRAFT_MARKER
from playbooks.schema import PLAYBOOK_SCHEMA, render_step


def _tool_lines() -> str:
    return "\n".join(f"- {tool.name}: arguments {json.dumps(tool.parameters, ensure_ascii=False)}"
                     for tool in all_tools())


def conversion_request() -> it.Item:
    """The item a conversion's first try sends after the whole conversation (P1)."""
    return it.user(
        f"{PLAYBOOK_DRAFT_MARKER} Turn this conversation into a playbook: a reusable procedure that answers "
        "the same kind of question again with other values. Make the values that change (a month, a count, "
        "a filter) typed parameters and reference them in the steps as {{name}}. Each step is either a "
        "tool call with argument templates, or an instruction for the model. Every parameter must be used. "
        "In SQL a reference stands for one whole value and is bound as a query parameter, never pasted in: "
        "write it bare (month = {{month}}, LIMIT {{limit}}), not inside quotes, a name or a longer text.\n"
        f"Tools:\n{_tool_lines()}\n"
        "Answer with one JSON object and nothing else, valid against this JSON Schema:\n"
        f"{json.dumps(PLAYBOOK_SCHEMA, ensure_ascii=False)}"
    )


def conversion_retry(errors: list[str]) -> it.Item:
    """The item a later try sends: the previous draft's validation errors (P1)."""
    listed = "\n".join(f"- {error}" for error in errors)
    return it.user(f"{PLAYBOOK_DRAFT_MARKER} The playbook draft is invalid:\n{listed}\n"
                   "Fix these and answer with the whole corrected JSON object and nothing else.")


def run_question(definition: dict[str, Any], values: dict[str, Any]) -> str:
    """The question a run asks in its new conversation: the steps, rendered with `values`."""
    lines = [f"Run the playbook \"{definition['name']}\".", definition["description"]]
    if values:
        lines.append("Parameters: " + ", ".join(f"{name} = {json.dumps(value, ensure_ascii=False)}"
                                                for name, value in values.items()))
    # No literal directive in the header: arbor/echo would run it as a tool call.
    lines.append("Do these steps in order. A tool step is the tool marker, the tool's name and its JSON "
                 "arguments: call that tool with exactly those arguments.")
    for number, step in enumerate(definition["steps"], start=1):
        rendered = render_step(step, values)
        if "tool" in rendered:
            lines.append(f"{number}. #tool {rendered['tool']} {json.dumps(rendered['arguments'], ensure_ascii=False)}")
        else:
            lines.append(f"{number}. {rendered['instruction']}")
    lines.append(f"Expected output: {definition['expected_output']}")
    return "\n".join(line for line in lines if line)
