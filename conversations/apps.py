from django.apps import AppConfig

from conversations.llm import echo


class ConversationsConfig(AppConfig):
    name = "conversations"

    def ready(self) -> None:
        echo.register()  # the offline model is a litellm provider like any other
