from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from rest_framework import serializers

from routing_project.api import ascii_email

from . import actions
from .admin_actions import LeadActionsAdminMixin, QueueActionsAdminMixin, admin_actor
from .admin_clients import ApiClientAdmin  # noqa: F401 - registers the API client admin
from .models import Assignment, Lead, LeadStatus, QueuedLead
from .routing import RoutingBusy


class AssignmentInline(admin.TabularInline):
    model = Assignment
    extra = 0
    can_delete = False
    fields = ("attempt", "rep", "reason", "started_at", "due_at", "accepted_at", "ended_at", "end_reason", "over_cap")
    readonly_fields = fields

    def has_add_permission(self, request: HttpRequest, obj: Lead | None = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Assignment]:
        return super().get_queryset(request).select_related("rep")


class LeadForm(forms.ModelForm):
    class Meta:
        model = Lead
        fields = actions.CONTACT_FIELDS  # the rest is read-only here

    def clean_email(self) -> str:
        """An address another open lead has is refused on the field (lead_update refuses it
        again under the lock, for an intake of that address racing this save)."""
        from .services import normalize_email

        try:
            # As intake and the API's PATCH store it: the domain in ASCII (IDNA), or the same
            # mailbox would escape dedup and be answered as no schema `email`.
            email = ascii_email(self.cleaned_data["email"])
        except serializers.ValidationError as exc:
            raise forms.ValidationError(exc.detail) from None
        normalized = normalize_email(email)
        if self.instance.pk is not None and normalized != self.instance.email_normalized:
            other = actions.open_duplicate(self.instance, normalized)
            if other is not None:
                raise forms.ValidationError(
                    "Lead %(other)s is open with this email address: close one of the two leads first.",
                    code="duplicate",
                    params={"other": other.pk},
                )
        return email


# The facts the routing decided on: read-only for everyone (a reroute moves a lead).
ROUTING_FACTS = ("country", "region", "source", "product", "score", "company_size", "external_id", "attributes")


@admin.register(Lead)
class LeadAdmin(LeadActionsAdminMixin, admin.ModelAdmin):
    list_display = ("id", "email", "company", "status", "group", "owner", "created_at", "sla_due_at", "escalations")
    list_filter = ("status", "group", "owner", "source")
    search_fields = ("email", "company", "external_id")
    list_select_related = ("group", "owner")
    date_hierarchy = "created_at"
    form = LeadForm
    inlines = [AssignmentInline]
    show_full_result_count = False
    readonly_fields = (
        "status",
        "group",
        "owner",
        "queue_reason",
        "outcome",
        "escalations",
        "created_at",
        "assigned_at",
        "accepted_at",
        "closed_at",
        "sla_due_at",
        "requested_group",
        "api_client",
        "raw_payload",
        "email_normalized",
        "manage_links",
        "trail_link",
        *ROUTING_FACTS,
    )
    fieldsets = (
        ("Contact", {"fields": ("email", "first_name", "last_name", "company", "phone")}),
        ("Routing facts", {"fields": (*ROUTING_FACTS, "requested_group")}),
        ("Routing", {"fields": ("status", "group", "owner", "queue_reason", "outcome", "escalations", "manage_links")}),
        ("Times", {"fields": ("created_at", "assigned_at", "accepted_at", "closed_at", "sla_due_at")}),
        ("Raw", {"classes": ("collapse",), "fields": ("raw_payload", "email_normalized", "api_client")}),
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # leads come in through intake, which routes them

    def has_delete_permission(self, request: HttpRequest, obj: Lead | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Lead, form: Any, change: bool) -> None:
        """Contact edits as the API makes them (leads/actions.py: lead_update): under the lead's
        lock, the email normalised again for dedup, and a lead.changed event naming the fields."""
        changes = {name: form.cleaned_data[name] for name in form.changed_data if name in actions.CONTACT_FIELDS}
        if changes:
            try:
                actions.lead_update(lead_id=obj.pk, changes=changes, actor=admin_actor(request))
            except RoutingBusy:
                # The lead was locked by a routing change (an escalation, an accept).
                request._lead_unsaved = "The lead is being changed right now; nothing was saved. Save again."  # type: ignore[attr-defined]
            except actions.LeadConflict as exc:  # an intake of the new address got there first
                request._lead_unsaved = f"Nothing was saved: {exc}"  # type: ignore[attr-defined]

    def response_change(self, request: HttpRequest, obj: Lead) -> HttpResponse:
        unsaved = getattr(request, "_lead_unsaved", None)
        if unsaved:
            self.message_user(request, unsaved, messages.ERROR)
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)


@admin.register(QueuedLead)
class QueueAdmin(QueueActionsAdminMixin, admin.ModelAdmin):
    list_display = ("id", "created_at", "email", "company", "group", "queue_reason")
    list_filter = ("group",)
    search_fields = ("email", "company")
    list_select_related = ("group",)
    ordering = ("id",)
    readonly_fields = ("email", "company", "group", "queue_reason", "created_at", "requested_group")
    fields = readonly_fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lead]:
        return super().get_queryset(request).filter(status=LeadStatus.QUEUED)

    def save_model(self, request: HttpRequest, obj: Lead, form: Any, change: bool) -> None:
        """Nothing here is editable (the actions move a queued lead). A plain save would write
        back the whole row as read, without its lock: over a drain or an assignment committed
        meanwhile, the lead would be queued again with an open assignment."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Lead | None = None) -> bool:
        return False
