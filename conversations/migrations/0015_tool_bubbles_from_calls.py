"""Issue 26: a tool bubble's card (name, arguments, state, result) is redrawn from the tree for bubbles written
before imports did so: an Arbor JSON file used to store its own bubble data, which could show a call other than
the one Approve runs. A bubble that names no call of its node keeps its place, saying so, with no buttons."""

from django.db import migrations


def _redraw(apps, schema_editor):
    from conversations.transfer.arbor_tree import call_state

    Bubble = apps.get_model("conversations", "Bubble")
    Node = apps.get_model("conversations", "Node")
    ToolApproval = apps.get_model("conversations", "ToolApproval")
    node_ids = sorted(set(Bubble.objects.filter(role="tool").values_list("node_id", flat=True)))
    for start in range(0, len(node_ids), 500):
        chunk = node_ids[start:start + 500]
        received = dict(Node.objects.filter(pk__in=chunk).values_list("id", "received"))
        results: dict[int, dict] = {}
        for parent_id, sent in Node.objects.filter(parent_id__in=chunk).values_list("parent_id", "sent"):
            results.setdefault(parent_id, {}).update(
                (item["call_id"], item) for item in sent or [] if item.get("type") == "tool_result")
        decisions = {(a.node_id, a.call_id): {"approved": a.approved, "result": a.result}
                     for a in ToolApproval.objects.filter(node_id__in=chunk)}
        for bubble in Bubble.objects.filter(node_id__in=chunk, role="tool"):
            calls = {c["id"]: c for c in received.get(bubble.node_id) or [] if c.get("type") == "tool_call"}
            call = calls.get((bubble.data or {}).get("call_id"))
            if call is None:
                bubble.data = {"call_id": (bubble.data or {}).get("call_id", ""), "name": bubble.content,
                               "arguments": "", "status": "error", "is_error": True,
                               "result": "(this bubble names no call of its node)"}
            else:
                bubble.content = call["name"]
                bubble.data = call_state(call, results.get(bubble.node_id, {}).get(call["id"]),
                                         decisions.get((bubble.node_id, call["id"])))
            bubble.save(update_fields=["content", "data"])


class Migration(migrations.Migration):
    dependencies = [("conversations", "0014_node_marked")]
    operations = [migrations.RunPython(_redraw, migrations.RunPython.noop)]
