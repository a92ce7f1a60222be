"""Arbor settings. The environment is read here and nowhere else."""

import json
import os
from pathlib import Path
from typing import Any

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

# litellm reads these when it is first imported: never fetch its price list or Anthropic's beta headers at run
# time, and never download a Hugging Face tokenizer to count a llama model's tokens (that waited ~24 s on
# retries with no network); the bundled tiktoken files count instead.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS", "True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    return os.environ.get(name, str(default)).strip().lower() in {"1", "true", "yes", "on"}


def _secret_key() -> str:
    """DJANGO_SECRET_KEY, else the random key the set-up scripts keep in var/secret_key; never a default
    (a key in the repository would let anyone forge signed cookies)."""
    key = os.environ.get("DJANGO_SECRET_KEY", "").strip()
    key_file = Path(os.environ.get("ARBOR_SECRET_KEY_FILE") or BASE_DIR / "var" / "secret_key")
    if not key and key_file.is_file():
        key = key_file.read_text().strip()
    if len(key) < 32:
        raise ImproperlyConfigured(
            f"No secret key: set DJANGO_SECRET_KEY (50 random characters), or run scripts/start or scripts/test "
            f"once to keep a random one in {key_file}.")
    return key


SECRET_KEY = _secret_key()
DEBUG = _env_bool("DJANGO_DEBUG", False)
ALLOWED_HOSTS = [h for h in os.environ.get("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]").split(",") if h]
# Origins (scheme included: https://arbor.example.com) whose unsafe requests pass the CSRF check besides the
# request's own host: needed behind a proxy that terminates TLS and does not say so (ARBOR_PROXY_SSL_HEADER).
CSRF_TRUSTED_ORIGINS = [o.strip() for o in os.environ.get("DJANGO_CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]


def _proxy_ssl_header(value: str) -> tuple[str, str] | None:
    """ARBOR_PROXY_SSL_HEADER `X-Forwarded-Proto` (or `X-Forwarded-Ssl=on`) as Django's META key and value."""
    name, _, secure_value = value.strip().partition("=")
    if not name.strip():
        return None
    return "HTTP_" + name.strip().upper().replace("-", "_"), secure_value.strip() or "https"


# Production over HTTPS (issue 14 finding 7). ARBOR_HTTPS=1 says people reach Arbor over HTTPS only and turns
# on what `manage.py check --deploy` asks for; each part has a variable of its own to override it. Off by
# default: the quick start (scripts/start) serves plain http, where secure cookies would never come back.
ARBOR_HTTPS = _env_bool("ARBOR_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = _env_bool("ARBOR_SECURE_COOKIES", ARBOR_HTTPS)
SECURE_SSL_REDIRECT = _env_bool("ARBOR_SSL_REDIRECT", ARBOR_HTTPS)
# HSTS: browsers refuse plain http to this host for that long; try a short ARBOR_HSTS_SECONDS (3600) first.
SECURE_HSTS_SECONDS = int(os.environ.get("ARBOR_HSTS_SECONDS") or (365 * 24 * 3600 if ARBOR_HTTPS else 0))
SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("ARBOR_HSTS_INCLUDE_SUBDOMAINS", ARBOR_HTTPS)
# Preload lets the domain onto the browsers' built-in HSTS list, for the whole domain and hard to undo: ask for it.
SECURE_HSTS_PRELOAD = _env_bool("ARBOR_HSTS_PRELOAD", False)
# Trust this header from the proxy in front (which must overwrite what a client sent) to mean the request was https.
SECURE_PROXY_SSL_HEADER = _proxy_ssl_header(os.environ.get("ARBOR_PROXY_SSL_HEADER", ""))

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "conversations",
    "search",
    "playbooks",
    "shares",
    "files",
]

MIDDLEWARE = [
    "config.middleware.content_security_policy",  # first: every response, an SSL redirect's included
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "conversations.web.shell.chat_shell",
                "playbooks.web.editing_playbook",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'var' / 'arbor.sqlite3'}",
        conn_max_age=0,
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # psycopg 3's pool: turn threads open and close connections often.
    # Each process opens at most ARBOR_DB_POOL_MAX connections and gives idle ones back after a minute:
    # PostgreSQL's max_connections must exceed (server processes + workers) x ARBOR_DB_POOL_MAX (README).
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": int(os.environ.get("ARBOR_DB_POOL_MIN", "1")),
        "max_size": int(os.environ.get("ARBOR_DB_POOL_MAX", "20")),
        "max_idle": 60, "timeout": 10}
else:
    # SQLite: wait for the writer instead of failing at once when a turn thread holds the lock.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {"timeout": 20, "transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"}
    )
    # A file, not memory: turn threads must see the test data. One per process: runs may overlap.
    DATABASES["default"]["TEST"] = {"NAME": str(BASE_DIR / "var" / f"test-arbor-{os.getpid()}.sqlite3")}

