"""The conversation tree: nodes are model calls, a conversation is only a head pointer (T1, T2)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import connection, models
from django.db.models import F, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Left
from django.utils import timezone
from tree_queries.fields import TreeNodeForeignKey
from tree_queries.models import TreeNode
from tree_queries.query import TreeQuerySet

from conversations.errors import CorruptTree


def offered_model(name: str | None) -> str:
    """`name` if this deployment offers it (ARBOR_MODELS), else the default: for a model named by a file or a copied
    conversation, which may name one this deployment does not serve."""
    return name if name in settings.ARBOR_MODELS else settings.ARBOR_MODEL


class Project(models.Model):
    """Issue 30: a person's group of conversations, with instructions every call in it gets (after the person's
    own, before the conversation's) and the model a new conversation in it starts with. `memory`: whether a new
    conversation may retrieve from the project's earlier ones (R2; never across the project's border)."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="projects")
    name = models.CharField(max_length=200)
    instructions = models.TextField(blank=True)
    model = models.CharField(max_length=200, blank=True)
    memory = models.BooleanField(default=True)
    # Issue 32: the MCP servers whose tools its conversations are offered (names); null: every server there is.
    tool_servers = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        indexes = [models.Index(fields=["owner", "name"])]

    def __str__(self) -> str:
        return self.name


class Conversation(models.Model):
    class Origin(models.TextChoices):
        """Where a conversation came from, so the sidebar can tell a person's chats from the rest (issue 26)."""

        CHAT = "chat", "Chat"
        PLAYBOOK = "playbook", "Playbook"  # a playbook's run, or its edit conversation
        API = "api", "API call"  # made by a call to the OpenAI-compatible /v1 API

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    origin = models.CharField(max_length=10, choices=Origin.choices, default=Origin.CHAT)
    # OpenAI's Conversations API (/v1/conversations): the caller's metadata, and the items it added that no call
    # has sent yet; the next call of this conversation sends them first and takes them off.
    metadata = models.JSONField(default=dict, blank=True)
    pending_input = models.JSONField(default=list, blank=True)
    # Issue 30: the project it is in, if any (deleting a project is explicit: `services.project_delete`).
    project = models.ForeignKey(Project, null=True, blank=True, on_delete=models.PROTECT, related_name="conversations")
    title = models.CharField(max_length=200, blank=True)
    model = models.CharField(max_length=200)
    instructions = models.TextField(blank=True)
    # R2: search the owner's other conversations before each question and show the model the top hits,
    # for that call only unless `keep_retrieved` keeps them in later calls' context too.
    retrieval = models.BooleanField(default=False)
    keep_retrieved = models.BooleanField(default=False)
    # Issue 32: the MCP servers whose tools its calls are offered (names); null: as its project says.
    tool_servers = models.JSONField(null=True, blank=True)
    # T2: the only pointer into the tree; never a message list. PROTECT: a head is never deleted under us.
    head = models.ForeignKey("Node", null=True, blank=True, on_delete=models.PROTECT, related_name="+")
    # R3: every head move bumps the version; a running turn holds the lock until it ends or expires.
    version = models.PositiveBigIntegerField(default=0)
    turn_token = models.UUIDField(null=True, blank=True)
    turn_expires_at = models.DateTimeField(null=True, blank=True)
    # Whether the lock was last taken from a holder that let it run out (its process died): set by the
    # UPDATE that takes it, from the row as it was, so one statement tells (`locks.TurnLock.take`).
    turn_took_over = models.BooleanField(default=False)
    # How many of its owner's turns the held lock counts for (issue 33: one per model asked at once), against
    # ARBOR_MAX_CONCURRENT_TURNS_PER_USER; set by the UPDATE that takes the lock, read only while it is held.
    turn_weight = models.PositiveSmallIntegerField(default=1)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at", "-id"]
        indexes = [
            models.Index(fields=["owner", "-updated_at"]),
            # The few conversations whose lock is held: every turn counts its owner's running turns (issue 33) and
            # the sweep finds locks left behind, without reading every conversation the owner has (issue 34).
            models.Index(fields=["owner"], condition=Q(turn_token__isnull=False), name="conversation_turns_held"),
            # The conversations with retrieval on (R2): a resent list is matched against their roots too (issue 27).
            models.Index(fields=["owner"], condition=Q(retrieval=True), name="conversation_with_retrieval"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(turn_token__isnull=True) | Q(turn_expires_at__isnull=False),
                name="conversation_turn_lock_has_expiry",
            ),
        ]

    def __str__(self) -> str:
        return self.title or f"Conversation {self.pk}"

    @property
    def effective_model(self) -> str:
        """The model this conversation's calls go to: its own, or the deployment's default (ARBOR_MODEL)."""
        return self.model or settings.ARBOR_MODEL

    @property
    def turn_running(self) -> bool:
        return bool(self.turn_token and self.turn_expires_at and self.turn_expires_at > timezone.now())


