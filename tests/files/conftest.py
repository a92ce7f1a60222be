import pytest


@pytest.fixture(autouse=True)
def _files_in_a_temporary_place(settings, tmp_path):
    """Uploaded bytes go under the test's own directory, not var/files (Django resets its storages on the change)."""
    settings.STORAGES = {**settings.STORAGES, "default": {
        "BACKEND": "django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": str(tmp_path)}}}
