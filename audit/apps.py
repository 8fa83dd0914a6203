from typing import Any

from django.apps import AppConfig
from django.db.backends.signals import connection_created


def sqlite_audit_functions(sender: Any, connection: Any, **kwargs: Any) -> None:
    """Gives each SQLite connection the function the audit table's DELETE trigger asks
    (audit/migrations/0006_sqlite_append_only.py): whether the suite may flush the table."""
    if connection.vendor != "sqlite":
        return
    from django.conf import settings

    connection.connection.create_function(
        "leadrouter_audit_flush_allowed", 0, lambda: int(getattr(settings, "AUDIT_FLUSH_ALLOWED", False))
    )


class AuditConfig(AppConfig):
    name = "audit"
    verbose_name = "Audit trail"

    def ready(self) -> None:
        connection_created.connect(sqlite_audit_functions, dispatch_uid="audit.sqlite_audit_functions")
