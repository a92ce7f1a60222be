"""`Authorization: Bearer <token>`: the API's own tokens, as OpenAI's clients send a key."""

from rest_framework.authentication import TokenAuthentication


class BearerTokenAuthentication(TokenAuthentication):
    keyword = "Bearer"
