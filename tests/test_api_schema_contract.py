"""The OpenAPI schema at /api/schema/ says what the API does (issue 14, findings of the schemathesis run in
scripts/fuzz): each test names the finding it keeps fixed, and checks the schema as served, and where it can,
a real answer against it."""

from __future__ import annotations

import json
import re
import sys

import jsonschema
import pytest

from config.schema import NOT_BLANK
from conversations.apis.serializers import ApprovalIn

pytestmark = pytest.mark.django_db

TOOL_CALL = '#tool send_email {"to": "a@example.com", "subject": "s", "body": "b"}'


@pytest.fixture
def schema(api) -> dict:
    response = api.get("/api/schema/?format=json")
    assert response.status_code == 200
    return json.loads(response.content)


def _operation(schema: dict, method: str, path: str) -> dict:
    return schema["paths"][path][method]


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _json_schema(node):
    """OpenAPI 3.0's `nullable: true` spelled as JSON Schema (a null is allowed too)."""
    if isinstance(node, list):
        return [_json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _json_schema(value) for key, value in node.items() if key != "nullable"}
    return {"anyOf": [converted, {"type": "null"}]} if node.get("nullable") else converted


def _validate(schema: dict, instance, declared: dict) -> None:
    """Validate `instance` against `declared` (a schema or a $ref) with the document's components in reach."""
    jsonschema.Draft7Validator(_json_schema({**declared, "components": schema["components"]})).validate(instance)


def _conversation(api) -> int:
    response = api.post("/api/conversations/", {}, format="json")
    assert response.status_code == 201
    return response.json()["id"]


# --- the import operation ---------------------------------------------------------------------------


def test_import_declares_its_body_an_export_file_object_or_array(schema):
    """Finding: the import's request was a free-form object only; an export file is an object (Arbor's tree,
    one ChatGPT conversation, LibreChat's and chatbot-ui's exports, one Claude.ai conversation or a viewer's
    wrapper of them, one Open WebUI chat, bare or as its export holds it) or an array (ChatGPT's, Open WebUI's
    and Claude.ai's exports, whose unreadable entries are skipped), and the body is required."""
    body = _operation(schema, "post", "/api/conversations/import/")["requestBody"]
    assert body["required"] is True
    declared = body["content"]["application/json"]["schema"]
    kinds = {_resolve(schema, branch).get("type") for branch in declared["anyOf"]}
    assert kinds == {"object", "array"}
    tree, conversation, conversations, librechat, chatbotui, claude, claude_wrapped, webui, webui_bare, aistudio = (
        declared["anyOf"])
    assert aistudio["required"] == ["chunkedPrompt"] and aistudio["properties"]["chunkedPrompt"]["required"] == [
        "chunks"]
    assert tree["properties"]["format"]["enum"] == ["arbor.tree"]
    assert tree["required"] == ["format", "version", "conversation", "nodes"]
    assert conversation["required"] == ["mapping"] and conversations["items"]["anyOf"][0] == conversation
    assert (librechat["required"], chatbotui["required"], claude["required"]) == (
        ["conversationId"], ["history"], ["chat_messages"])
    assert (claude_wrapped["required"], webui["required"], webui_bare["required"]) == (
        ["conversations"], ["chat"], ["history"])


def test_import_declares_its_answer_conversations_and_skipped(schema, api):
    """Finding: the import's 201 was declared a bare array of conversations; the contract (API.md) is
    {"conversations": [...], "skipped": [{"index", "error"}]}, and the real answer matches the declaration."""
    declared = _operation(schema, "post", "/api/conversations/import/")["responses"]["201"]["content"][
        "application/json"]["schema"]
    answer = _resolve(schema, declared)
    assert answer["required"] == ["conversations", "skipped"]
    skipped = _resolve(schema, answer["properties"]["skipped"]["items"])
    assert set(skipped["properties"]) == {"index", "error"}

    cid = _conversation(api)
    assert api.post(f"/api/conversations/{cid}/turns/", {"content": "hello"}, format="json").status_code == 201
    exported = b"".join(api.get(f"/api/conversations/{cid}/export/?format=json").streaming_content)
    response = api.post("/api/conversations/import/", data=exported, content_type="application/json")
    assert response.status_code == 201
    body = response.json()
    assert body["skipped"] == [] and len(body["conversations"]) == 1
    _validate(schema, body, declared)


# --- the approval -----------------------------------------------------------------------------------


