"""What the benchmark commands run (`manage.py bench_*`): kept apart from the product code."""
