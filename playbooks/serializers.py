"""Input and output shapes of the playbook API. No business logic: the services decide."""

from __future__ import annotations

from rest_framework import serializers

from conversations.apis.serializers import NodeOut
from playbooks.models import Playbook, PlaybookVersion
from playbooks.selectors import conversion_chain, conversion_chains


class PlaybookVersionOut(serializers.ModelSerializer):
    conversion_nodes = serializers.SerializerMethodField(help_text="The tries of this version's conversion, "
                                                                   "first to last (P1).")

    class Meta:
        model = PlaybookVersion
        fields = ["number", "definition", "conversion_node", "conversation", "head", "created_at",
                  "conversion_nodes"]

    def get_conversion_nodes(self, version: PlaybookVersion) -> list[dict]:
        chains = self.context.get("chains")  # read for every version at once by PlaybookDetailOut (N4)
        chain = chains[version.conversion_node_id] if chains else conversion_chain(version.conversion_node_id)
        return NodeOut(chain, many=True).data


class PlaybookOut(serializers.ModelSerializer):
    class Meta:
        model = Playbook
        fields = ["id", "name", "description", "definition", "source_conversation", "source_head",
                  "conversion_node", "edit_conversation", "created_at", "updated_at"]


class PlaybookDetailOut(PlaybookOut):
    versions = serializers.SerializerMethodField()

    class Meta(PlaybookOut.Meta):
        fields = [*PlaybookOut.Meta.fields, "versions"]

    def get_versions(self, playbook: Playbook) -> list[dict]:
        versions = list(playbook.versions.order_by("-number"))
        chains = conversion_chains(v.conversion_node_id for v in versions)
        return PlaybookVersionOut(versions, many=True, context={**self.context, "chains": chains}).data


class RunIn(serializers.Serializer):
    values = serializers.DictField(required=False, default=dict,
                                   help_text="Parameter values by name; a missing one takes its default.")


class RunOut(serializers.Serializer):
    """A run as it stands (S5): read from its conversation, so an approved run shows its later state."""

    run = serializers.IntegerField(source="run.pk")
    playbook = serializers.IntegerField(source="run.playbook_id")
    version = serializers.IntegerField(source="run.version")
    values = serializers.DictField(source="run.values")
    conversation = serializers.IntegerField(source="run.conversation_id", allow_null=True,
                                            help_text="The new conversation the steps ran in (null once deleted).")
    created_at = serializers.DateTimeField(source="run.created_at")
    # Text, not a choice field: a `status` enum here would collide with the node's in the schema.
    status = serializers.CharField(help_text="done; approval_required (a tool waits for a person in the run's "
                                             "conversation, F3); failed (its node is recorded, F1); running; "
                                             "deleted (the run's conversation is gone)")
    answer = serializers.CharField(allow_null=True)
    head = serializers.IntegerField(allow_null=True)
    nodes = NodeOut(many=True)
    approval_required = serializers.ListField(child=serializers.DictField())
    error = serializers.DictField(allow_null=True)
    deviated = serializers.BooleanField(help_text="The model's tool calls in the run differ from the playbook's "
                                                  "tool steps as rendered (other tools, other arguments, or "
                                                  "missing ones once done): a real model is asked, not forced, "
                                                  "to call them exactly.")


class RunListOut(serializers.Serializer):
    run = serializers.IntegerField(source="pk")
    version = serializers.IntegerField()
    values = serializers.DictField()
    conversation = serializers.IntegerField(source="conversation_id", allow_null=True)
    created_at = serializers.DateTimeField()
