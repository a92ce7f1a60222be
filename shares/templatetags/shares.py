"""`{% your_shares %}`: the settings page's list of a person's shared links (issue 33), each with Revoke. The
settings page belongs to the conversations app, which knows nothing of this one: it loads this tag."""

from django import template

from shares.selectors import share_list

register = template.Library()


@register.inclusion_tag("shares/_your_shares.html", takes_context=True)
def your_shares(context):
    request = context["request"]
    shares = list(share_list(user=request.user).select_related("conversation")[:100])
    return {"shares": shares, "request": request, "csrf_token": context.get("csrf_token")}