# Issue 34: a PostgreSQL streaming replica for the reads that may lag (config/replica.py); the primary's pool
# settings. In tests it is the primary itself (MIRROR): what a test writes, it reads.
if os.environ.get("DATABASE_REPLICA_URL"):
    DATABASES["replica"] = {**dj_database_url.parse(os.environ["DATABASE_REPLICA_URL"], conn_max_age=0),
                            "OPTIONS": dict(DATABASES["default"].get("OPTIONS", {})), "TEST": {"MIRROR": "default"}}
DATABASE_ROUTERS = ["config.replica.ReplicaRouter"]

# No channel layer: nothing sends between consumers through one. A turn's events reach every tab and
# process through its log (conversations/turns/log.py): Redis Streams when REDIS_URL is set, else the
# database. With channels-redis, an idle socket's layer read hit redis's own read timeout and closed the
# socket (1011) every few seconds.
REDIS_URL = os.environ.get("REDIS_URL", "").strip()
# Shared between processes when Redis is there (throttle counts); else this process's memory.
CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL,
                      "OPTIONS": {"socket_connect_timeout": 1, "socket_timeout": 1,
                                  "pool_class": "config.redis_pool.SharedConnectionPool"}}
          if REDIS_URL else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "var" / "static"
# Issue 29 (X1): people's files, through Django's storage API: the local file system under var/ by default.
# ARBOR_FILES_S3_BUCKET puts them on an S3-compatible store (django-storages; ARBOR_FILES_S3_ENDPOINT for one that is
# not AWS, credentials as boto3 reads them: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY). The bytes are private there:
# only Arbor reads them, and serves them to their owner (no public or signed URL is ever handed out).
ARBOR_FILES_DIR = Path(os.environ.get("ARBOR_FILES_DIR") or BASE_DIR / "var" / "files")


def files_storage(bucket: str | None, endpoint: str | None = None, region: str | None = None) -> dict:
    if not bucket:
        return {"BACKEND": "django.core.files.storage.FileSystemStorage",
                "OPTIONS": {"location": str(ARBOR_FILES_DIR), "base_url": "/api/files/"}}
    return {"BACKEND": "storages.backends.s3.S3Storage", "OPTIONS": {
        "bucket_name": bucket, "endpoint_url": endpoint or None, "region_name": region or None,
        "default_acl": "private", "querystring_auth": True, "file_overwrite": True}}


