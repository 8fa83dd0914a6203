"""manage.py grant_app_role ROLE: the privileges the application's own database role needs, and
no more on the audit trail. Run as the tables' owner after each `migrate` (docker-compose.yml's
`migrate` service does), the application then connects as ROLE: it reads and writes every table
but may only read and add audit events. The triggers refuse UPDATE, DELETE and TRUNCATE of the
trail for any role (audit/migrations), but a role that owns the table can drop them; this role
owns nothing and holds no such privilege, so the trail is append-only for it whatever it runs."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import DatabaseError, connection, transaction

from audit.models import AuditEvent


class Command(BaseCommand):
    help = (
        "Grants ROLE what the application needs (every table but the audit trail read and written; the audit "
        "trail read and added to only). PostgreSQL; run as the tables' owner after migrate."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("role")

    def handle(self, *args: Any, role: str, **options: Any) -> None:
        if connection.vendor != "postgresql":
            raise CommandError("grant_app_role is for PostgreSQL: the embedded SQLite has no roles.")
        quote = connection.ops.quote_name
        audit = AuditEvent._meta.db_table
        try:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", [role])
                found = cursor.fetchone()
                if found is None:
                    raise CommandError(
                        f"No database role {role!r}: create it first (CREATE ROLE ... LOGIN PASSWORD ...)."
                    )
                if found[0]:
                    raise CommandError(
                        f"{role!r} is a superuser: it bypasses every privilege; give the app a plain role."
                    )
                cursor.execute(
                    "SELECT tableowner FROM pg_tables WHERE schemaname = current_schema() AND tablename = %s", [audit]
                )
                owner = cursor.fetchone()
                if owner is not None and owner[0] == role:
                    raise CommandError(f"{role!r} owns the tables: an owner may drop the audit trail's triggers.")
                cursor.execute("SELECT current_schema()")
                (schema,) = cursor.fetchone()
                cursor.execute(f"GRANT USAGE ON SCHEMA {quote(schema)} TO {quote(role)}")
                cursor.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s ORDER BY tablename", [schema])
                tables = [name for (name,) in cursor.fetchall()]
                for table in tables:
                    cursor.execute(f"REVOKE ALL ON {quote(table)} FROM {quote(role)}")
                    privileges = "SELECT, INSERT" if table == audit else "SELECT, INSERT, UPDATE, DELETE"
                    cursor.execute(f"GRANT {privileges} ON {quote(table)} TO {quote(role)}")
                cursor.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {quote(schema)} TO {quote(role)}")
        except DatabaseError as exc:
            raise CommandError(f"cannot grant {role!r}: {exc}") from exc
        self.stdout.write(f"{role}: {len(tables)} tables, the audit trail read and added to only.")
