from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from config import api
from config.throttles import ThrottledLoginView, throttled_admin_login
from search.apis import Search

urlpatterns = [
    path("admin/login/", throttled_admin_login, name="admin-login"),  # before admin.site.urls' own
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # The split view serves Swagger UI's start-up script from a URL: the CSP allows no inline script.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema"), name="api-docs"),
    path("api/search/", Search.as_view(), name="search-api"),
    path("api/", include("conversations.apis.urls")),
    path("api/", include("playbooks.urls")),
    path("", include("files.urls")),  # issue 29: /api/files/
    path("", include("shares.urls")),  # issue 33: /api/…/share/, /api/shares/ and the /s/<token>/ page
    re_path(r"^api/", api.not_found),  # every other /api/ path answers in the API's error format
    path("v1/", include("conversations.openai.urls")),  # the OpenAI-compatible surface (issue 17)
    path("accounts/login/", ThrottledLoginView.as_view(), name="login"),  # before auth.urls' own
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("search.pages")),
    path("playbooks/", include("playbooks.pages")),
    path("", include("conversations.web.projects")),  # issue 30: the project pages
    path("", include("conversations.web.pages")),
]