STORAGES = {
    "default": files_storage(os.environ.get("ARBOR_FILES_S3_BUCKET"), os.environ.get("ARBOR_FILES_S3_ENDPOINT"),
                             os.environ.get("ARBOR_FILES_S3_REGION")),
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
ARBOR_FILE_MAX_BYTES = int(os.environ.get("ARBOR_FILE_MAX_BYTES", str(25 * 1024 * 1024)))
ARBOR_FILE_TEXT_MAX_CHARS = int(os.environ.get("ARBOR_FILE_TEXT_MAX_CHARS", "200000"))  # D5: a document's text
# Issue 30: the characters of a project's knowledge files that may go with one question (X2, R2).
ARBOR_PROJECT_KNOWLEDGE_CHARS = int(os.environ.get("ARBOR_PROJECT_KNOWLEDGE_CHARS", "6000"))
ARBOR_PROJECT_KNOWLEDGE_SCAN_CHARS = int(os.environ.get("ARBOR_PROJECT_KNOWLEDGE_SCAN_CHARS", "2000000"))
# D5: the XML a Word, Excel or PowerPoint file may unpack into (files/office.py): past it, a "zip bomb" is refused.
ARBOR_OFFICE_XML_MAX_BYTES = int(os.environ.get("ARBOR_OFFICE_XML_MAX_BYTES", str(64 * 1024 * 1024)))
ARBOR_FILES_PER_TURN = int(os.environ.get("ARBOR_FILES_PER_TURN", "10"))
# An image goes to a model whole: at most what providers take (Anthropic: 5 MB an image), and at most this many bytes
# of images in one call, the newest first (older ones go as their names).
ARBOR_IMAGE_MAX_BYTES = int(os.environ.get("ARBOR_IMAGE_MAX_BYTES", str(5 * 1024 * 1024)))
ARBOR_CALL_IMAGE_MAX_BYTES = int(os.environ.get("ARBOR_CALL_IMAGE_MAX_BYTES", str(20 * 1024 * 1024)))
# A /v1 call's body, its images and files inside it in base64: room for one file of the largest size (issue 29).
ARBOR_GATEWAY_MAX_BODY_BYTES = int(os.environ.get("ARBOR_GATEWAY_MAX_BODY_BYTES", str(40 * 1024 * 1024)))
# A document longer than this goes to a call as its parts that bear on the question (files/chunks.py, R2).
ARBOR_FILE_WHOLE_CHARS = int(os.environ.get("ARBOR_FILE_WHOLE_CHARS", "24000"))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/chat/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

EMAIL_BACKEND = os.environ.get("DJANGO_EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_TIMEOUT = 15  # a hung mail server must not hold a tool thread for ever
DEFAULT_FROM_EMAIL = os.environ.get("DJANGO_DEFAULT_FROM_EMAIL", "arbor@localhost")

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "config.token_auth.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # The anonymous rate first: a caller with no credentials is throttled, not answered 401 for ever (issue 26).
    "DEFAULT_PERMISSION_CLASSES": ["config.throttles.AnonRateFirst", "rest_framework.permissions.IsAuthenticated"],
    # NUL, lone surrogates, out-of-range integers and deep nesting are a 400 before any view sees the body.
    "DEFAULT_PARSER_CLASSES": ["config.api.StrictJSONParser"],
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "config.api.exception_handler",
    # One caller cannot starve the others: requests per caller (a signed-in user, else the client's address),
    # counted in the shared cache (Redis when REDIS_URL is set). A cache that fails lets requests through.
    "DEFAULT_THROTTLE_CLASSES": ["config.throttles.UserThrottle", "config.throttles.AnonThrottle"],
    # The client's address is REMOTE_ADDR unless ARBOR_NUM_PROXIES proxies add X-Forwarded-For (else anyone
    # could pick their own address by sending that header).
    "NUM_PROXIES": int(os.environ.get("ARBOR_NUM_PROXIES", "0")),
    "DEFAULT_THROTTLE_RATES": {
        "user": os.environ.get("ARBOR_API_USER_RATE", "1200/min"),
        "anon": os.environ.get("ARBOR_API_ANON_RATE", "120/min"),
    },
}
# Sign-in attempts per client address and per user name (config/throttles.py), then 429 until it passes.
ARBOR_SIGNIN_RATE = os.environ.get("ARBOR_SIGNIN_RATE", "10/min")
SPECTACULAR_SETTINGS = {
    "TITLE": "Arbor API",
    "DESCRIPTION": "Conversation-tree context store and chat service.",
    "VERSION": "0.1.0",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The error body as a component that every error response names, and the error statuses every API view
    # shares (config/schema.py); scripts/fuzz holds the API to this schema.
    "POSTPROCESSING_HOOKS": ["drf_spectacular.hooks.postprocess_schema_enums", "config.schema.error_responses",
                             "conversations.apis.schema.turn_links"],
    "SERVE_INCLUDE_SCHEMA": False,  # /api/schema/ describes the API, not itself
    # A node's kind and status, and a file's (issue 29): each choice set named for what it belongs to.
    "ENUM_NAME_OVERRIDES": {"NodeKindEnum": "conversations.models.NodeKind",
                            "NodeStatusEnum": "conversations.models.NodeStatus",
                            "FileKindEnum": "files.models.StoredFile.Kind",
                            "FileStatusEnum": "files.models.StoredFile.Status"},
}

# Arbor itself.
ARBOR_MODEL = os.environ.get("ARBOR_MODEL", "arbor/echo")
# The base URL of an OpenAI-compatible server for `openai/…` and `hosted_vllm/…` models only (a shorthand for
# ARBOR_PROVIDERS={"openai": {"api_base": …}, "hosted_vllm": {"api_base": …}}); never sent to other providers.
ARBOR_API_BASE = os.environ.get("ARBOR_API_BASE") or None


def _json_setting(name: str, raw: str) -> Any:
    """A setting given as JSON: {} when it is unset or blank; a start that says so when it is no JSON."""
    if not raw.strip():
        return {}
    try:
        return json.loads(raw)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name} is not JSON: {error}") from None


