"""A page's form read by the API's own input serializer, so a page and a client are held to the same limits."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest
from rest_framework import serializers

# A checkbox posts "true" (its hidden twin "false"); the API takes JSON booleans only.
_FORM_BOOLEANS = {"true": True, "false": False}


def form_input(request: HttpRequest, serializer_class: type[serializers.Serializer], fields: tuple[str, ...], *,
               partial: bool = False) -> dict | None:
    """The posted `fields` as `serializer_class` checks them; None, with a message saying what is wrong, when not."""
    declared = serializer_class().fields
    data = {name: _FORM_BOOLEANS.get(request.POST[name], request.POST[name])
            if isinstance(declared.get(name), serializers.BooleanField) else request.POST[name]
            for name in fields if name in request.POST}
    form = serializer_class(data=data, partial=partial)
    if form.is_valid():
        return dict(form.validated_data)
    problems = "; ".join(f"{field}: {' '.join(map(str, errors))}" for field, errors in form.errors.items())
    messages.error(request, f"Nothing was changed. {problems}")
    return None
