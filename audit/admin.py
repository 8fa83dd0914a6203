import json

from django.contrib import admin
from django.http import HttpRequest
from django.utils.html import format_html

from .models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """The audit trail, read-only for everyone: no add, no change, no delete."""

    list_display = ("id", "at", "type", "actor", "lead_id", "group", "rep_id")
    list_filter = ("type", "group")
    search_fields = ("=lead_id", "=rep_id", "actor", "request_id")
    date_hierarchy = "at"
    readonly_fields = ("id", "type", "at", "actor", "lead_id", "group", "rep_id", "request_id", "pretty_explanation")
    exclude = ("explanation",)
    list_per_page = 100
    show_full_result_count = False

    @admin.display(description="Explanation")
    def pretty_explanation(self, obj: AuditEvent) -> str:
        return format_html("<pre style='white-space:pre-wrap'>{}</pre>", json.dumps(obj.explanation, indent=2))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False
