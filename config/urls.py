from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from search.apis import Search

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path("api/search/", Search.as_view(), name="search-api"),
    path("api/", include("conversations.apis.urls")),
    path("api/", include("playbooks.urls")),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", include("search.pages")),
    path("playbooks/", include("playbooks.pages")),
    path("", include("conversations.web.pages")),
]
