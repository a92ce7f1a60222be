"""`manage.py bench_files`: the benchmark lives in `conversations.bench.files`."""

from conversations.bench.files import Command  # noqa: F401 - Django finds the command here
