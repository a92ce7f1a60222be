"""The playbook validator: the schema, then semantic checks, each error naming its step and field (P1)."""

from __future__ import annotations

import copy

import pytest

from playbooks import schema

SQL = "SELECT customer_name, total FROM monthly_sales WHERE month = '{{month}}' ORDER BY total DESC LIMIT {{limit}}"
VALID = {
    "name": "Top customers",
    "description": "Top customers by sales for a month.",
    "parameters": [
        {"name": "month", "type": "string", "description": "YYYY-MM", "default": "2026-10",
         "pattern": r"^\d{4}-\d{2}$"},
        {"name": "limit", "type": "integer", "description": "rows", "default": 5},
    ],
    "steps": [{"tool": "sql_query", "arguments": {"sql": SQL}}, {"instruction": "List them with totals."}],
    "expected_output": "A ranked list.",
}


def _with(change) -> dict:
    definition = copy.deepcopy(VALID)
    change(definition)
    return definition


def test_a_valid_playbook_has_no_errors():
    assert schema.validate(VALID) == []


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d.pop("expected_output"), "(the playbook): 'expected_output' is a required property"),
    (lambda d: d["parameters"][0].update(type="date"),
     "parameters[0].type: 'date' is not one of ['string', 'integer', 'number', 'boolean']"),
    (lambda d: d["steps"].__setitem__(0, {"tool": "sql_query"}), "steps[0]: 'arguments' is a required property"),
    (lambda d: d["steps"].__setitem__(1, {"say": "x"}),
     'steps[1]: a step is either {"tool": NAME, "arguments": {...}} or {"instruction": TEXT}'),
    (lambda d: d["steps"][0].update(tool="run_sql"),
     "steps[0].tool: there is no tool named 'run_sql'; the tools are: send_email, sql_query"),
    (lambda d: d["steps"][0]["arguments"].update(query="x"),
     "steps[0].arguments: Additional properties are not allowed ('query' was unexpected)"),
    (lambda d: d["steps"][0].update(arguments={"sql": 5}), "steps[0].arguments.sql: 5 is not of type 'string'"),
    (lambda d: d["steps"][0]["arguments"].update(sql=SQL.replace("total FROM", "amount FROM")),
     "steps[0].arguments.sql: SQL error: no such column: amount"),
    (lambda d: d["steps"][0]["arguments"].update(sql=SQL.replace("monthly_sales", "sales")),
     "steps[0].arguments.sql: SQL error: no such table: sales"),
    (lambda d: d["steps"][0]["arguments"].update(sql="DELETE FROM orders WHERE month = '{{month}}' "
                                                      "AND {{limit}} > 0"),
     "steps[0].arguments.sql: read-only database: writes are refused; only a single SELECT query may run"),
    (lambda d: d["steps"][0]["arguments"].update(sql=SQL + "; SELECT 1"),
     "steps[0].arguments.sql: only a single SQL statement is allowed; remove everything after the first ';'"),
    (lambda d: d["steps"][1].update(instruction="Mention {{region}}."),
     "steps[1].instruction: unknown parameter {{region}}; declare it in parameters (declared: month, limit)"),
    (lambda d: d["parameters"].append({"name": "region", "type": "string", "description": "r"}),
     "parameters[2].name: parameter 'region' is not used by any step; use it as {{region}} or remove it"),
    (lambda d: d["parameters"][1].update(default="five"), "parameters[1].default: 'five' is not an integer"),
    (lambda d: d["parameters"][0].update(default="October"),
     r"parameters[0].default: 'October' does not match the pattern ^\d{4}-\d{2}$"),
    (lambda d: d["parameters"].append(dict(d["parameters"][0])),
     "parameters[2].name: parameter 'month' is declared twice"),
])
def test_each_problem_is_named_by_step_or_parameter_and_field(change, expected):
    """P1: the message says where (`steps[0].arguments.sql`) and what, because the model reads it."""
    assert expected in schema.validate(_with(change))


def test_the_sql_check_reads_no_rows():
    """The SQL check compiles the statement (EXPLAIN) and never runs it: run, this query would be
    stopped by the time limit and reported as an error."""
    slow = ("WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n) SELECT count(*) FROM n "
            "WHERE '{{month}}' != '' LIMIT {{limit}}")
    assert schema.validate(_with(lambda d: d["steps"][0]["arguments"].update(sql=slow))) == []


def test_arguments_are_checked_against_the_tools_schema_after_rendering():
    definition = _with(lambda d: d["steps"].insert(0, {"tool": "send_email", "arguments": {"to": "{{month}}"}}))
    assert schema.validate(definition) == ["steps[0].arguments: 'subject' is a required property",
                                           "steps[0].arguments: 'body' is a required property"]


def test_a_draft_that_is_not_json_says_so():
    assert schema.parse("Sure! Here it is")[1][0].startswith("(the answer): not valid JSON")
    assert schema.parse('```json\n{"a": 1}\n```') == ({"a": 1}, [])


