from django.urls import path

from playbooks import apis as v

urlpatterns = [
    path("conversations/<int:conversation_id>/playbooks/", v.PlaybookConvert.as_view(),
         name="playbook-convert"),
    path("playbooks/", v.PlaybookList.as_view(), name="playbook-list"),
    path("playbooks/<int:playbook_id>/", v.PlaybookDetail.as_view(), name="playbook-detail"),
    path("playbooks/<int:playbook_id>/edit-conversation/", v.PlaybookEditConversation.as_view(),
         name="playbook-edit-conversation"),
    path("playbooks/<int:playbook_id>/save/", v.PlaybookSave.as_view(), name="playbook-save"),
    path("playbooks/<int:playbook_id>/runs/", v.PlaybookRunCreate.as_view(), name="playbook-runs"),
    path("playbooks/<int:playbook_id>/runs/<int:run_id>/", v.PlaybookRunDetail.as_view(), name="playbook-run-detail"),
]
