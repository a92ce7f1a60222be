"""`manage.py bench_assembly`: the benchmark lives in `conversations.bench.assembly`."""

from conversations.bench.assembly import Command  # noqa: F401 - Django finds the command here
