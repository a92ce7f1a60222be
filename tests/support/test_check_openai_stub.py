"""The loopback OpenAI-compatible stub behaves like a real provider for litellm's real HTTP path (streams,
usage, tool calls, error bodies, time-outs): the stub every provider test relies on is itself tested."""

import pytest

from tests.support import check_openai_stub

pytestmark = pytest.mark.slow


def test_litellm_reads_the_stub_like_a_real_openai_compatible_server(capsys):
    status = check_openai_stub.main()
    printed = capsys.readouterr().out
    assert status == 0, printed
    assert "FAIL" not in printed
