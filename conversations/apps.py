from django.apps import AppConfig
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from conversations.llm import echo


class ConversationsConfig(AppConfig):
    name = "conversations"

    def ready(self) -> None:
        # Imported here, not at the top: they import models, which exist only once the registry is ready.
        from conversations import outbox
        from conversations.jobs import recount, title
        from conversations.tools.mcp.servers import BadServer, parse_servers

        try:  # a wrong server list stops the start with its reason, not the first turn that offers tools
            parse_servers(settings.ARBOR_MCP_SERVERS)
        except BadServer as exc:
            raise ImproperlyConfigured(str(exc)) from None

        echo.register()  # the offline model is a litellm provider like any other
        outbox.register("title", title.run, after_turn=True)
        outbox.register("recount", recount.run)
