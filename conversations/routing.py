from django.urls import path

from conversations.consumers import ChatConsumer

websocket_urlpatterns = [
    path("ws/conversations/<int:conversation_id>/", ChatConsumer.as_asgi()),
]
