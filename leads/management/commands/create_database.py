"""manage.py create_database: creates the PostgreSQL database DATABASE_URL names when it does not
exist yet, so that `make run` on a fresh server needs no `createdb` first. Migrations create the
tables; this, the database. Nothing to do on SQLite (the file is made on first use)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError, connection


class Command(BaseCommand):
    help = "Creates the PostgreSQL database named by DATABASE_URL if it does not exist (SQLite: nothing to do)."

    def handle(self, *args: Any, **options: Any) -> None:
        if connection.vendor != "postgresql":
            return
        name = connection.settings_dict["NAME"]
        try:
            # Django's own way in when the database may not exist: the `postgres` database.
            with connection._nodb_cursor() as cursor:
                cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
                if cursor.fetchone() is not None:
                    return
                cursor.execute(f"CREATE DATABASE {connection.ops.quote_name(name)}")
        except DatabaseError as exc:
            raise CommandError(f"cannot create database {name!r}: {exc}") from exc
        self.stdout.write(f"Created database {name!r}.")
