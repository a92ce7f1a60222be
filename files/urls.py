"""The files API under /api/files/ (one include in config/urls.py, before /api/'s 404)."""

from django.urls import path

from files import apis

urlpatterns = [
    path("api/files/", apis.FileListCreate.as_view(), name="file-list"),
    path("api/files/<int:file_id>/", apis.FileDetail.as_view(), name="file-detail"),
    path("api/files/<int:file_id>/content/", apis.FileContent.as_view(), name="file-content"),
]
