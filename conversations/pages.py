"""Server-rendered pages. The chat pages come with their own issue; this is the landing page."""

from django.shortcuts import render
from django.urls import path


def home(request):
    return render(request, "home.html")


urlpatterns = [path("", home, name="home")]
