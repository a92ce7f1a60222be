"""`manage.py bench_push`: the benchmark lives in `conversations.bench.push`."""

from conversations.bench.push import Command  # noqa: F401 - Django finds the command here
