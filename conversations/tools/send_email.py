"""`send_email`: acts on the outside world, so it runs only after a person approves it (F3)."""

from __future__ import annotations

from django.conf import settings
from django.core.mail import send_mail

from conversations.tools.registry import Tool, register


def send_email(*, to: str, subject: str, body: str) -> dict:
    sent = send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [to], fail_silently=False)
    return {"sent": bool(sent), "to": to, "subject": subject}


TOOL = register(
    Tool(
        name="send_email",
        description="Send an email through the server's mail backend. A person must approve each email.",
        parameters={
            "type": "object",
            "properties": {
                "to": {"type": "string", "format": "email", "description": "Recipient address."},
                "subject": {"type": "string", "maxLength": 300},
                "body": {"type": "string"},
            },
            "required": ["to", "subject", "body"],
            "additionalProperties": False,
        },
        function=send_email,
        needs_approval=True,
    )
)
