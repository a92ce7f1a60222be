"""`manage.py bench_compaction`: the benchmark lives in `conversations.bench.compaction`."""

from conversations.bench.compaction import Command  # noqa: F401 - Django finds the command here
