"""`manage.py bench_start`: the benchmark lives in `conversations.bench.start`."""

from conversations.bench.start import Command  # noqa: F401 - Django finds the command here
