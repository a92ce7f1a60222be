"""`manage.py bench_retrieval`: the benchmark lives in `search.bench`."""

from search.bench import Command  # noqa: F401 - Django finds the command here
