"""The coverage gate for the risky modules: line coverage >= 95% and branch coverage >= 90% over them.

Reads coverage.py's JSON report (`coverage json`) and, when the gate fails, lists every uncovered line and
branch of the modules that fall short, so the next test to write is obvious. Grow RISKY, never shrink it.
"""

from __future__ import annotations

import fnmatch
import json
import sys
from pathlib import Path

RISKY = [
    "conversations/turns/runner.py",  # the one turn runner
    "conversations/turns/start.py",  # where turns start: ask, edit, regenerate, retry, decide, compact
    "conversations/turns/records.py",  # the one node recorder
    "conversations/turns/calls.py",  # open calls and approvals (F3, D4)
    "conversations/turns/streaming.py",  # a turn's events to async readers
    "conversations/locks.py",  # the one turn lock
    "conversations/services.py",  # the one head mover
    "conversations/transfer/*.py",  # imports: hostile files
    "conversations/tools/sql_query.py",  # SQL from a model
    "conversations/web/consumer.py",  # the chat socket
]
LINE_TARGET, BRANCH_TARGET = 95.0, 90.0


def main(path: str) -> int:
    files = json.loads(Path(path).read_text())["files"]
    chosen = {name: data for name, data in files.items()
              if any(fnmatch.fnmatch(name, p) for p in RISKY) and data["summary"]["num_statements"]}
    missing_modules = [p for p in RISKY if not any(fnmatch.fnmatch(n, p) for n in chosen)]
    lines = sum(d["summary"]["num_statements"] for d in chosen.values())
    lines_hit = sum(d["summary"]["covered_lines"] for d in chosen.values())
    branches = sum(d["summary"]["num_branches"] for d in chosen.values())
    branches_hit = sum(d["summary"]["covered_branches"] for d in chosen.values())
    line_pct = 100.0 * lines_hit / max(1, lines)
    branch_pct = 100.0 * branches_hit / max(1, branches)
    print(f"coverage gate: {len(chosen)} risky modules, lines {line_pct:.1f}% (>= {LINE_TARGET}), "
          f"branches {branch_pct:.1f}% (>= {BRANCH_TARGET})")
    ok = line_pct >= LINE_TARGET and branch_pct >= BRANCH_TARGET and not missing_modules
    for pattern in missing_modules:
        print(f"  {pattern}: not measured (renamed? then update RISKY)")
    for name, data in sorted(chosen.items()):
        summary = data["summary"]
        module_lines = 100.0 * summary["covered_lines"] / max(1, summary["num_statements"])
        module_branches = 100.0 * summary["covered_branches"] / max(1, summary["num_branches"])
        short = module_lines < LINE_TARGET or module_branches < BRANCH_TARGET
        print(f"  {'!' if short else ' '} {name}: lines {module_lines:.1f}%, branches {module_branches:.1f}%")
        if short and not ok:
            if data["missing_lines"]:
                print(f"      uncovered lines: {', '.join(map(str, data['missing_lines']))}")
            if data.get("missing_branches"):
                print(f"      uncovered branches: {', '.join(f'{a}->{b}' for a, b in data['missing_branches'])}")
    if not ok:
        print("coverage gate FAILED: add tests for the lines above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "var/coverage.json"))
