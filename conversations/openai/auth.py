"""The API's own tokens, as the providers' clients send a key: `Authorization: Bearer <token>` (OpenAI's, and
Anthropic's SDK), or `x-api-key: <token>` (Anthropic's API, as Claude Code and older SDKs send it)."""

from config.token_auth import TokenAuthentication


class BearerTokenAuthentication(TokenAuthentication):
    keyword = "Bearer"


class ApiKeyAuthentication(TokenAuthentication):
    def authenticate(self, request):
        key = request.headers.get("x-api-key")
        return None if not key else self.authenticate_credentials(key)

    def authenticate_header(self, request):
        return "x-api-key"
