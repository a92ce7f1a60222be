"""`manage.py bench_topology`: the benchmark lives in `conversations.bench.topology`."""

from conversations.bench.topology import Command  # noqa: F401 - Django finds the command here
