"""Tools the model may call. Importing this package registers Arbor's own."""

from conversations.tools import send_email, sql_query  # noqa: F401
from conversations.tools.catalog import get_tool, offered_tools, server_of  # noqa: F401
from conversations.tools.registry import all_tools  # noqa: F401
