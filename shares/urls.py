"""The share API under /api/ and the share page under /s/ (one include in config/urls.py, before /api/'s 404)."""

from django.urls import path

from shares import apis, pages

urlpatterns = [
    path("api/conversations/<int:conversation_id>/share/", apis.ShareCreate.as_view(), name="share-create"),
    path("api/shares/", apis.ShareList.as_view(), name="share-list"),
    path("api/shares/<str:token>/", apis.ShareDetail.as_view(), name="share-detail"),
    path("s/<str:token>/", pages.share_page, name="share-page"),
    path("s/<str:token>/continue/", pages.share_continue_page, name="share-continue"),
    path("s/<str:token>/revoke/", pages.share_revoke_page, name="share-revoke"),
]
