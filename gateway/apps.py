from django.apps import AppConfig


class GatewayConfig(AppConfig):
    """The OpenAI-compatible surface (issue 17): /v1/ for clients that already speak OpenAI's API."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "gateway"