# Calls made beside the conversation, never a branch's tip: a title call (R4), a summarising call hung below the
# old head, a window's root that only carries a summary into the next summarising call (C3).
SIDE_CALL = Q(kind="title") | Q(kind="compaction", parent__isnull=False) | Q(window_root=True)


class CallSettings(models.Model):
    """What calls sent beside their messages (`llm.wire_settings`: max_tokens, tools, the caller's options), kept
    once for every call that sent the same: "what the model saw" shows it, never a copy per call (issue 27)."""

    digest = models.CharField(max_length=64, primary_key=True)  # of the settings: written once, by any call
    settings = models.JSONField()

    def __str__(self) -> str:
        return self.digest[:12]


def owner_column() -> models.ForeignKey:
    """Issue 34: the person a row is of, the column a database sharded by owner (Citus, README) routes it by: written
    with the row and never changed. No constraint and no index of its own: a node outlives its conversation (T11),
    and every query that names it names the row's own key too."""
    return models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.DO_NOTHING,
                             db_constraint=False, db_index=False, related_name="+")


def _conversation_owner(conversation_id: int) -> int:
    """A row written without its owner (issue 34) takes its conversation's; the turn's own writes name it."""
    return Conversation.objects.values_list("owner_id", flat=True).get(pk=conversation_id)


def _owners_filled(rows: list, owners_of: Any, key: str) -> list:
    """Issue 34: `rows` (nodes or bubbles written in bulk) each with its owner, read in one query (`owners_of`:
    the owner of each `key` id) for those that do not name it."""
    wanted = {getattr(row, key) for row in rows if row.owner_id is None}
    if wanted:
        owners = dict(owners_of(wanted))
        for row in rows:
            if row.owner_id is None:
                row.owner_id = owners.get(getattr(row, key))
    return rows


class NodeQuerySet(TreeQuerySet):
    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list:
        def owners(ids: set) -> Any:
            return Conversation.objects.filter(pk__in=ids).values_list("pk", "owner_id")

        return super().bulk_create(_owners_filled(list(objs), owners, "conversation_id"), *args, **kwargs)

    def of(self, conversation: Conversation) -> NodeQuerySet:
        """The nodes `conversation` created, asked by its owner too (issue 34: one person's shard)."""
        return self.filter(owner_id=conversation.owner_id, conversation=conversation)

    def path_up(self, node_id: int | None, *, owner: int, history: bool = False) -> list[tuple]:
        """The path from the root down to `node_id` as rows of `PATH_COLUMNS`, in one upward recursive query.
        It stops at a compaction root (C2); with `history`, it goes on behind each root through the root's
        original (C3), for the screen and for T10.

        Not tree_queries' `ancestors()`: that builds the whole tree's table first and then filters it, so its cost
        follows the conversation's size; this walk follows the path's depth only (T5). Measured at a path of 400
        in a conversation of a few thousand nodes: 106 ms for `ancestors()`, 4 ms for this query."""
        return walk_up(_HISTORY_SQL if history else _PATH_SQL, node_id, owner)

    def can_be_head(self) -> NodeQuerySet:
        """Nodes a head may rest on: turn nodes and compaction roots (C2), never a call under way (or
        crashed), never an overflow (F2), never a summarising call."""
        return self.filter(
            Q(kind=Node.Kind.TURN) | Q(kind=Node.Kind.COMPACTION, parent__isnull=True, window_root=False)
        ).exclude(status=Node.Status.PENDING).exclude(
            status=Node.Status.FAILED, failure_reason=Node.FailureReason.CONTEXT_OVERFLOW
        )


# How much of a first question the index `node_roots_by_question` holds: a resent list's first question is found by it.
QUESTION_OPENING_CHARS = 200


class NodeKind(models.TextChoices):
    TURN = "turn"
    PLAYBOOK = "playbook"
    COMPACTION = "compaction"
    TITLE = "title"  # a side call that names the conversation (R4); never a head


