"""`manage.py bench_gateway`: the benchmark lives in `conversations.bench.gateway`."""

from conversations.bench.gateway import Command  # noqa: F401 - Django finds the command here
