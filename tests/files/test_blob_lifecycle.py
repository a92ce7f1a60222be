"""Issue 29 (X1, "nothing is lost"): a person's bytes are kept while a file refers to them and no longer. An upload
and a delete of the same bytes at once never leave a file without its bytes; `files_sweep` deletes bytes nothing
refers to (an import that rolled back, a process killed between storing and recording), never young ones."""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import connection

from files import services
from files.models import StoredFile
from tests.conversations.helpers import command_output
from tests.files.test_files import png


@pytest.mark.django_db(transaction=True)
def test_x1_an_upload_and_a_delete_of_the_same_bytes_at_once_never_lose_them():
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has one writer at a time: the two cannot interleave")
    user = get_user_model().objects.create_user("racer", password="pw-racer-12345")
    data = png(3, 3)
    errors: list[BaseException] = []

    def upload_and_delete(rounds: int) -> None:
        try:
            for _ in range(rounds):
                stored = services.file_upload(user=user, name="dot.png", data=data)
                services.file_delete(user=user, file_id=stored.pk)
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)
        finally:
            connection.close()

    def keep_one(rounds: int) -> None:
        try:
            for _ in range(rounds):
                stored = services.file_upload(user=user, name="kept.png", data=data)
                assert default_storage.exists(stored.blob.name), "a file just recorded has its bytes"
                services.file_delete(user=user, file_id=stored.pk)
        except BaseException as error:  # noqa: BLE001
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=upload_and_delete, args=(25,)), threading.Thread(target=keep_one, args=(25,))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    for stored in StoredFile.objects.filter(owner=user):
        assert default_storage.exists(stored.blob.name)


@pytest.mark.django_db
def test_x1_files_sweep_deletes_old_bytes_nothing_refers_to_and_nothing_else(user):
    kept = services.file_upload(user=user, name="kept.png", data=png(2, 2))
    old_orphan = default_storage.save(f"files/{user.pk}/{'a' * 64}", ContentFile(b"left by a rolled-back import"))
    young_orphan = default_storage.save(f"files/{user.pk}/{'b' * 64}", ContentFile(b"an upload under way"))
    an_hour_ago = time.time() - 7200
    os.utime(default_storage.path(old_orphan), (an_hour_ago, an_hour_ago))
    os.utime(default_storage.path(kept.blob.name), (an_hour_ago, an_hour_ago))
    output = command_output("files_sweep")
    assert f"deleted {old_orphan}" in output and "1 unreferenced blob deleted" in output
    assert not default_storage.exists(old_orphan)
    assert default_storage.exists(young_orphan) and default_storage.exists(kept.blob.name)
