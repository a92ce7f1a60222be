"""Writes. `head_move` is the one function that moves a conversation's head."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import F
from django.utils import timezone

from config.errors import ArborError, BadInput, NotFound
from config.together import Together, Written, together
from conversations import outbox
from conversations.errors import NotABranch, TurnInProgress
from conversations.locks import TurnLock, head_guard
from conversations.models import Bubble, Conversation, Node, Preferences, Project, ToolApproval
from conversations.selectors import conversation_has_node, history_ids, latest_tip

_NODE = Node._meta.db_table


def head_move(*, conversation: Conversation, to: int | None, lock: TurnLock | None = None) -> None:
    """Move the head (T2, T9, R3): refused while a turn lock is held, unless `lock` is that lock.

    The check and the move are one UPDATE, so a stale or concurrent caller cannot slip in between.
    A move without a lock also clears an expired one, so the turn that let it expire can no longer
    move the head when it finally ends.
    """
    if not _move(conversation, to, lock).count:
        raise TurnInProgress()


def head_move_held(*, conversation: Conversation, to: int, lock: TurnLock, release: bool = False,
                   writes: Together | None = None, when: Written | None = None) -> Written:
    """Move the head with a held turn lock; `.count` is 0 if the lock was lost meanwhile (R3). A refused move
    raises nothing and writes nothing, so what the caller wrote beside it stands.

    `release`: the turn ends with this move, so the same UPDATE gives the lock back (with the caller's
    writes: the conversation is free once the turn's last writes are committed, not before). `writes`: the
    move joins that batch (`config.together`), and happens only if `when` wrote a row."""
    return _move(conversation, to, lock, release=release, writes=writes, when=when)


def _move(conversation: Conversation, to: int | None, lock: TurnLock | None, *, release: bool = False,
          writes: Together | None = None, when: Written | None = None) -> Written:
    guard, cleared = head_guard(lock, release=release)
    changes = {"head_id": to, "version": F("version") + 1, "updated_at": timezone.now(), **cleared}
    with together(writes) as batch:
        moved = batch.update(Conversation.objects.filter(guard, pk=conversation.pk), when=when, **changes)

        def in_memory() -> None:
            if moved.count:
                conversation.head_id = to
                conversation.version += 1
                if release:  # once committed: a rollback leaves the lock held, and `release` gives it back
                    transaction.on_commit(lock.released_with_head_move)

        batch.after(in_memory)
    return moved


def head_switch(*, conversation: Conversation, node_id: Any) -> None:
    """T8: move the head to the latest tip of the branch that holds `node_id`."""
    try:
        node_id = int(node_id)
    except (TypeError, ValueError):
        raise BadInput("`node` must be a node id.") from None
    if not conversation_has_node(conversation=conversation, node_id=node_id):
        raise NotFound(f"No node {node_id} in this conversation.")
    tip = latest_tip(conversation=conversation, node_id=node_id)
    if tip is None:
        raise BadInput(f"The branch of node {node_id} has no answer to switch to.")
    with transaction.atomic():
        head_move(conversation=conversation, to=tip)


def conversation_fork(*, conversation: Conversation, node_id: Any) -> Conversation:
    """Issue 33 (P3): a new conversation of the same person whose head is `node_id`, a node of this one's tree the
    head may rest on. Nothing is copied: both go on from the same nodes, and what either adds later hangs in its
    own tree only. It keeps the source's model, instructions, retrieval settings and project."""
    try:
        node_id = int(node_id)
    except (TypeError, ValueError):
        raise BadInput("`node` must be a node id.") from None
    if not conversation_has_node(conversation=conversation, node_id=node_id):
        raise NotFound(f"No node {node_id} in this conversation.")
    if not Node.objects.can_be_head().filter(owner_id=conversation.owner_id, pk=node_id).exists():
        raise BadInput(f"Node {node_id} cannot be a conversation's head (a call under way, an overflow or a "
                       "summarising call): fork from an answer.")
    title = f"{conversation.title or 'Untitled'} (fork)"[:200]
    with transaction.atomic():
        fork = conversation_create(owner=conversation.owner, title=title, model=conversation.model,
                                   instructions=conversation.instructions, retrieval=conversation.retrieval,
                                   keep_retrieved=conversation.keep_retrieved, project=conversation.project)
        head_move(conversation=fork, to=node_id)
    return fork


def branch_mark(*, node: Node, label: str | None = None, starred: bool | None = None) -> Node:
    """Name or star the branch a turn leads (the tree map's marks, issue 16); the mark is kept on the turn's node.
    One star a conversation: starring takes it off any other. Nothing a call sent or received changes.

    Refused (NotABranch, 409, nothing changed): a side call (a title or summarising call is no branch), a node no
    longer in any conversation, and a star on a node the head cannot rest on (an overflow, a call under way).
    """
    if node.conversation_id is None:
        raise NotABranch(f"Node {node.pk} is no longer part of a conversation.")
    if node.is_side_call:
        raise NotABranch(f"Node {node.pk} is a side call (a title or a summary), not a branch.")
    if starred and not Node.objects.can_be_head().filter(pk=node.pk).exists():
        raise NotABranch(f"Node {node.pk} cannot be starred: the conversation could not open on it.")
    with transaction.atomic():
        if starred:
            Node.objects.filter(owner_id=node.owner_id, conversation_id=node.conversation_id, starred=True).exclude(
                pk=node.pk).update(starred=False)
        changes = {k: v for k, v in {"label": label, "starred": starred}.items() if v is not None}
        Node.objects.filter(pk=node.pk).update(**changes)
    node.refresh_from_db(fields=["label", "starred"])
    return node


def open_on_star(*, conversation: Conversation) -> None:
    """A conversation opened afresh opens on its starred branch: the head goes to that branch's latest tip (T8),
    unless it is there already or a turn runs (T9: then it stays where the turn is). The caller decides what
    "afresh" is (the chat page: not a page of this conversation reloading itself)."""
    star = Node.objects.of(conversation).filter(starred=True).values_list("pk", flat=True).first()
    if star is None or conversation.head_id is None or conversation.turn_running:
        return
    if star in history_ids(conversation.head_id, owner=conversation.owner_id):
        return  # on the starred branch already
    try:
        head_switch(conversation=conversation, node_id=star)
    except ArborError:
        return  # a turn began meanwhile, or the star's branch has nothing to show: the head stays


def conversation_create(*, owner, title: str = "", model: str = "", instructions: str = "", retrieval: bool = False,
                        keep_retrieved: bool = False, origin: str = Conversation.Origin.CHAT,
                        project: Project | None = None, tool_servers: list[str] | None = None) -> Conversation:
    """A new conversation; in `project` (the owner's), it starts with the project's model unless given one."""
    return Conversation.objects.create(
        owner=owner, title=title, model=model or (project and project.model) or settings.ARBOR_MODEL,
        instructions=instructions, retrieval=retrieval, keep_retrieved=keep_retrieved, origin=origin,
        project=project, tool_servers=tool_servers,
    )


# --- projects (issue 30) ------------------------------------------------------------------------------


def project_create(*, owner, name: str, instructions: str = "", model: str = "", memory: bool = True,
                   tool_servers: list[str] | None = None) -> Project:
    return Project.objects.create(owner=owner, name=name, instructions=instructions, model=model, memory=memory,
                                  tool_servers=tool_servers)


def project_update(*, project: Project, **fields: Any) -> Project:
    unknown = set(fields) - {"name", "instructions", "model", "memory", "tool_servers"}
    if unknown:
        raise BadInput(f"Unknown fields: {', '.join(sorted(unknown))}.")
    for name, value in fields.items():
        setattr(project, name, value)
    project.save()
    return project


class ProjectNotEmpty(ArborError):
    code = "project_not_empty"
    status = 409


def project_delete(*, project: Project, confirm: Any = None) -> int:
    """Delete the project with its conversations (T11 each, P3 holds: nodes another conversation needs stay), but
    only when `confirm` names how many there are: a 409 says the number otherwise, and nothing changes."""
    with transaction.atomic():
        Project.objects.select_for_update().filter(pk=project.pk).first()  # a move into it waits for this
        conversations = list(project.conversations.select_for_update())
        count = len(conversations)
        if count and str(confirm) != str(count):
            raise ProjectNotEmpty(f"This project holds {count} conversation{'s' if count != 1 else ''}; deleting "
                                  f"it deletes them too. Send confirm={count} to go on.", count=count)
        for conversation in conversations:
            conversation_delete(conversation=conversation)
        project.delete()
    return count


def conversation_update(*, conversation: Conversation, **fields: Any) -> Conversation:
    allowed = {"title", "model", "instructions", "retrieval", "keep_retrieved", "project", "tool_servers"}
    unknown = set(fields) - allowed
    if unknown:
        raise BadInput(f"Unknown fields: {', '.join(sorted(unknown))}.")
    switched = "model" in fields and fields["model"] != conversation.model
    for name, value in fields.items():
        setattr(conversation, name, value)
    with transaction.atomic():
        # An UPDATE, not save(update_fields=): a conversation deleted meanwhile is the 404 it now is (issue 26: a
        # PATCH racing a DELETE answered 503, "did not affect any rows").
        conversation.updated_at = timezone.now()
        if not Conversation.objects.filter(pk=conversation.pk).update(**fields, updated_at=conversation.updated_at):
            raise NotFound("No such conversation.")
        if switched:  # C1: the stored counts were made for the old model's tokenizer
            outbox.enqueue(kind="recount", payload={"conversation": conversation.pk, "model": conversation.model})
    return conversation


def preferences_update(*, user, instructions: str | None = None, theme: str | None = None) -> Preferences:
    """Change what is given (None leaves it as it is)."""
    changes = {k: v for k, v in {"instructions": instructions, "theme": theme}.items() if v is not None}
    preferences, _ = Preferences.objects.update_or_create(user=user, defaults=changes)
    return preferences


@transaction.atomic
def conversation_clear(*, conversation: Conversation) -> None:
    """T11: the head and the bubbles go, and no branch leads back: nothing 'deleted' is still remembered.

    The nodes are kept (nothing once written is lost) but detached from the conversation, so branch
    arrows and switch can no longer reach them.
    """
    head_move(conversation=conversation, to=None)
    keep = _nodes_others_need(conversation)
    _release_bubbles(conversation, keep)
    Node.objects.of(conversation).update(conversation=None)


def _release_bubbles(conversation: Conversation, keep: set[int]) -> None:
    """Delete the conversation's bubbles, except those of nodes another conversation still shows (P3)."""
    mine = Bubble.objects.filter(owner_id=conversation.owner_id, conversation=conversation)
    mine.exclude(node_id__in=keep).delete()
    mine.filter(node_id__in=keep).update(conversation=None)


def _protected_references(conversation: Conversation) -> list[int]:
    """This conversation's nodes that a record elsewhere protects (a playbook version's conversion
    chain and source head, say): found from the foreign keys, so this app never imports that one."""
    ids: list[int] = []
    for relation in Node._meta.get_fields(include_hidden=True):  # hidden: `related_name="+"` relations too
        if (relation.auto_created and not relation.concrete and relation.one_to_many
                and relation.on_delete is models.PROTECT and relation.related_model not in (Conversation, Node)):
            field = relation.field
            ids += relation.related_model.objects.filter(
                **{f"{field.name}__conversation": conversation}).values_list(field.attname, flat=True)
    return ids


def _nodes_others_need(conversation: Conversation) -> set[int]:
    """Nodes of this conversation that another conversation's tree or a protecting record still needs (T11, P3).

    Start where another conversation touches this one's nodes (its head on one, a node of its own hung
    below one, a compaction of its own made from one) or a record protects one, then walk up parents,
    compaction originals (C3) and the roots' summarising calls (kept for audit). Every step is an indexed
    look-up: the cost follows this conversation, not the table.
    """
    protected = _protected_references(conversation)
    protected_seeds = (f"UNION SELECT id FROM {_NODE} WHERE id IN ({', '.join(['%s'] * len(protected))})"
                       if protected else "")
    sql = f"""
    WITH RECURSIVE seeds(id) AS (
        SELECT c.head_id FROM {Conversation._meta.db_table} c JOIN {_NODE} h ON h.id = c.head_id
        WHERE h.conversation_id = %s AND c.id != %s
        {protected_seeds}
        UNION
        SELECT n.parent_id FROM {_NODE} n JOIN {_NODE} p ON p.id = n.parent_id
        WHERE p.conversation_id = %s AND (n.conversation_id IS NULL OR n.conversation_id != %s)
        UNION
        SELECT n.compacted_from_id FROM {_NODE} n JOIN {_NODE} o ON o.id = n.compacted_from_id
        WHERE o.conversation_id = %s AND (n.conversation_id IS NULL OR n.conversation_id != %s)
    ),
    edge(which) AS (SELECT 0 UNION ALL SELECT 1 UNION ALL SELECT 2),
    needed(id) AS (
        SELECT id FROM seeds
        UNION
        SELECT CASE edge.which WHEN 0 THEN x.parent_id WHEN 1 THEN x.compacted_from_id ELSE x.summary_call_id END
        FROM needed JOIN {_NODE} x ON x.id = needed.id CROSS JOIN edge
        WHERE CASE edge.which WHEN 0 THEN x.parent_id WHEN 1 THEN x.compacted_from_id ELSE x.summary_call_id END
            IS NOT NULL
    )
    SELECT n.id FROM {_NODE} n JOIN needed ON n.id = needed.id WHERE n.conversation_id = %s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [conversation.pk] * 2 + protected + [conversation.pk] * 5)
        return {row[0] for row in cursor.fetchall()}


@transaction.atomic
def conversation_delete(*, conversation: Conversation) -> None:
    """T11: delete the conversation, its bubbles and its nodes, except nodes another path needs."""
    keep = _nodes_others_need(conversation)
    head_move(conversation=conversation, to=None)  # refused while a turn runs; frees the head's node
    _release_bubbles(conversation, keep)
    # The database's deferred foreign keys check at commit that no surviving node lost its parent.
    Node.objects.of(conversation).exclude(id__in=keep).delete()
    conversation.delete()  # the kept nodes lose their creator (SET_NULL)


def approval_record(*, node_id: int, owner: int, call_id: str, approved: bool, user) -> ToolApproval:
    """`owner`: the node's (issue 34), who may not be the person deciding (staff)."""
    return ToolApproval.objects.create(node_id=node_id, owner_id=owner, call_id=call_id, approved=approved,
                                       decided_by=user)


def approval_store_result(*, node_id: int, owner: int, call_id: str, result: dict) -> None:
    ToolApproval.objects.filter(owner_id=owner, node_id=node_id, call_id=call_id).update(result=result)
