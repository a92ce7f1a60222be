from __future__ import annotations

from rest_framework import serializers

from files.models import StoredFile


class FileIn(serializers.Serializer):
    file = serializers.FileField(help_text="the file itself (multipart)")
    project = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1,
                                       help_text="a project of yours the file belongs to")


class FileOut(serializers.ModelSerializer):
    class Meta:
        model = StoredFile
        fields = ["id", "name", "content_type", "kind", "size", "status", "error", "project", "created_at"]
