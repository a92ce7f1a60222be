"""Input and output shapes. No business logic: services and the turn runner decide."""

from __future__ import annotations

from django.conf import settings
from django.core.validators import RegexValidator
from django.utils import timezone
from rest_framework import serializers

from conversations.models import Conversation, Node, Project
from conversations.screen import BubbleView
from conversations.tools.mcp.servers import configured


class StrictCharField(serializers.CharField):
    """A CharField that refuses numbers and booleans instead of quietly turning them into text, and measures
    `max_length` on the text as sent, as the schema's `maxLength` does: DRF's own measures it after trimming
    the ends' whitespace, so it took a text the schema calls too long (the fuzzer's finding)."""

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        if self.max_length is not None and len(data) > self.max_length:
            self.fail("max_length", max_length=self.max_length)
        return super().to_internal_value(data)


class StrictBooleanField(serializers.BooleanField):
    """true or false only: DRF's own field would take 0, 1, "yes" or "on" as well, which the schema does not
    allow (the fuzzer's finding)."""

    def to_internal_value(self, data):
        if not isinstance(data, bool):
            self.fail("invalid")
        return data


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | str):
            self.fail("invalid")
        return super().to_internal_value(data)


def validate_model_name(value: str) -> str:
    if value not in settings.ARBOR_MODELS:
        choices = ", ".join(settings.ARBOR_MODELS)
        raise serializers.ValidationError(f"Unknown model {value!r}; choose one of: {choices}.")
    return value


def validate_tool_servers(value: list[str] | None) -> list[str] | None:
    """Issue 32: names of configured MCP servers, each once; null: as the project (or every server) says."""
    if value is None:
        return None
    known = {server.name for server in configured()}
    unknown = sorted(set(value) - known)
    if unknown:
        raise serializers.ValidationError(f"No MCP server is called {', '.join(map(repr, unknown))}; the servers "
                                          f"are: {', '.join(sorted(known)) or 'none'}.")
    if len(set(value)) != len(value):
        raise serializers.ValidationError("A server is named twice.")
    return value


class ToolServersField(serializers.ListField):
    """Issue 32: names of configured MCP servers (the schema lists them, read when it is built)."""


def tool_servers_field() -> ToolServersField:
    return ToolServersField(child=StrictCharField(max_length=30), max_length=50, allow_null=True, required=False,
                            validators=[validate_tool_servers],
                            help_text="issue 32: the MCP servers whose tools its calls are offered (GET /api/tools/ "
                                      "lists them); null: as the project says (a project: every server)")


class ConversationIn(serializers.Serializer):
    title = StrictCharField(max_length=200, required=False, allow_blank=True)
    model = StrictCharField(max_length=200, required=False, validators=[validate_model_name])
    instructions = StrictCharField(required=False, allow_blank=True, max_length=20000)
    retrieval = StrictBooleanField(required=False, help_text="R2: search my other conversations first")
    keep_retrieved = StrictBooleanField(required=False, help_text="R2: keep retrieved items in later calls' context")
    project = StrictIntegerField(required=False, allow_null=True, help_text="issue 30: the project it is in (null: "
                                                                           "none)")
    tool_servers = tool_servers_field()


class ProjectIn(serializers.Serializer):
    name = StrictCharField(max_length=200)
    instructions = StrictCharField(required=False, allow_blank=True, max_length=20000)
    model = StrictCharField(max_length=200, required=False, allow_blank=True, validators=[validate_model_name])
    memory = StrictBooleanField(required=False, help_text="R2: new conversations retrieve from the project's "
                                                          "earlier ones (never from outside it)")
    tool_servers = tool_servers_field()
    files = serializers.ListField(child=StrictIntegerField(min_value=1, max_value=2**63 - 1), max_length=200,
                                  required=False, help_text="issue 30: the ids of your files that are the project's "
                                                            "knowledge (all of them: any other leaves it)")


def tool_servers_out() -> serializers.ListField:
    return serializers.ListField(child=serializers.CharField(), allow_null=True, read_only=True)


