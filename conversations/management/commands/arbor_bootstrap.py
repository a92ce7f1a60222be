"""Make the first user (and their API token) for the quick start, and the sample sales database.

`--migrate` first applies the migrations the database lacks, in this same process: `scripts/start` paid a
Python start-up of its own for a `migrate` that, on every start but the first, had nothing to do (issue 34).
"""

from __future__ import annotations

import os
import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.migrations.executor import MigrationExecutor
from rest_framework.authtoken.models import Token

from conversations.tools.sales_db import ensure_sales_db


class Command(BaseCommand):
    help = "Create the first user (a superuser) if there is none, and say how to log in."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="arbor")
        parser.add_argument("--migrate", action="store_true",
                            help="first apply unapplied migrations (`migrate` runs only when there are some)")

    def handle(self, *args, username: str, migrate: bool, **options):
        if migrate and unapplied_migrations():
            call_command("migrate", interactive=False, verbosity=options["verbosity"], stdout=self.stdout,
                         stderr=self.stderr)
        ensure_sales_db()
        users = get_user_model()
        password_file = settings.BASE_DIR / "var" / "first-user-password.txt"
        if not users.objects.filter(username=username).exists():
            password = secrets.token_urlsafe(12)
            users.objects.create_superuser(username=username, email="", password=password)
            password_file.write_text(password + "\n")
            password_file.chmod(0o600)
        user = users.objects.get(username=username)
        token, _ = Token.objects.get_or_create(user=user)
        password = password_file.read_text().strip() if password_file.exists() else "(set by you earlier)"
        # The address the app is served at (scripts/start passes its HOST and PORT).
        host, port = os.environ.get("HOST", "127.0.0.1"), os.environ.get("PORT", "8000")
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}"
        self.stdout.write(
            f"\nArbor is starting at {url}/\n"
            f"  Chat:   open {url}/ and sign in as {username!r} with password {password!r}"
            f" (kept in {password_file})\n"
            f"  Staff:  {url}/admin/ (the same account) shows every conversation's tree\n"
            f"  API:    token {token.key}\n"
            f"          curl -H 'Authorization: Token {token.key}' {url}/api/conversations/\n"
            f"          {url}/api/docs/ describes every endpoint\n"
            f"  Model:  {settings.ARBOR_MODEL}\n"
        )


def unapplied_migrations(database: str = DEFAULT_DB_ALIAS) -> list[str]:
    """The migrations `migrate` would apply (`app.name`), read from the migration files and the database's
    django_migrations table: tens of milliseconds, against seconds for a `migrate` with nothing to do."""
    executor = MigrationExecutor(connections[database])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    return [f"{migration.app_label}.{migration.name}" for migration, _ in plan]