class NodeStatus(models.TextChoices):
    PENDING = "pending"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class FailureReason(models.TextChoices):
    CONTEXT_OVERFLOW = "context_overflow"
    PROVIDER_ERROR = "provider_error"
    TIMEOUT = "timeout"
    RATE_LIMIT = "rate_limit"
    CANCELLED = "cancelled"
    INTERRUPTED = "interrupted"
    ROUND_LIMIT = "round_limit"


class Node(TreeNode):
    """One model call (T1)."""

    # Module-level choices, so the constraints in Meta can name their values (Kind.values is out of its scope).
    Kind, Status, FailureReason = NodeKind, NodeStatus, FailureReason

    # DO_NOTHING in Django, enforced by the database's own (deferred) foreign key: deleting a node
    # that still has a child fails the transaction instead of cascading through someone's path.
    parent = TreeNodeForeignKey(
        "self", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="children"
    )
    # The conversation that created the node. Others may pass through it (P3), so it may outlive it.
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="created_nodes"
    )
    # Issue 34: the person whose node it is, its conversation's owner (a fork, P3, is the same person's: a path never
    # crosses people), written with the node and never changed. Every hot query names it, so a database sharded by
    # owner (Citus, README) finds a path on one shard.
    owner = owner_column()
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.TURN)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    failure_reason = models.CharField(max_length=32, choices=FailureReason.choices, blank=True)
    failure_message = models.TextField(blank=True)
    # Provider-neutral items (see conversations.items): what this call added, and what it got back.
    sent = models.JSONField(default=list)
    received = models.JSONField(default=list)
    provider = models.CharField(max_length=64, blank=True)
    model = models.CharField(max_length=200, blank=True)
    usage = models.JSONField(default=dict, blank=True)
    # The system instructions this call was sent (the user's, then the conversation's). Nodes carry
    # them so "what the model saw" stays exact after someone edits their instructions.
    instructions = models.TextField(blank=True)
    # What the call sent beside its messages (max_tokens, tools, options); none for calls that kept no record of it.
    call_settings = models.ForeignKey(CallSettings, null=True, blank=True, on_delete=models.PROTECT, related_name="+",
                                      db_index=False)  # never looked up from this side
    # R2: whether this call's context kept earlier calls' retrieved items (the conversation's policy then).
    keep_ephemeral = models.BooleanField(default=False)
    # A turn's later rounds (issue 32): the node of the turn's first call, which names the turn as a /v1 response
    # (`openai.shapes.rounds_of`). None on a turn's first call. Written by the runner only, so nothing sent from
    # outside can make a call another response's round.
    first_round = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                                    related_name="later_rounds", db_index=False)
    # R2 (issue 29): the parts of each large document this call was sent, by file id, as chosen for its question
    # then (by words and, once the worker embedded the document, by meaning): "what the model saw" shows these,
    # whatever an embedding call would answer now. None: the call sent no large document.
    file_parts = models.JSONField(null=True, blank=True)
    # C3: a root that only carries one window's summary into the next window's summarising call, when a
    # history is summarised in windows; never a head, a tip or a branch (only the final root is).
    window_root = models.BooleanField(default=False)
    # A person's name for the branch that ends here, and their star: the conversation opens on its starred branch
    # (issue 16's tree map). What a person says about a node, never what was sent or received.
    # Defaults in the database too: rows written in bulk by raw SQL (a benchmark's COPY) need not name them.
    label = models.CharField(max_length=40, blank=True, default="", db_default="")
    starred = models.BooleanField(default=False, db_default=False)
    # C3: a compaction node points at the head it replaced; assembly never follows it by default.
    compacted_from = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="compactions"
    )
    # The compaction root's summarising call (kind compaction, parent = the old head), kept for audit.
    summary_call = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.DO_NOTHING, related_name="+"
    )
    # C1: this node's own items in tokens, and the whole path's down to here (a compaction root starts
    # again from its own), so the pre-call budget check costs O(new items), never O(path).
    tokens = models.PositiveIntegerField(default=0)
    path_tokens = models.PositiveBigIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = NodeQuerySet.as_manager()

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["conversation", "id"]),
            # A conversation's parentless nodes (its first questions and compaction roots): the screen's branch
            # places read them without touching every conversation's roots (issue 13).
            models.Index(fields=["conversation"], condition=Q(parent__isnull=True), name="node_conversation_roots"),
            # A person's first questions, by their opening: a resent message list (issue 27) finds the roots that
            # asked the same, however many conversations the person has (issue 34). The opening only: a question
            # may be longer than an index entry can hold. No digest: SQLite would need Django's own MD5 function
            # (which fails on a text that is not a string) to write a node, even from its command line.
            models.Index(F("owner"), Left(KT("sent__0__text"), QUESTION_OPENING_CHARS),
                         condition=Q(parent__isnull=True), name="node_roots_by_question"),
            # The few nodes a person named or starred: a chat page reads them on every load (issue 16).
            models.Index(fields=["conversation"], condition=Q(starred=True) | ~Q(label=""), name="node_marked"),
            # A turn's later rounds, by its first call (only nodes that have one are indexed).
            models.Index(fields=["first_round"], condition=Q(first_round__isnull=False), name="node_later_rounds"),
        ]
        constraints = [
            models.CheckConstraint(condition=Q(kind__in=NodeKind.values),
                                   name="node_kind_known"),
            models.CheckConstraint(
                condition=Q(status__in=NodeStatus.values), name="node_status_known"
            ),
            models.CheckConstraint(
                condition=(Q(status=NodeStatus.FAILED) & ~Q(failure_reason=""))
                | (~Q(status=NodeStatus.FAILED) & Q(failure_reason="")),
                name="node_failure_reason_iff_failed",
            ),
            models.CheckConstraint(
                condition=Q(failure_reason="") | Q(failure_reason__in=FailureReason.values),
                name="node_failure_reason_known",
            ),
            # C2, C3: a compaction node is either a root that starts a new path and points at its
            # original, or the summarising call hung below the old head (no original of its own).
            models.CheckConstraint(
                condition=~Q(kind=NodeKind.COMPACTION)
                | Q(parent__isnull=True, compacted_from__isnull=False)
                | Q(parent__isnull=False, compacted_from__isnull=True),
                name="node_compaction_root_or_summarising_call",
            ),
            # C3: only compaction nodes point at an original.
            models.CheckConstraint(
                condition=Q(kind=NodeKind.COMPACTION) | Q(compacted_from__isnull=True),
                name="node_original_only_on_compaction",
            ),
            models.CheckConstraint(
                condition=Q(summary_call__isnull=True) | Q(compacted_from__isnull=False),
                name="node_summary_call_only_on_compaction_root",
            ),
            models.CheckConstraint(condition=~Q(parent=F("id")), name="node_not_own_parent"),
        ]

    @property
    def is_side_call(self) -> bool:
        """In memory, what `SIDE_CALL` selects."""
        return self.kind == Node.Kind.TITLE or (self.kind == Node.Kind.COMPACTION
                                                and (self.parent_id is not None or self.window_root))

    def __str__(self) -> str:
        return f"{self.kind} node {self.pk} ({self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.owner_id is None and self.conversation_id is not None:  # a node is its conversation's owner's
            self.owner_id = _conversation_owner(self.conversation_id)
        super().save(*args, **kwargs)