def test_approval_request_names_the_call_call_id_as_the_202_does(schema):
    """Finding: the approval request called the call `tool_call_id` while the 202 answer and the
    `approval_required` event call it `call_id`. `call_id` is the name; `tool_call_id` stays, deprecated."""
    approval = _resolve(schema, _operation(schema, "post", "/api/conversations/{conversation_id}/approvals/")[
        "requestBody"]["content"]["application/json"]["schema"])
    assert {"call_id", "tool_call_id", "approve"} <= set(approval["properties"])
    assert approval["properties"]["tool_call_id"]["deprecated"] is True
    assert approval["anyOf"] == [{"required": ["call_id"]}, {"required": ["tool_call_id"]}]
    pending = _resolve(schema, _resolve(schema, schema["components"]["schemas"]["TurnOut"])["properties"][
        "approval_required"]["items"])
    assert "call_id" in pending["required"]


@pytest.mark.parametrize("name", ["call_id", "tool_call_id"])
def test_approving_by_call_id_or_by_its_old_name_goes_on_with_the_turn(api, name):
    """Finding (call_id): the endpoint takes the 202's own `call_id`, and still `tool_call_id`, through the real
    view: the approved call runs and the turn answers."""
    cid = _conversation(api)
    paused = api.post(f"/api/conversations/{cid}/turns/", {"content": TOOL_CALL}, format="json")
    assert paused.status_code == 202
    (call,) = paused.json()["approval_required"]
    done = api.post(f"/api/conversations/{cid}/approvals/", {name: call["call_id"], "approve": True},
                    format="json")
    assert done.status_code == 201, done.content
    assert done.json()["answer"].startswith("echo:")