def _providers(raw: str) -> dict[str, dict]:
    """ARBOR_PROVIDERS: a JSON object of litellm options per provider or per model (README "Models and
    providers"), e.g. {"anthropic": {"api_key": "…"}, "azure/my-gpt": {"api_base": "…", "api_version": "…"}}."""
    value = _json_setting("ARBOR_PROVIDERS", raw)
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, dict) for k, v in value.items()):
        raise ImproperlyConfigured('ARBOR_PROVIDERS must be a JSON object of objects: {"anthropic": {"api_key": '
                                   '"…"}, "openai/gpt-4o": {"api_base": "…"}}')
    return value


ARBOR_PROVIDERS = _providers(os.environ.get("ARBOR_PROVIDERS", ""))


def _prices(raw: str) -> dict[str, dict[str, float]]:
    """ARBOR_MODEL_PRICES (issue 31): US dollars per million tokens for models whose price litellm's list lacks or
    has wrong (a negotiated rate, a local server's running cost): {"openai/gpt-4o": {"input": 2.5, "output": 10,
    "cached_input": 1.25}}; `cached_input` defaults to `input`. They win over litellm's list."""
    value = _json_setting("ARBOR_MODEL_PRICES", raw)
    shape = 'a JSON object such as {"openai/gpt-4o": {"input": 2.5, "output": 10, "cached_input": 1.25}}'
    if not isinstance(value, dict):
        raise ImproperlyConfigured(f"ARBOR_MODEL_PRICES must be {shape}")
    for model, price in value.items():
        if not isinstance(price, dict) or not {"input", "output"} <= set(price) <= {"input", "output",
                                                                                   "cached_input"}:
            raise ImproperlyConfigured(f"ARBOR_MODEL_PRICES[{model!r}] must hold `input` and `output` (and may hold "
                                       f"`cached_input`): {shape}")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in price.values()):
            raise ImproperlyConfigured(f"ARBOR_MODEL_PRICES[{model!r}]: each price is a number of dollars per "
                                       "million tokens, 0 or more")
    return value