class Preferences(models.Model):
    """A person's own settings: instructions that go before every conversation's own, and the pages' theme."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="arbor_preferences")
    instructions = models.TextField(blank=True)
    # The pages' colours: "light", "dark", or "" for the system's (prefers-color-scheme).
    theme = models.CharField(max_length=8, blank=True, default="", choices=[("", "system"), ("light", "light"),
                                                                             ("dark", "dark")])
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "preferences"

    def __str__(self) -> str:
        return f"preferences of {self.user}"


class BubbleRole(models.TextChoices):
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    ERROR = "error"


class ToolStatus(models.TextChoices):
    """Where a tool call stands, as its bubble (`data["status"]`) shows it; the label is what a person reads."""

    AWAITING_APPROVAL = "awaiting_approval", "waiting for your approval"
    APPROVED = "approved", "approved, running"
    REFUSED = "refused", "refused"
    RUNNING = "running", "running"
    DONE = "done", "done"
    ERROR = "error", "failed"


class NodeOwnedQuerySet(models.QuerySet):
    def bulk_create(self, objs: Any, *args: Any, **kwargs: Any) -> list:
        def owners(ids: set) -> Any:
            return Node.objects.filter(pk__in=ids).values_list("pk", "owner_id")

        return super().bulk_create(_owners_filled(list(objs), owners, "node_id"), *args, **kwargs)


class NodeOwned(models.Model):
    """A row that hangs off a node (a bubble, a decision on a tool call, a file a call sent) names its node's owner
    (issue 34), so it is read on that person's shard with the node. The turn's own writes name it; any other write
    that does not is given it here, read from the node."""

    owner = owner_column()

    objects = NodeOwnedQuerySet.as_manager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.owner_id is None:
            self.owner_id = Node.objects.values_list("owner_id", flat=True).get(pk=self.node_id)
        super().save(*args, **kwargs)


class Bubble(NodeOwned):
    """What a person sees: display-only, each pointing at the node it came from."""

    Role = BubbleRole  # module-level, so the constraints in Meta can name its values
    ToolStatus = ToolStatus

    # SET_NULL: a bubble of a node that another conversation's path still passes through (P3) stays
    # on that conversation's screen after its own conversation is cleared or deleted (T11).
    conversation = models.ForeignKey(
        Conversation, null=True, blank=True, on_delete=models.SET_NULL, related_name="bubbles"
    )
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="bubbles")
    role = models.CharField(max_length=16, choices=Role.choices)
    content = models.TextField(blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [models.Index(fields=["node", "id"])]
        constraints = [
            models.CheckConstraint(
                condition=Q(role__in=BubbleRole.values), name="bubble_role_known"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.role} bubble {self.pk}"


class ToolApproval(NodeOwned):
    """A person's decision on one tool call that acts on the outside world (F3)."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="approvals")
    call_id = models.CharField(max_length=200)
    approved = models.BooleanField()
    # The tool's result, written the moment it ran: an approved action never runs twice.
    result = models.JSONField(null=True, blank=True)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    decided_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["node", "call_id"], name="one_decision_per_tool_call")]

    def __str__(self) -> str:
        return f"{'approved' if self.approved else 'refused'} {self.call_id}"


