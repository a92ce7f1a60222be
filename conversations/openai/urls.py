from django.urls import path, re_path

from conversations.openai import errors
from conversations.openai import views as v

urlpatterns = [
    path("models", v.Models.as_view(), name="openai-models"),
    path("chat/completions", v.ChatCompletions.as_view(), name="openai-chat-completions"),
    path("responses", v.Responses.as_view(), name="openai-responses"),
    path("responses/<str:response_id>", v.ResponseDetail.as_view(), name="openai-response"),
    path("responses/<str:response_id>/input_items", v.ResponseInputItems.as_view(), name="openai-input-items"),
    re_path(r"", errors.not_found),  # every other /v1/ path, in OpenAI's error format
]
