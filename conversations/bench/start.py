"""Issue 34's start-up time: `python manage.py bench_start`.

Starts the app the way a person does, `scripts/start` on the embedded default (SQLite, arbor/echo), and times
it from launch to *ready*: the first 200 of `GET /api/conversations/` with the token the start printed (the
server up, its URLs loaded, the database migrated, the first user made). Each start runs in a copy of the
checkout in a temp dir (its sources with their compiled `__pycache__`, this checkout's `.venv` linked in), so
its database, first user and password file are its own; the copy's `var/` starts empty.

Each round starts every tree twice: on a fresh database (`migrate` applies everything) and again on the same
database (nothing to migrate: the warm start of someone who ran it before). Trees (`--tree`, default this
checkout; give two to compare a change with what it replaces) are measured interleaved, in rotated order.
Besides the time to ready it prints when the start's output first said each step was done:

    first line  the start's first line of output (after `scripts/_venv.sh`, from the first Python process)
    bootstrap   the log-in lines printed (the first user made; migrate, when it runs, is before it)
    worker      the worker said it runs (waited for up to `--timeout` after ready)
    listening   the server said it listens

Nothing is asserted about time. A default run (one tree, 5 rounds) takes about a minute or two.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import requests
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from conversations.bench.processes import free_port

# What a copy leaves out: the environment, the data, the history and the browsers' leftovers.
_NOT_COPIED = shutil.ignore_patterns(".venv", "var", ".git", "node_modules", ".pytest_cache", ".ruff_cache",
                                     "*.cov", ".coverage*")
# The start's output lines that mark its steps (old and new scripts print them alike).
MILESTONES = {
    "bootstrap": re.compile(r"Arbor is starting at"),
    "worker": re.compile(r"worker running"),
    "listening": re.compile(r"Listening on TCP address|Uvicorn running on"),
}
_TOKEN = re.compile(r"API:\s+token (\w+)")


@dataclass
class Start:
    """One start: seconds from launch to each milestone seen, and to ready (None: not within the timeout)."""

    ready: float | None = None
    steps: dict[str, float] = field(default_factory=dict)
    output: list[str] = field(default_factory=list)


def copy_tree(source: Path, into: Path) -> Path:
    """A copy of the checkout `source` in `into`, with mtimes kept (its `.pyc` files stay valid) and a `.venv`
    (its own if it has one, else this checkout's) linked in."""
    root = into / source.name
    shutil.copytree(source, root, ignore=_NOT_COPIED, symlinks=True, copy_function=shutil.copy2)
    venv = source / ".venv" if (source / ".venv" / "bin" / "python").exists() else settings.BASE_DIR / ".venv"
    (root / ".venv").symlink_to(venv.resolve())
    return root


def _environment(port: int) -> dict[str, str]:
    """This process's environment on the embedded default: no DATABASE_URL or REDIS_URL, the copy's own key."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "ARBOR_SECRET_KEY_FILE",
                        "DJANGO_SETTINGS_MODULE", "COVERAGE_PROCESS_START"}}
    return {**env, "HOST": "127.0.0.1", "PORT": str(port), "PYTHONUNBUFFERED": "1"}


def start_once(root: Path, *, timeout: float, script: str = "scripts/start") -> Start:
    """Run `script` in the copy `root` until it answers (or `timeout` passes), then stop its process group."""
    port = free_port()
    result = Start()
    began = time.monotonic()
    process = subprocess.Popen([str(root / script)], cwd=root, env=_environment(port), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    token: list[str] = []

    def read() -> None:
        for line in process.stdout:
            at = time.monotonic() - began
            result.output.append(f"{at:6.2f}  {line.rstrip()}")
            result.steps.setdefault("first line", at)
            for name, pattern in MILESTONES.items():
                if pattern.search(line):
                    result.steps.setdefault(name, at)
            if match := _TOKEN.search(line):
                token.append(match.group(1))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        result.ready = _wait_ready(port, token, process, began=began, timeout=timeout)
        while "worker" not in result.steps and time.monotonic() - began < 2 * timeout and process.poll() is None:
            time.sleep(0.05)
    finally:
        _stop(process)
        reader.join(5)
    return result


def _wait_ready(port: int, token: list[str], process: subprocess.Popen, *, began: float,
                timeout: float) -> float | None:
    """Seconds from `began` to the first 200 of the token's conversation list; None if it never came."""
    session = requests.Session()
    while time.monotonic() - began < timeout and process.poll() is None:
        if token:
            try:
                answer = session.get(f"http://127.0.0.1:{port}/api/conversations/", timeout=5,
                                     headers={"Authorization": f"Token {token[0]}"})
                if answer.status_code == 200:
                    return time.monotonic() - began
            except requests.RequestException:
                pass  # not listening yet
        time.sleep(0.05)
    return None


def _stop(process: subprocess.Popen) -> None:
    """Stop the start and everything it started (its own session's process group)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
    # The worker or server may outlive the script by a moment: wait for the group to empty.
    for _ in range(100):
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGKILL)


def _spread(values: list[float]) -> str:
    if not values:
        return "     -"
    return f"{statistics.median(values):6.2f} s (min {min(values):.2f}, max {max(values):.2f})"


class Command(BaseCommand):
    help = "Benchmark scripts/start: seconds from launch to the first answered API call (issue 34)."

    def add_arguments(self, parser):
        parser.add_argument("--repeat", type=int, default=5, help="rounds (default 5)")
        parser.add_argument("--tree", action="append", type=Path,
                            help="a checkout to start (repeatable; default this one)")
        parser.add_argument("--warmup", type=int, default=1, help="unmeasured starts a tree first (default 1)")
        parser.add_argument("--timeout", type=float, default=180, help="seconds a start may take (default 180)")
        parser.add_argument("--verbose", action="store_true", help="print every start's timed output")

    def handle(self, *args, repeat: int, tree: list[Path] | None, warmup: int, timeout: float, verbose: bool,
               **options):
        trees = tree or [settings.BASE_DIR]
        for source in trees:
            if not (source / "scripts" / "start").exists():
                raise CommandError(f"{source} has no scripts/start")
        with tempfile.TemporaryDirectory(prefix="arbor-bench-start-") as temp:
            roots = [copy_tree(source.resolve(), Path(temp) / str(n)) for n, source in enumerate(trees)]
            for root in roots:
                for _ in range(warmup):
                    self._fresh(root)
                    start_once(root, timeout=timeout)
            samples: dict[tuple[int, str], list[Start]] = {}
            for round_number in range(repeat):
                shift = round_number % len(roots)
                for n in [*range(len(roots))][shift:] + [*range(len(roots))][:shift]:
                    self._fresh(roots[n])
                    for kind in ("fresh database", "warm"):
                        start = start_once(roots[n], timeout=timeout)
                        samples.setdefault((n, kind), []).append(start)
                        self._say(round_number, trees[n], kind, start, verbose=verbose)
        self.stdout.write(f"\n== scripts/start to the first answered API call ({repeat} rounds, "
                          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}) ==")
        for (n, kind), starts in samples.items():
            self.stdout.write(f"{trees[n]}  {kind}:")
            ready = [s.ready for s in starts if s.ready is not None]
            failed = len(starts) - len(ready)
            self.stdout.write(f"  ready      {_spread(ready)}" + (f"  ({failed} never ready)" if failed else ""))
            for step in ("first line", *MILESTONES):
                self.stdout.write(f"  {step:<10} {_spread([s.steps[step] for s in starts if step in s.steps])}")

    def _fresh(self, root: Path) -> None:
        """Empty the copy's var/ (database, sales database, first user's password; the secret key stays)."""
        var = root / "var"
        if var.exists():
            for path in var.iterdir():
                if path.name != "secret_key":
                    shutil.rmtree(path) if path.is_dir() else path.unlink()

    def _say(self, round_number: int, source: Path, kind: str, start: Start, *, verbose: bool) -> None:
        ready = f"{start.ready:.2f} s" if start.ready is not None else "never"
        steps = ", ".join(f"{name} {at:.2f}" for name, at in start.steps.items())
        self.stdout.write(f"round {round_number + 1}  {source}  {kind}: ready {ready}  ({steps})")
        if verbose or start.ready is None:
            self.stdout.write("\n".join(start.output[-40:]))
