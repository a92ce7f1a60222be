"""Issue 29: people's files on an S3-compatible store (ARBOR_FILES_S3_BUCKET), against a real one: moto's server
mode, started here on a loopback port and spoken to over HTTP by django-storages and boto3, as a MinIO or AWS
bucket would be. The bytes go there once, are read back for a call and for their owner, and go when deleted."""

from __future__ import annotations

import boto3
import pytest
from moto.server import ThreadedMotoServer

from config.settings import files_storage
from conversations.jobs import worker
from files.models import StoredFile
from tests.files.test_files import png, ready, upload

pytestmark = pytest.mark.django_db

BUCKET = "arbor-files"


@pytest.fixture(scope="module")
def s3_server():
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def bucket(s3_server, settings, monkeypatch):
    for name, value in (("AWS_ACCESS_KEY_ID", "arbor-test"), ("AWS_SECRET_ACCESS_KEY", "arbor-test-secret"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    settings.STORAGES = {**settings.STORAGES, "default": files_storage(BUCKET, s3_server, "us-east-1")}
    yield client
    for key in [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]:
        client.delete_object(Bucket=BUCKET, Key=key)
    client.delete_bucket(Bucket=BUCKET)


def _keys(client) -> list[str]:
    return [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET).get("Contents", [])]


def test_x1_files_live_in_the_bucket_are_read_from_it_and_go_with_their_last_file(api, conversation, bucket):
    notes = ready(api, "notes.txt", b"Stored in a bucket.")  # the worker reads the text back from the bucket
    assert StoredFile.objects.get(pk=notes["id"]).text == "Stored in a bucket."
    picture = upload(api, "cat.png", png()).json()
    again = upload(api, "same.png", png()).json()
    keys = _keys(bucket)
    assert len(keys) == 2 and all(key.startswith("files/") for key in keys), "the same bytes once"
    head = bucket.head_object(Bucket=BUCKET, Key=StoredFile.objects.get(pk=picture["id"]).blob.name)
    assert head["ContentLength"] == len(png())

    asked = api.post(f"/api/conversations/{conversation.pk}/turns/",
                     {"content": "Read", "files": [notes["id"], picture["id"]]}, format="json")
    assert "[file notes.txt: Stored in a bucket.]" in asked.json()["answer"] and "[image cat.png]" in \
        asked.json()["answer"]
    content = api.get(f"/api/files/{picture['id']}/content/")
    assert b"".join(content.streaming_content) == png() and content["Content-Disposition"].startswith("attachment")

    assert api.delete(f"/api/files/{again['id']}/").status_code == 204
    assert len(_keys(bucket)) == 2, "another file still keeps the bytes"
    unsent = upload(api, "draft.txt", b"draft only").json()
    worker.run_due()
    assert len(_keys(bucket)) == 3
    assert api.delete(f"/api/files/{unsent['id']}/").status_code == 204
    assert len(_keys(bucket)) == 2


def test_x1_the_bucket_is_private(api, bucket, s3_server):
    """Nothing is public: an anonymous read of a stored object is refused by the store itself."""
    import httpx

    picture = upload(api, "cat.png", png()).json()
    key = StoredFile.objects.get(pk=picture["id"]).blob.name
    acl = bucket.get_object_acl(Bucket=BUCKET, Key=key)
    assert not any(grant["Grantee"].get("URI", "").endswith("AllUsers") for grant in acl["Grants"])
    assert httpx.get(f"{s3_server}/{BUCKET}/{key}").status_code == 403
