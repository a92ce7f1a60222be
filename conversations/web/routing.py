from django.urls import path

from conversations.web.consumer import ChatConsumer

websocket_urlpatterns = [
    path("ws/conversations/<int:conversation_id>/", ChatConsumer.as_asgi()),
]