ARBOR_MODEL_PRICES = _prices(os.environ.get("ARBOR_MODEL_PRICES", ""))
ARBOR_MODELS = [m for m in os.environ.get("ARBOR_MODELS", "").split(",") if m] or [ARBOR_MODEL]
ARBOR_LLM_TIMEOUT_SECONDS = float(os.environ.get("ARBOR_LLM_TIMEOUT_SECONDS", "120"))
# A demo chat should feel like a real model (128k input), not compact every few turns; tests that need a
# compaction set it small.
ARBOR_ECHO_MAX_INPUT_TOKENS = int(os.environ.get("ARBOR_ECHO_MAX_INPUT_TOKENS", "128000"))
ARBOR_ECHO_WORD_SECONDS = float(os.environ.get("ARBOR_ECHO_WORD_SECONDS", "0.1"))  # `#slow`: one word each
# C1: the budget is max input tokens (litellm's model info unless overridden here) minus a reserve for
# the answer; compaction runs before a call that would pass the threshold, a share of that budget.
# ARBOR_MAX_INPUT_TOKENS: "8192" for every model, or "openai/gpt-4o=100000,hosted_vllm/x=8192".
ARBOR_MAX_INPUT_TOKENS = {
    (name.strip() if sep else "*"): int(value if sep else name)
    for name, sep, value in (part.partition("=") for part in os.environ.get("ARBOR_MAX_INPUT_TOKENS", "").split(","))
    if name.strip()
}
ARBOR_DEFAULT_MAX_INPUT_TOKENS = int(os.environ.get("ARBOR_DEFAULT_MAX_INPUT_TOKENS", "8192"))
# The most a call's answer may take (sent as max_tokens): the model's own output limit, capped by this.
ARBOR_ANSWER_RESERVE_TOKENS = int(os.environ.get("ARBOR_ANSWER_RESERVE_TOKENS", "4096"))
ARBOR_COMPACTION_THRESHOLD = float(os.environ.get("ARBOR_COMPACTION_THRESHOLD", "0.8"))
ARBOR_COMPACTION_KEEP_TURNS = int(os.environ.get("ARBOR_COMPACTION_KEEP_TURNS", "4"))
ARBOR_MAX_ROUNDS_PER_TURN = int(os.environ.get("ARBOR_MAX_ROUNDS_PER_TURN", "8"))
ARBOR_MAX_CONTENT_CHARS = int(os.environ.get("ARBOR_MAX_CONTENT_CHARS", "100000"))
# The turn lock is a lease renewed by a heartbeat while held: a process that dies mid-turn frees its
# conversation within ARBOR_TURN_LOCK_SECONDS. A streaming answer's text is saved on its pending node
# every ARBOR_PARTIAL_SAVE_SECONDS, so a crash loses at most those last moments.
ARBOR_TURN_LOCK_SECONDS = float(os.environ.get("ARBOR_TURN_LOCK_SECONDS", "20"))
ARBOR_TURN_HEARTBEAT_SECONDS = float(os.environ.get("ARBOR_TURN_HEARTBEAT_SECONDS", "5"))
# Fairness (issue 13): a person's turns (and compactions, conversions) running at once; beyond, 429
# too_many_turns. 0: no limit.
ARBOR_MAX_CONCURRENT_TURNS_PER_USER = int(os.environ.get("ARBOR_MAX_CONCURRENT_TURNS_PER_USER", "4"))
# Issue 33: how many models one question may be asked of at once (each runs a turn, counted by the limit above)
ARBOR_MODELS_PER_TURN = int(os.environ.get("ARBOR_MODELS_PER_TURN", "4"))
# Streams one person may follow at once in one process (`GET …/stream/`, streamed turns and /v1 calls): a stream
# holds no database connection while it waits, but it holds a socket and memory; one more answers 429.
ARBOR_MAX_STREAMS_PER_USER = int(os.environ.get("ARBOR_MAX_STREAMS_PER_USER", "20"))
# Threads every HTTP request's view runs in (config/pooled_http.py), a JSON turn's for as long as its model takes:
# made as needed, up to this many.
ARBOR_LONG_VIEW_THREADS = int(os.environ.get("ARBOR_LONG_VIEW_THREADS", "1000"))
ARBOR_PARTIAL_SAVE_SECONDS = float(os.environ.get("ARBOR_PARTIAL_SAVE_SECONDS", "2"))
# A turn's numbered event log is kept this long after it ends, for clients that resume (GET .../stream/).
ARBOR_TURN_LOG_RETENTION_SECONDS = float(os.environ.get("ARBOR_TURN_LOG_RETENTION_SECONDS", "600"))
ARBOR_PATH_DEPTH_LIMIT = int(os.environ.get("ARBOR_PATH_DEPTH_LIMIT", "100000"))
ARBOR_TOOL_TIMEOUT_SECONDS = float(os.environ.get("ARBOR_TOOL_TIMEOUT_SECONDS", "30"))
# Tools one person may have running in a process at once (a timed-out or stopped one counts until its thread
# ends); past it a call is not started and the model reads why. 0: no limit (issue 26.3).
ARBOR_MAX_TOOLS_PER_USER = int(os.environ.get("ARBOR_MAX_TOOLS_PER_USER", "4"))
# What a tool may hand back, cut while it is read (every tool, through the tool runner): one text or binary
# value, and the whole result. A node stores at most ARBOR_NODE_MAX_BYTES of items (a model's answer
# included); a round's tool results share it.
ARBOR_TOOL_CELL_MAX_BYTES = int(os.environ.get("ARBOR_TOOL_CELL_MAX_BYTES", "8000"))
ARBOR_TOOL_OUTPUT_MAX_BYTES = int(os.environ.get("ARBOR_TOOL_OUTPUT_MAX_BYTES", "64000"))
# Issue 31: OpenTelemetry traces over OTLP/HTTP (conversations/tracing.py); off unless an endpoint is set.
ARBOR_OTEL_ENDPOINT = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "")
ARBOR_OTEL_SERVICE_NAME = os.environ.get("OTEL_SERVICE_NAME", "arbor")
# Issue 32: the MCP servers whose tools conversations may use (JSON; see conversations/tools/mcp/servers.py).
ARBOR_MCP_SERVERS = os.environ.get("ARBOR_MCP_SERVERS", "")
ARBOR_NODE_MAX_BYTES = int(os.environ.get("ARBOR_NODE_MAX_BYTES", "1000000"))
ARBOR_SALES_DB_PATH = BASE_DIR / "var" / "sales.sqlite3"
ARBOR_SEARCH_CONFIG = os.environ.get("ARBOR_SEARCH_CONFIG", "simple")  # PostgreSQL text search configuration
ARBOR_SCREEN_NODES = int(os.environ.get("ARBOR_SCREEN_NODES", "400"))  # a chat page shows its history's end
# Nodes per page of `/bubbles/`, `/nodes/` and the chat page's earlier messages (issue 13): a request's cost
# and memory follow it, not the conversation's size.
ARBOR_PAGE_NODES = int(os.environ.get("ARBOR_PAGE_NODES", "200"))
ARBOR_RETRIEVAL_RESULTS = int(os.environ.get("ARBOR_RETRIEVAL_RESULTS", "3"))
# Semantic memory (issue 18): the worker embeds every question and answer with this litellm embedding model
# (empty: words only). Vectors are kept with the model that made them; a new model re-embeds in the background.
ARBOR_EMBEDDING_MODEL = os.environ.get("ARBOR_EMBEDDING_MODEL", "arbor/echo-embed")
ARBOR_EMBEDDING_BATCH = int(os.environ.get("ARBOR_EMBEDDING_BATCH", "64"))  # texts an embedding call
ARBOR_EMBEDDING_TIMEOUT_SECONDS = float(os.environ.get("ARBOR_EMBEDDING_TIMEOUT_SECONDS", "10"))
# A vector hit is attached to a question only this close (cosine); the scale is the model's own.
ARBOR_RETRIEVAL_MIN_SIMILARITY = float(os.environ.get("ARBOR_RETRIEVAL_MIN_SIMILARITY", "0.3"))
# Where PostgreSQL has pgvector its HNSW index ranks vectors (`auto`); `exact` keeps to exact scoring in memory
# (bench_retrieval compares the two on the same rows: see the README).
ARBOR_VECTOR_SCORER = os.environ.get("ARBOR_VECTOR_SCORER", "auto")
if ARBOR_VECTOR_SCORER not in ("auto", "exact"):
    raise ImproperlyConfigured("ARBOR_VECTOR_SCORER must be `auto` or `exact`")
