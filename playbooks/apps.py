from django.apps import AppConfig

from conversations.llm import echo
from playbooks import echo_draft


class PlaybooksConfig(AppConfig):
    name = "playbooks"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        echo.register_answerer(echo_draft.answer)  # offline conversions: the echo model drafts playbooks