class ToolServer(models.Model):
    """An MCP server staff connect in the admin (issue 32): the shape ARBOR_MCP_SERVERS takes, one row a server
    (`conversations.tools.mcp.servers` reads both and checks them by the same rules)."""

    name = models.CharField(max_length=30, unique=True, help_text="starts its tools' names: NAME__TOOL")
    command = models.JSONField(null=True, blank=True, help_text='stdio: the program and its arguments, as a list, '
                                                                'e.g. ["uvx", "mcp-server-time"]')
    env = models.JSONField(default=dict, blank=True, help_text="stdio: environment variables for the program")
    url = models.URLField(blank=True, help_text="streamable HTTP: the server's address")
    headers = models.JSONField(default=dict, blank=True, help_text="streamable HTTP: headers sent with each "
                                                                   "request (a token, say)")
    timeout = models.FloatField(null=True, blank=True, help_text="seconds a call may take (at most the tool "
                                                                  "time limit)")
    approval = models.JSONField(default=dict, blank=True, help_text='per tool, "ask" (a person approves each '
                                                                    'call) or "auto" (runs at once), over what '
                                                                    'its annotations say')
    enabled = models.BooleanField(default=True)

    def __str__(self) -> str:
        return self.name


class OutboxJob(models.Model):
    """Work to do after a turn's commit (R4), written in the same transaction as the turn."""

    class Status(models.TextChoices):
        PENDING = "pending"
        DONE = "done"
        FAILED = "failed"

    kind = models.CharField(max_length=64)
    payload = models.JSONField(default=dict)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    run_after = models.DateTimeField(auto_now_add=True)
    last_error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["status", "run_after"])]

    def __str__(self) -> str:
        return f"{self.kind} job {self.pk} ({self.status})"


class TurnRun(models.Model):
    """A turn under way or lately ended (issue 12): the key of its numbered event log, and a stop asked of it
    from any process. Its id is the turn lock's token, so one lock is one run."""

    id = models.UUIDField(primary_key=True)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="turn_runs")
    owner = owner_column()  # its conversation's (issue 34): a run and its log are read on the owner's shard
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    stop_requested = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["conversation", "-started_at"])]

    def __str__(self) -> str:
        return f"turn {self.pk} of conversation {self.conversation_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.owner_id is None:
            self.owner_id = _conversation_owner(self.conversation_id)
        super().save(*args, **kwargs)