# Exact scoring keeps each owner's vectors in memory, per process; beyond this the least used owner goes.
ARBOR_VECTOR_CACHE_MB = int(os.environ.get("ARBOR_VECTOR_CACHE_MB", "512"))
ARBOR_WORKER_MAX_ATTEMPTS = int(os.environ.get("ARBOR_WORKER_MAX_ATTEMPTS", "5"))
ARBOR_WORKER_LEASE_SECONDS = int(os.environ.get("ARBOR_WORKER_LEASE_SECONDS", "300"))
ARBOR_IMPORT_MAX_BYTES = int(os.environ.get("ARBOR_IMPORT_MAX_BYTES", str(50 * 1024 * 1024)))
ARBOR_IMPORT_MAX_NODES = int(os.environ.get("ARBOR_IMPORT_MAX_NODES", "100000"))
ARBOR_SQL_ROW_CAP = int(os.environ.get("ARBOR_SQL_ROW_CAP", "200"))
ARBOR_SQL_TIME_LIMIT_SECONDS = float(os.environ.get("ARBOR_SQL_TIME_LIMIT_SECONDS", "2"))
# P1: how many drafts a playbook conversion may try before it gives up with the last errors.
ARBOR_PLAYBOOK_TRIES = int(os.environ.get("ARBOR_PLAYBOOK_TRIES", "3"))

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "loggers": {"arbor": {"handlers": ["console"], "level": os.environ.get("ARBOR_LOG_LEVEL", "INFO")}},
}
