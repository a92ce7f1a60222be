from django.apps import AppConfig

from conversations.llm import echo


class ConversationsConfig(AppConfig):
    name = "conversations"

    def ready(self) -> None:
        # Imported here, not at the top: they import models, which exist only once the registry is ready.
        from conversations import outbox
        from conversations.jobs import recount, title

        echo.register()  # the offline model is a litellm provider like any other
        outbox.register("title", title.run, after_turn=True)
        outbox.register("recount", recount.run)
