"""The chat WebSocket as a browser opens it, for async tests: a signed-in session cookie, the project's real
ASGI application (origin check and session auth included), and reading messages up to a kind."""

from __future__ import annotations

from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application


def session_cookie(user) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


def chat_socket(conversation_id: int, cookie: bytes | None) -> WebsocketCommunicator:
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if cookie:
        headers.append((b"cookie", cookie))
    return WebsocketCommunicator(application, f"/ws/conversations/{conversation_id}/", headers=headers)


async def receive_until(socket: WebsocketCommunicator, kind: str, timeout: float = 30) -> list[dict]:
    """Messages up to and including the first of `kind` (or the first error)."""
    messages = []
    while True:
        message = await socket.receive_json_from(timeout=timeout)
        messages.append(message)
        if message["type"] in {kind, "error"}:
            return messages
