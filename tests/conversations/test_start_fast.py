"""Issue 34 (start fast): litellm is imported only when a real provider is called, so `scripts/start`'s processes
(the bootstrap, the worker, the server) never pay for it on the offline model; `arbor_bootstrap --migrate` runs
`migrate` only when a migration is unapplied. Nothing here is timed: `manage.py bench_start` measures.

Whether litellm is loaded is read from `sys.modules` of a fresh process (this one has it: other tests import it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.conf import settings

from conversations import llm
from conversations.llm import custom
from tests.support.openai_stub import Reply

ROOT = Path(settings.BASE_DIR)


def _run(script: str, tmp_path: Path, **env: str) -> dict:
    """Run `script` in a fresh Python on its own SQLite database in `tmp_path`; return the JSON it printed last."""
    environment = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    environment.update(DJANGO_SETTINGS_MODULE="config.settings", DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite3'}",
                       PYTHONPATH=str(ROOT), ARBOR_TEST_TMP=str(tmp_path), **env)
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], cwd=ROOT, env=environment,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# The start's own steps in one process, in scripts/start's order: the bootstrap (with its migrate), the server's
# app, an arbor/echo turn with a tool round through the API, what the model saw, the worker's jobs (its title
# and embeddings), the bootstrap again (a warm start: nothing to migrate).
_START_AND_TURN = """
    import io, json, os, re, sys
    from pathlib import Path

    tmp = Path(os.environ["ARBOR_TEST_TMP"])
    from config.asgi import application  # the server's app: Django set up as daphne sets it up

    from django.conf import settings
    settings.BASE_DIR = tmp  # the first user's password file and the sales database go here, not the checkout
    settings.ARBOR_SALES_DB_PATH = tmp / "var" / "sales.sqlite3"
    (tmp / "var").mkdir()
    from django.core.management import call_command
    from django.test import Client

    first = io.StringIO()
    call_command("arbor_bootstrap", "--migrate", stdout=first)
    token = re.search(r"token (\\w+)", first.getvalue()).group(1)
    client = Client(HTTP_AUTHORIZATION=f"Token {token}", HTTP_HOST="127.0.0.1")
    conversation = client.post("/api/conversations/", {}, content_type="application/json").json()
    question = 'hello #tool sql_query {"sql": "select count(*) as n from customers"}'
    turn = client.post(f"/api/conversations/{conversation['id']}/turns/", {"content": question},
                       content_type="application/json")
    seen = client.get(f"/api/conversations/{conversation['id']}/context/")
    worker = io.StringIO()
    call_command("arbor_worker", "--once", stdout=worker)
    again = io.StringIO()
    call_command("arbor_bootstrap", "--migrate", stdout=again)
    from conversations.models import Conversation
    print(json.dumps({
        "litellm": sorted(m for m in sys.modules if m == "litellm" or m.startswith("litellm.")),
        "turn": turn.status_code, "answer": turn.json().get("answer", ""), "seen": seen.status_code,
        "worker": worker.getvalue(), "title": Conversation.objects.get(pk=conversation["id"]).title,
        "first": first.getvalue(), "again": again.getvalue(),
    }))
