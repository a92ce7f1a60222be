from django.apps import AppConfig


class SharesConfig(AppConfig):
    """Issue 33, "Share a branch" (X5): a read-only, revocable snapshot of one path, for anyone with its link."""

    name = "shares"
    default_auto_field = "django.db.models.BigAutoField"