class IdempotentRequest(models.Model):
    """A POST that starts or decides a turn, sent with an `Idempotency-Key` (issue 31, Stripe's semantics): the
    same key from the same person within a day gets this request's outcome again and never a second model call.
    `done` with `status_code` and `body`: a JSON answer to say again; `run_id`: a stream to follow again."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64)  # the request's method, path and body, hashed
    created_at = models.DateTimeField(default=timezone.now)
    done = models.BooleanField(default=False)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    body = models.JSONField(null=True, blank=True)
    run_id = models.CharField(max_length=64, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["owner", "key"], name="idempotency_key_once")]

    def __str__(self) -> str:
        return f"{self.owner_id}:{self.key}"


class UsageEntry(models.Model):
    """Issue 31: one row per call that reached a provider, unique on its node, written in the same batch as the
    node's ending, so the ledger and the tree never disagree (`manage.py usage_check` says so). It outlives the
    node and the conversation (a bill does): their ids are kept, not foreign keys."""

    node_id = models.BigIntegerField(unique=True)
    owner = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    conversation_id = models.BigIntegerField(null=True)
    project_id = models.BigIntegerField(null=True)  # the conversation's project then (issue 30)
    model = models.CharField(max_length=200)
    provider = models.CharField(max_length=64, blank=True)
    input_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    cached_tokens = models.PositiveIntegerField(default=0)
    cost_usd = models.FloatField(default=0.0)
    day = models.DateField()
    # A call that failed or was stopped after output had arrived: the provider charges for it but reports no
    # usage, so its figures are Arbor's own count of what was sent and received (`records.ledger_entry`).
    estimated = models.BooleanField(default=False)

    class Meta:
        indexes = [models.Index(fields=["owner", "day"])]

    def __str__(self) -> str:
        return f"node {self.node_id}: {self.input_tokens}+{self.output_tokens}"


class UsageBudget(models.Model):
    """Issue 31: what a person may spend a calendar month (UTC), in tokens and/or dollars; none: no limit. A turn
    that would start past it is refused (402 `budget_exceeded`) with nothing recorded."""

    owner = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_budget")
    monthly_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    monthly_cost_usd = models.FloatField(null=True, blank=True)

    def __str__(self) -> str:
        return f"budget of {self.owner_id}"


class TurnLogEntry(models.Model):
    """One numbered event of a turn (its SSE id), kept a while after the turn ends so a client can resume."""

    run = models.ForeignKey(TurnRun, on_delete=models.CASCADE, related_name="entries")
    owner = owner_column()  # its run's (issue 34), written by the log's one writer (`log_stores`)
    seq = models.PositiveIntegerField()
    type = models.CharField(max_length=32)
    data = models.JSONField(default=dict)

    class Meta:
        ordering = ["run", "seq"]
        constraints = [models.UniqueConstraint(fields=["run", "seq"], name="turn_log_entry_seq_unique")]

    def __str__(self) -> str:
        return f"{self.type} #{self.seq} of {self.run_id}"


PATH_COLUMNS = "id, parent_id, kind, status, sent, received, provider, model, tokens, path_tokens, compacted_from_id"


def _up_sql(step: str) -> str:
    """One upward recursive query from a node: its cost follows the path's depth, never the table's
    size (T5). The depth guard stops a corrupt loop instead of recursing for ever. Each step names the owner
    (issue 34: a path is one person's, so a database sharded by owner walks it on one shard)."""
    up_columns = ", ".join(f"n.{c.strip()}" for c in PATH_COLUMNS.split(","))
    return f"""
    WITH RECURSIVE path AS (
        SELECT {PATH_COLUMNS}, 0 AS depth FROM {Node._meta.db_table} WHERE id = %(node)s AND owner_id = %(owner)s
        UNION ALL
        SELECT {up_columns}, path.depth + 1
        FROM {Node._meta.db_table} n JOIN path ON n.id = {step}
        WHERE n.owner_id = %(owner)s AND path.depth < %(limit)s
    )
    SELECT {PATH_COLUMNS} FROM path ORDER BY depth DESC
    """


_PATH_SQL = _up_sql("path.parent_id")
_HISTORY_SQL = _up_sql("COALESCE(path.parent_id, path.compacted_from_id)")


def walk_up(sql: str, node_id: int | None, owner: int) -> list[tuple]:
    """Run an upward recursive query from `owner`'s node `node_id` (its parameters: `node`, `owner` and the depth
    guard `limit`); more rows than the guard allows mean a loop, a corrupt tree."""
    if node_id is None:
        return []
    limit = settings.ARBOR_PATH_DEPTH_LIMIT
    with connection.cursor() as cursor:
        cursor.execute(sql, {"node": node_id, "owner": owner, "limit": limit})
        rows = cursor.fetchall()
    if len(rows) > limit:
        raise CorruptTree(f"the path from node {node_id} is deeper than {limit} nodes: the tree has a loop")
    return rows
