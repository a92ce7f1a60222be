"""A project as one file (issue 30): its name, instructions, model and memory, its knowledge files, and each of its
conversations as Arbor's own tree export (`arbor_tree`), streamed a conversation at a time. Importing it makes a
new project of the importer's with those conversations in it, everything checked as each part's own import is,
in one transaction: a file that cannot be read whole creates nothing."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction

from conversations import services
from conversations.models import Conversation, Project, offered_model
from conversations.transfer import arbor_tree
from conversations.transfer.chunks import json_array, json_object_start
from conversations.transfer.plan import ImportRefused, text_field
from files.models import StoredFile
from files.services import file_upload

PROJECT_FORMAT = "arbor.project"
PROJECT_VERSION = 1


def project_chunks(project: Project) -> Iterator[str]:
    """The project as JSON text, in parts: each conversation is read in its own snapshot."""
    yield json_object_start({
        "format": PROJECT_FORMAT, "version": PROJECT_VERSION,
        "project": {"name": project.name, "instructions": project.instructions, "model": project.model,
                    "memory": project.memory},
    }, "files")
    yield from json_array(_knowledge(project))
    yield ', "conversations": ['
    for index, conversation in enumerate(project.conversations.order_by("id")):
        yield ", " if index else ""
        yield from arbor_tree.tree_chunks(conversation)
    yield "]}"


def _knowledge(project: Project) -> Iterator[dict[str, Any]]:
    for stored in StoredFile.objects.filter(project=project, owner_id=project.owner_id).order_by("id"):
        with default_storage.open(stored.blob.name, "rb") as handle:
            data = base64.b64encode(handle.read()).decode()
        yield {"id": stored.pk, "name": stored.name, "content_type": stored.content_type, "data": data}


def import_project(*, owner, document: dict[str, Any]) -> tuple[Project, list[Conversation]]:
    if document.get("version") != PROJECT_VERSION:
        raise ImportRefused(f"version: this server reads version {PROJECT_VERSION} of {PROJECT_FORMAT} files.")
    meta = document.get("project")
    if not isinstance(meta, dict):
        raise ImportRefused("project: an object with the project's name and settings.")
    name = text_field(meta.get("name", ""), "project.name", limit=200, blank=False)
    conversations = document.get("conversations")
    if not isinstance(conversations, list) or len(conversations) > settings.ARBOR_IMPORT_MAX_NODES:
        raise ImportRefused("conversations: a list of Arbor tree exports.")
    nodes = sum(len(tree["nodes"]) for tree in conversations if isinstance(tree, dict)
                and isinstance(tree.get("nodes"), list))
    if nodes > settings.ARBOR_IMPORT_MAX_NODES:  # D5: the file as a whole, not each conversation alone
        raise ImportRefused(f"conversations: {nodes} nodes in all; an import holds at most "
                            f"{settings.ARBOR_IMPORT_MAX_NODES}.")
    knowledge = arbor_tree.carried_files(document)  # checked as an upload is, before anything is made
    with transaction.atomic():
        project = services.project_create(
            owner=owner, name=name, instructions=text_field(meta.get("instructions", ""), "project.instructions",
                                                            limit=20000),
            model=offered_model(text_field(meta.get("model", ""), "project.model", limit=200)) if meta.get("model")
            else "", memory=meta.get("memory") is not False)
        made = []
        for index, tree in enumerate(conversations):
            if not isinstance(tree, dict) or tree.get("format") != arbor_tree.TREE_FORMAT:
                raise ImportRefused(f"conversations[{index}]: an Arbor tree export.")
            try:
                conversation = arbor_tree.import_tree(owner=owner, document=tree)
            except ImportRefused as refused:
                raise ImportRefused(f"conversations[{index}]: {refused.message}") from None
            made.append(services.conversation_update(conversation=conversation, project=project))
        for carried in knowledge.values():  # files of the new project's own: one the person has elsewhere stays there
            file_upload(user=owner, name=carried["name"], data=carried["data"], project_id=project.pk)
    return project, made