def test_render_keeps_whole_references_typed_and_binds_sql_values():
    step = {"tool": "sql_query", "arguments": {"sql": "SELECT '{{month}}' LIMIT {{limit}}"}}
    assert schema.render_step(step, {"month": "x' OR '1", "limit": 3}) == {
        "tool": "sql_query", "arguments": {"sql": "SELECT :month LIMIT :limit", "params": {"month": "x' OR '1",
                                                                                          "limit": 3}}}
    assert schema.render({"n": "{{limit}}", "b": "on={{flag}}"}, {"limit": 3, "flag": True}) == {"n": 3, "b": "on=true"}


def test_bind_values_names_each_bad_parameter():
    values, errors = schema.bind_values(VALID["parameters"], {"month": "2026-9", "limit": "5", "region": "x"})
    assert errors == ["region: there is no such parameter (parameters: limit, month)",
                      r"month: '2026-9' does not match the pattern ^\d{4}-\d{2}$",
                      "limit: '5' is not an integer"]
    assert schema.bind_values(VALID["parameters"], {"month": "2026-09"}) == ({"month": "2026-09", "limit": 5}, [])
    parameters = [{"name": "flag", "type": "boolean", "description": "f"}]
    assert schema.bind_values(parameters, {}) == ({}, ["flag: a value is required (boolean)"])
    assert schema.bind_values(parameters, {"flag": 1})[1] == ["flag: 1 is not a boolean"]


@pytest.mark.parametrize(("sql", "where"), [
    ('SELECT total FROM monthly_sales WHERE month = "{{month}}" LIMIT {{limit}}', "inside a quoted name"),
    ("SELECT total FROM monthly_sales WHERE month = 'x{{month}}' LIMIT {{limit}}", "inside a longer quoted text"),
    ("SELECT total FROM monthly_sales_{{month}} LIMIT {{limit}}", "part of a name or word"),
    ("SELECT total FROM monthly_sales -- {{month}}\n LIMIT {{limit}}", "inside a comment"),
])
def test_s1_a_sql_reference_that_is_not_a_whole_value_is_refused_naming_step_and_field(sql, where):
    errors = schema.validate(_with(lambda d: d["steps"][0]["arguments"].update(sql=sql)))
    assert f"steps[0].arguments.sql: {{{{month}}}} is {where}: a parameter in SQL can only be a whole value, " \
           "e.g. month = {{month}}" in errors


def test_s1_the_whole_query_as_a_parameter_is_refused():
    definition = _with(lambda d: (d["steps"][0]["arguments"].update(sql="{{month}}"),
                                  d["steps"].append({"instruction": "{{limit}} rows"})))
    errors = schema.validate(definition)
    assert any(e.startswith("steps[0].arguments.sql: {{month}} is the whole query") for e in errors)


@pytest.mark.parametrize("sql", [SQL, SQL.replace("'{{month}}'", "{{month}}")])
def test_s1_sql_references_render_as_bound_placeholders_with_typed_params(sql):
    """Quoted or bare, `{{month}}` becomes `:month`; the values go to `params`, not into the SQL text."""
    step = {"tool": "sql_query", "arguments": {"sql": sql}}
    assert schema.validate(_with(lambda d: d["steps"][0].update(step))) == []
    rendered = schema.render_step(step, {"month": "0' OR '1'='1", "limit": 5})
    assert rendered["arguments"] == {
        "sql": "SELECT customer_name, total FROM monthly_sales WHERE month = :month ORDER BY total DESC LIMIT :limit",
        "params": {"month": "0' OR '1'='1", "limit": 5}}


def test_s1_render_refuses_sql_validate_refuses():
    with pytest.raises(schema.UnsafeReference, match="inside a quoted name"):
        schema.render_step({"tool": "sql_query", "arguments": {"sql": 'SELECT "{{month}}"'}}, {"month": "x"})


def test_s1_the_sql_check_compiles_the_placeholder_form_with_the_params():
    """`LIMIT {{limit}}` with a text sample still compiles; a placeholder where a name goes does not."""
    sql = "SELECT customer_name FROM {{month}} LIMIT {{limit}}"
    errors = schema.validate(_with(lambda d: d["steps"][0]["arguments"].update(sql=sql)))
    assert errors == ['steps[0].arguments.sql: syntax error: near ":month"']


def test_n3_a_pattern_must_match_the_whole_value():
    """`re.search` let `2026-09; anything` through a `\\d{4}-\\d{2}` pattern; the whole value must match."""
    parameter = {"name": "month", "type": "string", "description": "", "pattern": r"\d{4}-\d{2}"}
    assert schema.value_problem(parameter, "2026-09") is None
    assert schema.value_problem(parameter, "2026-09' OR 1=1") == r"does not match the pattern \d{4}-\d{2}"


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_n3_a_number_must_be_finite(value):
    assert schema.value_problem({"name": "x", "type": "number", "description": ""}, value) == "is not a finite number"
