"""`manage.py bench_tree_map`: the benchmark lives in `conversations.bench.tree_map`."""

from conversations.bench.tree_map import Command  # noqa: F401 - Django finds the command here
