"""ASGI entry point: HTTP through Django (static files included), WebSockets through Channels."""

import gc
import os

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
django.setup(set_prefix=False)

from config.pooled_http import PooledASGIHandler  # noqa: E402

django_asgi_app = PooledASGIHandler()  # Django's, each request in one thread (config/pooled_http.py)

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from config.origin import SameOriginValidator  # noqa: E402
from config.web import socket_auth_stack  # noqa: E402
from conversations.web.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter({
    "http": ASGIStaticFilesHandler(django_asgi_app),
    # Session-authenticated sockets from this site's own pages only: same scheme, host and port (config/origin.py).
    "websocket": SameOriginValidator(socket_auth_stack(URLRouter(websocket_urlpatterns))),
})



def _uploads_left_to_django() -> None:
    """Under Daphne, Twisted would parse every multipart upload (a file of 25 MB, issue 29) into memory a second
    time, for nothing, and answer a malformed one itself with an empty 400 before Django could say what is wrong
    in the API's JSON. Django parses uploads itself: Twisted is told not to."""
    try:
        from daphne import http_protocol
    except ImportError:  # another server
        return
    original = http_protocol.WebRequest.__init__
    if getattr(original, "leaves_uploads_to_django", False):
        return

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("parsePOSTFormSubmission", False)
        original(self, *args, **kwargs)

    __init__.leaves_uploads_to_django = True
    http_protocol.WebRequest.__init__ = __init__


_uploads_left_to_django()

# Everything loaded so far (Django, DRF, Channels; litellm comes only with a real provider's first call) lives as long
# as the process; keep it out of the garbage collector's full passes, which otherwise pause a request for ~170 ms.
gc.freeze()