class ProjectFileOut(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    kind = serializers.CharField()
    status = serializers.CharField()


class ProjectOut(serializers.ModelSerializer):
    conversations = serializers.IntegerField(source="conversations.count", read_only=True)
    tool_servers = tool_servers_out()
    files = ProjectFileOut(many=True, read_only=True, help_text="its knowledge files (issue 30)")

    class Meta:
        model = Project
        fields = ["id", "name", "instructions", "model", "memory", "tool_servers", "files", "conversations",
                  "created_at", "updated_at"]


class ToolOut(serializers.Serializer):
    """Issue 32: a tool a conversation may use; an MCP server's is `SERVER__TOOL`."""

    name = serializers.CharField()
    description = serializers.CharField()
    server = serializers.CharField(allow_null=True, help_text="the MCP server it comes from; null: Arbor's own")
    needs_approval = serializers.BooleanField(help_text="F3, X3: each call waits for a person's Approve")
    parameters = serializers.JSONField(help_text="the JSON Schema of its arguments")


class ToolServerOut(serializers.Serializer):
    name = serializers.CharField()
    transport = serializers.ChoiceField(choices=["stdio", "http"])
    reachable = serializers.BooleanField()
    error = serializers.CharField(allow_blank=True, help_text="why it offers no tools now, if it does not")


class ToolsOut(serializers.Serializer):
    tools = ToolOut(many=True)
    servers = ToolServerOut(many=True)


class PreferencesIn(serializers.Serializer):
    instructions = StrictCharField(allow_blank=True, max_length=20000)


class ConversationOut(serializers.ModelSerializer):
    turn_running = serializers.BooleanField(read_only=True)
    tool_servers = tool_servers_out()

    class Meta:
        model = Conversation
        fields = ["id", "title", "model", "instructions", "retrieval", "keep_retrieved", "project", "tool_servers",
                  "head", "version", "turn_running", "origin", "created_at", "updated_at"]
        read_only_fields = ["origin"]


class NodeOut(serializers.ModelSerializer):
    """A node as the API shows it. The schema is DRF's, from the model's fields; the body is written here, field by
    field, as DRF would write it (a test holds the two equal): DRF's per-field machinery took ~3 ms of every turn's
    answer (issue 34)."""

    class Meta:
        model = Node
        fields = ["id", "parent", "conversation", "kind", "status", "failure_reason", "failure_message", "sent",
                  "received", "provider", "model", "usage", "compacted_from", "created_at", "finished_at",
                  "summary_call", "tokens", "path_tokens", "label", "starred"]

    def to_representation(self, node: Node) -> dict:
        return {"id": node.id, "parent": node.parent_id, "conversation": node.conversation_id, "kind": str(node.kind),
                "status": str(node.status), "failure_reason": str(node.failure_reason),
                "failure_message": node.failure_message, "sent": node.sent, "received": node.received,
                "provider": node.provider, "model": node.model, "usage": node.usage,
                "compacted_from": node.compacted_from_id, "created_at": _when(node.created_at),
                "finished_at": _when(node.finished_at), "summary_call": node.summary_call_id, "tokens": node.tokens,
                "path_tokens": node.path_tokens, "label": node.label, "starred": node.starred}


def _when(value) -> str | None:
    """A time as DRF's DateTimeField writes it (ISO 8601 in UTC, with `Z`)."""
    if value is None:
        return None
    text = timezone.localtime(value).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


class NodeMarkIn(serializers.Serializer):
    """A person's name for the branch a turn leads, and their star (one a conversation). An empty body changes
    nothing."""

    label = StrictCharField(required=False, allow_blank=True, max_length=40, validators=[RegexValidator(
        r"^[^\x00-\x1f\x7f]*$", "A label is one line of text, without control characters.")],
        help_text="a short name for the branch; empty removes it")
    starred = StrictBooleanField(required=False, help_text="the conversation opens on its starred branch")


class TreeMarkOut(serializers.Serializer):
    id = serializers.IntegerField(help_text="the turn's first node: switch here to show this turn's branch")
    parent = serializers.IntegerField(allow_null=True, help_text="the mark above (a compaction root: the mark of "
                                                                 "the node it compacted)")
    kind = serializers.ChoiceField(choices=Node.Kind.choices)
    status = serializers.ChoiceField(choices=Node.Status.choices, help_text="how the turn ended (its last node)")
    failure_reason = serializers.CharField(allow_blank=True)
    snippet = serializers.CharField(help_text="the question, shortened")
    label = serializers.CharField(allow_blank=True)
    starred = serializers.BooleanField()
    on_path = serializers.BooleanField(help_text="on the head's path")
    last = serializers.IntegerField(help_text="the turn's last node (how it ended); its label and star are on `id`")


class TreeOut(serializers.Serializer):
    head = serializers.IntegerField(allow_null=True, help_text="the mark holding the head")
    nodes = TreeMarkOut(many=True)


class NodeSummaryOut(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = ["id", "parent", "conversation", "kind", "status", "failure_reason", "provider", "model", "usage",
                  "compacted_from", "created_at", "summary_call", "tokens", "path_tokens"]


def _files_field() -> serializers.ListField:
    return serializers.ListField(child=StrictIntegerField(min_value=1, max_value=2**63 - 1), required=False,
                                 max_length=settings.ARBOR_FILES_PER_TURN,
                                 help_text="X1: ids of the caller's files (POST /api/files/) the question sends; "
                                           "on an edit, left out keeps the question's files and [] sends none")


class ModelsField(serializers.ListField):
    """Issue 33: models asked at once, each once; at most ARBOR_MODELS_PER_TURN, and no more than the person's
    limit of turns at once (each model runs one)."""

    def __init__(self, **kwargs):
        super().__init__(child=StrictCharField(max_length=200, validators=[validate_model_name]), min_length=1,
                         required=False, **kwargs)

    @staticmethod
    def most() -> int:
        limit = settings.ARBOR_MAX_CONCURRENT_TURNS_PER_USER
        return min(settings.ARBOR_MODELS_PER_TURN, limit) if limit else settings.ARBOR_MODELS_PER_TURN

    def to_internal_value(self, data):
        models = super().to_internal_value(data)
        if len(set(models)) != len(models):
            raise serializers.ValidationError("Name each model once.")
        if len(models) > self.most():
            raise serializers.ValidationError(f"Ask at most {self.most()} models at once.")
        return models


def _models_field() -> ModelsField:
    return ModelsField(help_text="issue 33: ask these models at once, one sibling answer each from the same parent; "
                                 "the first one's answer becomes the head (default: the conversation's model)")


class TurnIn(serializers.Serializer):
    content = StrictCharField(trim_whitespace=False)
    files = _files_field()
    models = _models_field()


class EditIn(serializers.Serializer):
    node = StrictIntegerField()
    content = StrictCharField(trim_whitespace=False)
    files = _files_field()
    models = _models_field()


class RegenerateIn(serializers.Serializer):
    node = StrictIntegerField(required=False)


class SwitchIn(serializers.Serializer):
    node = StrictIntegerField()


class ApprovalIn(serializers.Serializer):
    """`call_id` names the call as the `approval_required` event and the 202 answer do; `tool_call_id`, its
    earlier name, is still read when `call_id` is absent. The checked data keeps the one key `tool_call_id`, as
    the chat socket's `approve` message has always handed it on (conversations.web.consumer)."""

    call_id = StrictCharField(max_length=200, required=False,
                              help_text="The pending call's `call_id` (`approval_required[].call_id`).")
    tool_call_id = StrictCharField(max_length=200, required=False, help_text="The earlier name of `call_id`.")
    approve = serializers.BooleanField()

    def validate_approve(self, value):
        if not isinstance(self.initial_data.get("approve"), bool):
            raise serializers.ValidationError("Must be true or false.")
        return value

    def validate(self, attrs):
        call_id, alias = attrs.pop("call_id", None), attrs.pop("tool_call_id", None)
        if call_id is None and alias is None:
            raise serializers.ValidationError({"call_id": [self.fields["call_id"].error_messages["required"]]})
        return {**attrs, "tool_call_id": call_id if call_id is not None else alias}


class BranchOut(serializers.Serializer):
    index = serializers.IntegerField()
    count = serializers.IntegerField()
    siblings = serializers.ListField(child=serializers.IntegerField())


class BubbleOut(serializers.Serializer):
    id = serializers.IntegerField(source="bubble.id", allow_null=True,
                                  help_text="null for the marker where a compaction happened (role `compaction`)")
    node = serializers.IntegerField(source="bubble.node_id")
    role = serializers.CharField(source="bubble.role")
    content = serializers.CharField(source="bubble.content")
    data = serializers.JSONField(source="bubble.data")
    branch = BranchOut(allow_null=True)
    editable = serializers.BooleanField(help_text="false before a compaction node (T10): no edit or regenerate")

    def to_representation(self, instance: BubbleView):
        """The fields above, built directly: a page holds hundreds of bubbles (issue 13), and DRF's walk through
        the declared fields was half of a page's time. The same values (a test holds them to DRF's own)."""
        bubble, branch = instance.bubble, instance.branch
        return {"id": bubble.id, "node": bubble.node_id, "role": bubble.role, "content": bubble.content,
                "data": bubble.data, "editable": instance.editable,
                "branch": None if branch is None else {"index": branch.index, "count": branch.count,
                                                       "siblings": list(branch.siblings)}}


class PendingCallOut(serializers.Serializer):
    """A tool call waiting for a person (F3): approve or refuse it by its `call_id`."""

    call_id = serializers.CharField()
    name = serializers.CharField()
    arguments = serializers.JSONField()


class BranchAnswerOut(serializers.Serializer):
    """Issue 33: one model's sibling branch of a question asked of several at once."""

    model = serializers.CharField()
    node = serializers.IntegerField(allow_null=True, help_text="the branch's last node (switch to it to go on "
                                                                "from this answer)")
    ending = serializers.ChoiceField(choices=["done", "approval_required", "error"])
    answer = serializers.CharField(allow_null=True)
    error = serializers.DictField(allow_null=True, help_text="`{code, message}` when the branch failed")


class TurnOut(serializers.Serializer):
    answer = serializers.CharField(allow_null=True)
    head = serializers.IntegerField(allow_null=True)
    nodes = NodeOut(many=True)
    approval_required = PendingCallOut(many=True, required=False)
    answers = BranchAnswerOut(many=True, required=False, help_text="issue 33: with `models`, each model's branch, "
                                                                   "the first's being the head")


class ContextOut(serializers.Serializer):
    messages = serializers.ListField(child=serializers.DictField())


class SkippedOut(serializers.Serializer):
    index = serializers.IntegerField(help_text="The entry's place in the file, from 0.")
    error = serializers.CharField(help_text="Why it could not be read.")


class ImportOut(serializers.Serializer):
    conversations = ConversationOut(many=True)
    skipped = SkippedOut(many=True)
    project = serializers.IntegerField(required=False, help_text="issue 30: the new project a project file made "
                                                                 "(only for a project file)")


class DiffOut(serializers.Serializer):
    """Issue 33: where two calls' contexts part."""

    common = serializers.IntegerField(help_text="messages both calls were sent alike, from the start")
    a = serializers.ListField(child=serializers.DictField(), help_text="a's messages after those")
    b = serializers.ListField(child=serializers.DictField(), help_text="b's messages after those")
    answers = serializers.DictField(child=serializers.CharField(), help_text="what each call answered: {a, b}")


class UsageGroupOut(serializers.Serializer):
    key = serializers.CharField()
    calls = serializers.IntegerField()
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost_usd = serializers.FloatField()


class UsageOut(serializers.Serializer):
    """Issue 31: totals of the usage ledger and their groups."""

    calls = serializers.IntegerField()
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost_usd = serializers.FloatField()
    groups = UsageGroupOut(many=True)


class BudgetIn(serializers.Serializer):
    monthly_tokens = serializers.IntegerField(min_value=1, allow_null=True, required=False)
    monthly_cost_usd = serializers.FloatField(min_value=0, allow_null=True, required=False)


class BudgetOut(serializers.Serializer):
    monthly_tokens = serializers.IntegerField(allow_null=True)
    monthly_cost_usd = serializers.FloatField(allow_null=True)
    spent_this_month = serializers.DictField()
