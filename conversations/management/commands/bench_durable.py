"""`manage.py bench_durable`: the benchmark lives in `conversations.bench.durable`."""

from conversations.bench.durable import Command  # noqa: F401 - Django finds the command here
