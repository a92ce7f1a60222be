"""`manage.py bench_load`: the benchmark lives in `conversations.bench.load`."""

from conversations.bench.load import Command  # noqa: F401 - Django finds the command here