"""


@pytest.fixture(scope="module")
def started(tmp_path_factory) -> dict:
    return _run(_START_AND_TURN, tmp_path_factory.mktemp("start"))


def test_issue_34_the_bootstrap_server_an_echo_turn_and_the_worker_never_import_litellm(started):
    """Issue 34: a start on the offline model (bootstrap with migrate, the ASGI app, an arbor/echo turn with a
    tool round over the API, its context, the worker's title and embedding jobs) loads no litellm module."""
    out = started
    assert out["litellm"] == []
    assert out["turn"] == 201
    assert out["answer"].startswith("echo: hello #tool sql_query"), out["answer"]
    assert out["seen"] == 200
    assert out["worker"].startswith("done "), out["worker"]
    assert out["title"] == 'hello #tool sql_query {"sql": "select count(*)', "the worker's title call (echo)"


def test_issue_34_bootstrap_migrates_a_new_database_and_skips_migrate_when_nothing_is_unapplied(started):
    """Issue 34: `arbor_bootstrap --migrate` applies every migration to a new database, and on the next start
    (nothing unapplied) runs no `migrate` at all: only the log-in lines."""
    out = started
    assert "Applying conversations.0001_initial..." in out["first"], out["first"]
    assert "Arbor is starting at" in out["first"]
    assert "migrat" not in out["again"].lower(), out["again"]
    assert out["again"].lstrip().startswith("Arbor is starting at")


def test_issue_34_a_real_provider_still_goes_through_litellm_loaded_on_its_first_call(tmp_path, stub):
    """Issue 34: after echo calls (no litellm), the first call to a real provider loads litellm and streams the
    loopback OpenAI stub's answer through it, with the cost and facts litellm knows."""
    stub.script(Reply.text("hello from the stub", prompt_tokens=9, completion_tokens=4))
    out = _run("""
        import json, sys
        import django
        django.setup()
        from conversations import llm

        def drain(stream):
            tokens = []
            try:
                while True:
                    tokens.append(next(stream))
            except StopIteration as stop:
                return tokens, stop.value

        question = [{"role": "user", "content": "hi"}]
        _, echo = drain(llm.stream_call(model="arbor/echo", messages=question))
        facts = [llm.max_input_tokens("arbor/echo"), llm.count_tokens("arbor/echo", question),
                 llm.supports_json_mode("arbor/echo"), llm.provider_of("arbor/echo")]
        vectors = llm.embed("arbor/echo-embed", ["hello", "world"])
        before = "litellm" in sys.modules
        tokens, real = drain(llm.stream_call(model="openai/stub-model", messages=question))
        print(json.dumps({"before": before, "after": "litellm" in sys.modules, "echo": echo.received,
                          "facts": facts, "vectors": [len(v) for v in vectors], "tokens": tokens,
                          "received": real.received, "usage": real.usage, "provider": real.provider,
                          "gpt4o": llm.max_input_tokens("openai/gpt-4o")}))
    """, tmp_path, ARBOR_API_BASE=stub.base_url, OPENAI_API_KEY="sk-test-loopback")
    assert out["before"] is False, "echo calls, its facts and its embeddings load no litellm"
    assert out["echo"] == [{"type": "text", "text": "echo: hi\nseen: user:hi"}]
    assert out["facts"] == [128000, llm.estimate_tokens([{"role": "user", "content": "hi"}]), True, "arbor"]
    assert out["vectors"] == [384, 384]
    assert out["after"] is True
    assert "".join(out["tokens"]) == "hello from the stub"
    assert out["received"] == [{"type": "text", "text": "hello from the stub"}]
    assert out["usage"]["prompt_tokens"] == 9 and out["usage"]["completion_tokens"] == 4
    assert out["provider"] == "openai"
    assert out["gpt4o"] > 100_000, "litellm's model info, loaded on demand"
    assert len(stub.requests) == 1


# --- the same echo answer whether the seam calls it or litellm does --------------------------------------------


def _direct(model: str, messages: list[dict], **kwargs) -> tuple[list[str], llm.CallResult]:
    stream, tokens = llm.stream_call(model=model, messages=messages, **kwargs), []
    try:
        while True:
            tokens.append(next(stream))
    except StopIteration as stop:
        return tokens, stop.value


def _through_litellm(messages: list[dict], *, tools=None, compaction=False) -> tuple[list[str], list[dict], dict]:
    """arbor/echo called by litellm as a custom provider (`llm/custom.py`), read by the seam's own reader."""
    litellm = llm.litellm_module()
    extra = {"tools": tools} if tools else {}
    if compaction:
        extra["arbor_compaction"] = True
    state, tokens = llm._StreamState(), []
    for chunk in litellm.completion(model="arbor/echo", messages=messages, stream=True,
                                    stream_options={"include_usage": True}, **extra):
        if token := llm._absorb(state, chunk):
            tokens.append(token)
    return tokens, state.items("arbor"), state.usage


def _without_call_ids(items: list[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k != "id"} for item in items]


SQL = {"type": "function", "function": {"name": "sql_query", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.parametrize(("messages", "tools", "compaction"), [
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello there  world"}], None, False),
    ([{"role": "user", "content": '#tool sql_query {"sql": "select 1"}'}], [SQL], False),
    ([{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
      {"role": "user", "content": "summarise"}], None, True),
], ids=["text", "tool call", "native compaction"])
def test_issue_34_echo_answers_the_same_called_directly_or_through_litellm(messages, tools, compaction):
    """Issue 34: the seam calls arbor/echo without litellm; litellm, once loaded, has it as a custom provider,
    and both give the same tokens, items (text, tool call, opaque compaction summary) and usage."""
    tokens, result = _direct("arbor/echo", messages, tools=tools, compaction=compaction)
    via_tokens, via_items, via_usage = _through_litellm(messages, tools=tools, compaction=compaction)
    assert tokens == via_tokens
    assert _without_call_ids(result.received) == _without_call_ids(via_items)
    assert result.usage == via_usage
    assert result.received, "an answer came"


@pytest.mark.parametrize(("question", "kind", "reason"), [
    ("please #fail", "InternalServerError", "provider_error"),
    ("please #overflow", "ContextWindowExceededError", "context_overflow"),
])
def test_issue_34_echo_failures_are_litellms_own_errors_either_way(question, kind, reason):
    """Issue 34, T1: a failing echo call raises litellm's own error (loading litellm then) whether the seam or
    litellm called it, so its failure reason is the same."""
    litellm = llm.litellm_module()
    messages = [{"role": "user", "content": question}]
    with pytest.raises(llm.LLMError) as info:
        _direct("arbor/echo", messages)
    assert info.value.reason == reason
    assert isinstance(info.value.__cause__, getattr(litellm, kind))
    with pytest.raises(getattr(litellm, kind)):
        _through_litellm(messages)


def test_issue_34_echo_embed_is_the_same_called_directly_or_through_litellm():
    """Issue 34: arbor/echo-embed's vectors are the same from the seam and from litellm's embedding call; another
    echo model is refused either way."""
    texts = ["cancel my subscription", "subscripton cancelled"]
    direct = llm.embed("arbor/echo-embed", texts)
    response = llm.litellm_module().embedding(model="arbor/echo-embed", input=texts)
    assert direct == [list(row["embedding"]) for row in response.data]
    with pytest.raises(llm.LLMError) as info:
        llm.embed("arbor/echo", texts)
    assert "not an embedding model" in info.value.message


def test_issue_34_litellm_knows_the_own_providers_registered_before_and_after_it_loaded():
    """Issue 34: `register_provider` before litellm loads (the app's start) and after it both reach litellm's
    custom provider map, one entry a provider."""
    litellm = llm.litellm_module()
    handlers = [p["custom_handler"] for p in litellm.custom_provider_map if p["provider"] == "arbor"]
    assert len(handlers) == 1 and isinstance(handlers[0], custom.OwnProviderLLM)
    assert litellm.get_llm_provider("arbor/echo")[1] == "arbor"
