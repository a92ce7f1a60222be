from django.urls import path, re_path

from conversations.openai import errors
from conversations.openai import views as v

urlpatterns = [
    path("models", v.Models.as_view(), name="openai-models"),
    path("models/<path:model>", v.ModelDetail.as_view(), name="openai-model"),  # ids hold slashes: arbor/echo
    # Calls run a turn; their connection is given back before a stream begins.
    path("chat/completions", v.ChatCompletions.as_view(), name="openai-chat-completions"),
    path("responses", v.Responses.as_view(), name="openai-responses"),
    path("conversations", v.Conversations.as_view(), name="openai-conversations"),
    path("conversations/<str:conversation_id>", v.ConversationDetail.as_view(), name="openai-conversation"),
    path("conversations/<str:conversation_id>/items", v.ConversationItems.as_view(), name="openai-conversation-items"),
    path("conversations/<str:conversation_id>/items/<str:item_id>", v.ConversationItem.as_view(),
         name="openai-conversation-item"),
    path("messages", v.AnthropicMessages.as_view(), name="anthropic-messages"),
    path("messages/count_tokens", v.AnthropicCountTokens.as_view(), name="anthropic-count-tokens"),
    path("responses/<str:response_id>", v.ResponseDetail.as_view(), name="openai-response"),
    path("responses/<str:response_id>/input_items", v.ResponseInputItems.as_view(), name="openai-input-items"),
    re_path(r"", errors.not_found),  # every other /v1/ path, in OpenAI's error format
]
