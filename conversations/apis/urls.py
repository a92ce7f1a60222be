from django.urls import path

from conversations.apis import streams, transfer
from conversations.apis import views as v

urlpatterns = [
    path("conversations/", v.ConversationListCreate.as_view(), name="conversation-list"),
    path("conversations/import/", transfer.ConversationImport.as_view(), name="conversation-import"),
    path("conversations/<int:conversation_id>/", v.ConversationDetail.as_view(), name="conversation-detail"),
    path("conversations/<int:conversation_id>/turns/", v.TurnCreate.as_view(), name="turn-create"),
    path("conversations/<int:conversation_id>/edit/", v.TurnEdit.as_view(), name="turn-edit"),
    path("conversations/<int:conversation_id>/regenerate/", v.TurnRegenerate.as_view(),
         name="turn-regenerate"),
    path("conversations/<int:conversation_id>/retry/", v.TurnRetry.as_view(), name="turn-retry"),
    path("conversations/<int:conversation_id>/approvals/", v.ToolApprovalCreate.as_view(),
         name="tool-approval"),
    path("conversations/<int:conversation_id>/stream/", streams.TurnStreamFollow.as_view(),
         name="turn-stream"),
    path("conversations/<int:conversation_id>/stop/", streams.TurnStop.as_view(), name="turn-stop"),
    path("conversations/<int:conversation_id>/switch/", v.HeadSwitch.as_view(), name="head-switch"),
    path("conversations/<int:conversation_id>/compact/", v.ConversationCompact.as_view(),
         name="conversation-compact"),
    path("conversations/<int:conversation_id>/fork/", v.ConversationFork.as_view(), name="conversation-fork"),
    path("conversations/<int:conversation_id>/diff/", v.ContextDiff.as_view(), name="conversation-diff"),
    path("conversations/<int:conversation_id>/clear/", v.ConversationClear.as_view(), name="conversation-clear"),
    path("conversations/<int:conversation_id>/context/", v.ContextDetail.as_view(), name="conversation-context"),
    path("conversations/<int:conversation_id>/bubbles/", v.BubbleList.as_view(), name="conversation-bubbles"),
    path("conversations/<int:conversation_id>/nodes/", v.NodeList.as_view(), name="conversation-nodes"),
    path("conversations/<int:conversation_id>/export/", transfer.ConversationExport.as_view(),
         name="conversation-export"),
    path("projects/<int:project_id>/export/", transfer.ProjectExport.as_view(), name="project-export"),
    path("nodes/<int:node_id>/", v.NodeDetail.as_view(), name="node-detail"),
    path("usage/", v.UsageSummary.as_view(), name="usage"),
    path("tools/", v.ToolList.as_view(), name="tools"),  # may start a server: seconds
    path("projects/", v.ProjectListCreate.as_view(), name="project-list"),
    path("projects/<int:project_id>/", v.ProjectDetail.as_view(), name="project-detail"),
    path("users/<str:username>/budget/", v.UserBudget.as_view(), name="user-budget"),
    path("conversations/<int:conversation_id>/tree/", v.ConversationTree.as_view(), name="conversation-tree"),
]
