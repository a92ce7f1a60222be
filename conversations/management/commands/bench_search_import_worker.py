"""`manage.py bench_search_import_worker`: the benchmark lives in `conversations.bench.search_import_worker`."""

from conversations.bench.search_import_worker import Command  # noqa: F401 - Django finds the command here
