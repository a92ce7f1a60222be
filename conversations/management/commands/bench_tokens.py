"""`manage.py bench_tokens`: the benchmark lives in `conversations.bench.tokens`."""

from conversations.bench.tokens import Command  # noqa: F401 - Django finds the command here
