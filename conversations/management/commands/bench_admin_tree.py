"""`manage.py bench_admin_tree`: the benchmark lives in `conversations.bench.admin_tree`."""

from conversations.bench.admin_tree import Command  # noqa: F401 - Django finds the command here