def test_an_approval_without_either_name_is_a_400_naming_call_id(api):
    cid = _conversation(api)
    response = api.post(f"/api/conversations/{cid}/approvals/", {"approve": True}, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["fields"] == {"call_id": ["This field is required."]}


def test_the_sockets_approve_message_still_gets_tool_call_id_from_the_shared_serializer():
    """The chat socket's `approve` hands ApprovalIn's checked data on as `tool_call_id`
    (conversations.web.consumer): either name in, that one key out."""
    for name in ("call_id", "tool_call_id"):
        checked = ApprovalIn(data={name: "call-1", "approve": False})
        assert checked.is_valid(), checked.errors
        assert checked.validated_data == {"tool_call_id": "call-1", "approve": False}
    both = ApprovalIn(data={"call_id": "new", "tool_call_id": "old", "approve": True})
    assert both.is_valid() and both.validated_data["tool_call_id"] == "new", "call_id wins"


# --- errors ---------------------------------------------------------------------------------------


def test_every_error_response_names_the_error_component(schema):
    """Finding: error responses (4xx, 5xx) had no schema at all. Each one now names the Error component in every
    media type the operation answers in (an event stream's error is an ErrorEvent); 401 is declared wherever a
    token is needed and 404 wherever a path names an object."""
    assert "Error" in schema["components"]["schemas"]
    checked = 0
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert "401" in responses, (method, path)
            if "{" in path:
                assert "404" in responses, (method, path)
            for code, response in responses.items():
                if code[0] not in "45":
                    continue
                content = response["content"]
                assert content["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
                if "text/event-stream" in content:
                    assert content["text/event-stream"]["schema"] == {"$ref": "#/components/schemas/ErrorEvent"}
                checked += 1
    assert checked > 50


@pytest.mark.parametrize(("method", "path", "body", "status"), [
    ("get", "/api/conversations/999999/", None, 404),
    ("post", "/api/conversations/", {"model": "nope/none"}, 400),
    ("post", "/api/conversations/{cid}/turns/", {"content": ""}, 400),
    ("post", "/api/conversations/{cid}/approvals/", {"call_id": "nope", "approve": True}, 404),
    ("get", "/api/search/?q=%20", None, 400),
])
def test_a_real_error_answer_validates_against_the_declared_error_schema(schema, api, method, path, body, status):
    """Finding (error schema): the body the exception handler sends for a refused request is the one the
    operation's declared error response describes."""
    cid = _conversation(api)
    url = path.format(cid=cid)
    response = getattr(api, method)(url, body, format="json") if body is not None else getattr(api, method)(url)
    assert response.status_code == status, response.content
    template = re.sub(r"/\d+/", "/{conversation_id}/", url.split("?")[0])
    declared = _operation(schema, method, template)["responses"][str(status)]["content"]["application/json"]
    _validate(schema, response.json(), declared["schema"])


def test_an_unauthenticated_answer_validates_against_the_declared_401(schema, client):
    """Finding (error schema): a request without a token gets the declared 401 and its Error body."""
    response = client.get("/api/conversations/")
    assert response.status_code == 401
    declared = _operation(schema, "get", "/api/conversations/")["responses"]["401"]["content"]["application/json"]
    _validate(schema, response.json(), declared["schema"])


def test_a_refused_streamed_turn_is_an_error_event_as_declared(schema, api):
    """Finding (error schema): asked for text/event-stream, a refusal is one `error` event whose data is the
    Error body, as the operation's ErrorEvent says."""
    response = api.post("/api/conversations/999999/turns/", {"content": "hi"}, format="json",
                        HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 404 and response["Content-Type"].startswith("text/event-stream")
    lines = dict(line.split(": ", 1) for line in response.content.decode().strip().splitlines())
    event = {"event": lines["event"], "data": lines["data"]}
    declared = schema["components"]["schemas"]["ErrorEvent"]
    _validate(schema, event, declared)
    _validate(schema, json.loads(event["data"]), declared["properties"]["data"]["contentSchema"])


# --- the rest of what the fuzz run found ------------------------------------------------------------


def test_lists_are_declared_as_the_pages_they_are(schema, api):
    """Finding: GET lists (conversations, playbooks, runs) were declared as bare arrays while every answer is a
    page ({"count", "next", "previous", "results"}); the real answer validates against the declaration."""
    _conversation(api)
    declared = _operation(schema, "get", "/api/conversations/")["responses"]["200"]["content"]["application/json"]
    page = _resolve(schema, declared["schema"])
    assert {"count", "results"} <= set(page["required"])
    _validate(schema, api.get("/api/conversations/").json(), declared["schema"])
    for path in ("/api/playbooks/", "/api/playbooks/{playbook_id}/runs/"):
        declared = _operation(schema, "get", path)["responses"]["200"]["content"]["application/json"]["schema"]
        assert "results" in _resolve(schema, declared)["properties"], path


def test_a_conversations_model_is_declared_as_one_of_the_offered_models(schema, settings):
    """Finding: `model` was any text in the schema, while any model not in ARBOR_MODELS is a 400."""
    conversation_in = schema["components"]["schemas"]["ConversationIn"]
    model = _resolve(schema, conversation_in["properties"]["model"]["allOf"][0])
    assert model["enum"] == list(settings.ARBOR_MODELS)


def test_text_that_may_not_be_blank_says_so(schema):
    """Finding: empty `content`, `call_id` and `q` were schema-valid but refused with 400 ("may not be blank"):
    the schema now says minLength 1, or (for text trimmed first) the NOT_BLANK pattern, which matches exactly the
    texts Python's str.strip() leaves something of."""
    components = schema["components"]["schemas"]
    assert components["TurnIn"]["properties"]["content"]["minLength"] == 1
    assert components["ApprovalIn"]["properties"]["call_id"]["pattern"] == NOT_BLANK
    (query,) = [p["schema"] for p in _operation(schema, "get", "/api/search/")["parameters"] if p["name"] == "q"]
    assert query["maxLength"] == 200 and not re.search(query["pattern"], " \t")
    pattern = re.compile(NOT_BLANK)
    assert all(bool(pattern.search(chr(c))) != chr(c).isspace() for c in range(sys.maxunicode + 1)
               if not 0xD800 <= c <= 0xDFFF)


def test_a_turn_declares_its_event_stream_and_the_status_it_streams_with(schema):
    """Finding: a streamed turn answers 200 with server-sent events, but only 201/202 were declared, each with
    the JSON body as its text/event-stream schema."""
    responses = _operation(schema, "post", "/api/conversations/{conversation_id}/turns/")["responses"]
    stream = responses["200"]["content"]["text/event-stream"]["schema"]
    assert set(stream["properties"]["event"]["enum"]) >= {"token", "done", "error", "approval_required"}
    assert "text/event-stream" not in responses["201"]["content"]
    assert responses["201"]["links"]["edit"]["requestBody"] == {"node": "$response.body#/head"}


def test_integers_in_the_schema_are_signed_64_bit_as_the_api_reads_them(schema):
    """Finding: a schema-valid integer past the signed 64-bit range was a 400 (config.api.strict_loads)."""
    edit = schema["components"]["schemas"]["EditIn"]["properties"]["node"]
    assert (edit["minimum"], edit["maximum"]) == (-(2**63), 2**63 - 1)
    assert schema["components"]["schemas"]["EditIn"]["additionalProperties"] == {
        "$ref": "#/components/schemas/JsonValue"}


def test_the_schema_does_not_describe_itself(schema):
    """Finding: /api/schema/ was one of the operations fuzzed, with its own `format` and `lang` parameters."""
    assert "/api/schema/" not in schema["paths"]


@pytest.mark.parametrize("value", [0, 1, "true", "on", None])
def test_a_boolean_field_takes_only_true_or_false_as_its_schema_says(api, page, value):
    """The fuzzer's finding: `{"keep_retrieved": 0}` was accepted for a boolean. Now 400, nothing changed;
    the settings form's checkbox ("true"/"false") still works."""
    cid = _conversation(api)
    response = api.patch(f"/api/conversations/{cid}/", {"keep_retrieved": value}, format="json")
    assert response.status_code == 400 and "keep_retrieved" in response.json()["error"]["message"]
    assert api.get(f"/api/conversations/{cid}/").json()["keep_retrieved"] is False
    assert api.patch(f"/api/conversations/{cid}/", {"keep_retrieved": True}, format="json").json()["keep_retrieved"]
    page.post(f"/chat/{cid}/update/", {"retrieval": ["false", "true"], "keep_retrieved": "false"})
    body = api.get(f"/api/conversations/{cid}/").json()
    assert (body["retrieval"], body["keep_retrieved"]) == (True, False)


def test_every_renderer_format_parameter_admits_the_empty_value_drf_takes_as_none(schema, api, conversation):
    """Finding (fuzz, ST201): `GET …/stream/?format=` was answered 200 while the schema's `format` enum (made by
    drf-spectacular from the renderers) left out the empty value DRF reads as no format. Every operation whose
    renderer `format` picks declares it."""
    declared = {(path, method): p["schema"]["enum"] for path, ops in schema["paths"].items()
                for method, op in ops.items() for p in op.get("parameters", []) if p["name"] == "format"}
    renderer_picked = {key: enum for key, enum in declared.items() if "sse" in enum}
    assert ("/api/conversations/{conversation_id}/stream/", "get") in renderer_picked
    assert all("" in enum for enum in renderer_picked.values()), renderer_picked
    assert api.get(f"/api/conversations/{conversation.pk}/stream/?format=").status_code == 204  # no turn ran


EXPORTS = sorted((__import__("pathlib").Path(__file__).parent / "fixtures" / "exports").rglob("*.json"))


@pytest.mark.parametrize("path", EXPORTS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_real_export_file_is_valid_against_the_declared_import_body(schema, path):
    """Finding (CI, stateful phase, ST201): the importer read shapes the schema did not declare, so a document
    the schema calls invalid was imported. Every real export file in tests/fixtures/exports (SOURCES.md) is a
    body the declaration accepts: Open WebUI's bare chat object and Claude viewers' wrapper included."""
    declared = _operation(schema, "post", "/api/conversations/import/")["requestBody"]["content"][
        "application/json"]["schema"]
    _validate(schema, json.loads(path.read_text(encoding="utf-8")), declared)


@pytest.mark.parametrize("document", [
    {"messagesTree": [], "conversationId": 16},  # the finding: a LibreChat id that is no text
    {"messages": [], "conversationId": None},
    {"chat": {"history": []}},  # Open WebUI's history is an object of messages
    {"chat": "no object"},
    {"conversations": "no list"},  # Claude viewers' wrapper holds a list
    {"conversationId": "c", "messagesTree": [], "messages": 0},  # each list LibreChat's export names is a list
    {"format": "arbor.tree", "version": True, "conversation": {}, "nodes": []},  # true is no version 1
    [],
])
def test_a_body_the_import_schema_refuses_is_refused_and_imports_nothing(schema, api, document):
    """Finding (CI, stateful phase, ST201): `{"messagesTree": [], "conversationId": 16}` is valid against no
    branch of the declared body, yet it was imported as an empty LibreChat conversation. Whatever the schema
    refuses, the importer refuses with a clear 400 and writes nothing; whatever it imports, the schema allows."""
    from conversations.models import Conversation

    declared = _operation(schema, "post", "/api/conversations/import/")["requestBody"]["content"][
        "application/json"]["schema"]
    with pytest.raises(jsonschema.ValidationError):
        _validate(schema, document, declared)
    before = Conversation.objects.count()
    response = api.post("/api/conversations/import/", document, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "import_refused" and response.json()["error"]["message"]
    assert Conversation.objects.count() == before


def test_a_librechat_entry_without_messages_beside_one_with_them_is_skipped(api):
    """Review: each entry of a list of LibreChat conversations is read alone; one with neither `messages` nor
    `messagesTree` is skipped and named (no 500), the other imports."""
    document = [{"conversationId": "a", "messages": [{"messageId": "m", "text": "hi", "isCreatedByUser": True}]},
                {"conversationId": "b", "title": "x"}]
    response = api.post("/api/conversations/import/", document, format="json")
    assert response.status_code == 201, response.content
    assert len(response.json()["conversations"]) == 1
    assert response.json()["skipped"] == [{"index": 1, "error": "conversations[1].messages: expected a list."}]


def test_an_arbor_tree_of_version_1_point_0_is_refused(api):
    """Review (ST201): OpenAPI 3.0's JSON Schema (draft 4, as schemathesis reads it) takes 1.0 for no integer;
    the importer reads `version` as the integer 1 only, and writes nothing otherwise."""
    from conversations.models import Conversation

    before = Conversation.objects.count()
    response = api.post("/api/conversations/import/", data=b'{"format": "arbor.tree", "version": 1.0, '
                        b'"conversation": {}, "nodes": []}', content_type="application/json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "import_refused"
    assert Conversation.objects.count() == before


def test_an_entry_that_is_no_object_is_skipped_and_the_body_is_valid(schema, api):
    """An array's entry that is none of the format (not even an object) is skipped and named, the others import:
    the declaration allows any entry, so what the importer skips is no schema violation either."""
    declared = _operation(schema, "post", "/api/conversations/import/")["requestBody"]["content"][
        "application/json"]["schema"]
    path = next(p for p in EXPORTS if p.name == "librechat-chatgpt-export.json")
    document = [*json.loads(path.read_text(encoding="utf-8")), 5]
    _validate(schema, document, declared)
    response = api.post("/api/conversations/import/", document, format="json")
    assert response.status_code == 201, response.content
    assert len(response.json()["conversations"]) == len(document) - 1
    assert [entry["index"] for entry in response.json()["skipped"]] == [len(document) - 1]


def test_a_blank_label_is_valid_against_the_schema_and_removes_the_label(schema, api):
    """Finding (fuzz, ST201 on PATCH /api/nodes/{id}/): a label was declared `oneOf` [one line of text, empty
    text], and "" is both, so the schema refused the value that removes a label while the API took it. No
    `oneOf` in the schema offers the empty text beside a pattern; "" validates, and a control character does not."""
    stack = [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            assert {"type": "string", "maxLength": 0} not in value.get("oneOf", []), value
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    declared = _operation(schema, "patch", "/api/nodes/{node_id}/")["requestBody"]["content"]["application/json"][
        "schema"]
    _validate(schema, {"label": "", "starred": False}, declared)
    with pytest.raises(jsonschema.ValidationError):
        _validate(schema, {"label": "two\nlines"}, declared)

    cid = _conversation(api)
    head = api.post(f"/api/conversations/{cid}/turns/", {"content": "hello"}, format="json").json()["head"]
    assert api.patch(f"/api/nodes/{head}/", {"label": "plan A"}, format="json").status_code == 200
    response = api.patch(f"/api/nodes/{head}/", {"label": "", "starred": False}, format="json")
    assert response.status_code == 200 and response.json()["label"] == ""
    assert api.patch(f"/api/nodes/{head}/", {"label": "two\nlines"}, format="json").status_code == 400


def _array_items(node, where="#"):
    """Every array's `items` in a schema document, with where it is."""
    if isinstance(node, dict):
        if node.get("type") == "array" and isinstance(node.get("items"), dict):
            yield where, node["items"]
        for key, value in node.items():
            yield from _array_items(value, f"{where}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _array_items(value, f"{where}/{index}")


def test_no_array_item_wraps_its_ref_in_an_all_of_beside_other_keywords(schema):
    """Finding (stop 41's fuzz, seed 311698835629440142466667286227284430446): `models` items were
    `{allOf: [ModelsEnum], maxLength: 200}`; schemathesis could not negate a turn's body around that wrapper ("Cannot
    generate an array with 1 demanded elements") and reported the operation as an error. The names bound the
    length already, so the items are the enum itself."""
    wrapped = [where for where, items in _array_items(schema["components"]) if "allOf" in items and len(items) > 1]
    assert wrapped == []
    models = schema["components"]["schemas"]["TurnIn"]["properties"]["models"]
    assert models["items"] == {"$ref": "#/components/schemas/ModelsEnum"}
    assert _resolve(schema, models["items"])["enum"]
