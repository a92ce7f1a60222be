"""Tools the model may call. Importing this package registers them."""

from conversations.tools import send_email, sql_query  # noqa: F401
from conversations.tools.registry import all_tools, get_tool  # noqa: F401
