"""Input and output shapes of the share API. No business logic: the services decide."""

from __future__ import annotations

from django.urls import reverse
from rest_framework import serializers

from config.api import INT64_MAX
from conversations.apis.serializers import StrictIntegerField
from shares.models import Share


def share_url(request, token: str) -> str:
    """The page's absolute address: what a person passes on."""
    return request.build_absolute_uri(reverse("share-page", args=[token]))


class ShareIn(serializers.Serializer):
    node = StrictIntegerField(required=False, min_value=1, max_value=INT64_MAX,
                              help_text="The answer whose path is shared; default the conversation's head.")


class ShareCreatedOut(serializers.Serializer):
    token = serializers.CharField(help_text="Unguessable; whoever holds it can read the shared path.")
    url = serializers.URLField(help_text="The read-only page: /s/<token>/.")


class ShareOut(serializers.ModelSerializer):
    url = serializers.SerializerMethodField()

    class Meta:
        model = Share
        fields = ["token", "url", "conversation", "node", "created_at"]

    def get_url(self, share: Share) -> str:
        return share_url(self.context["request"], share.token)
