from datetime import datetime
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import connection
from django.db.models import Count, OuterRef, Q, QuerySet, Subquery
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe
from rest_framework import serializers

from rotation.rules import COUNTRY_CODES
from routing_project.admin_lists import DateRangeFilter, EstimatedCountPaginator
from routing_project.api import ascii_email

from . import actions
from .admin_actions import LeadActionsAdminMixin, QueueActionsAdminMixin, admin_actor
from .admin_clients import ApiClientAdmin  # noqa: F401 - registers the API client admin
from .models import Assignment, Lead, LeadStatus, QueuedLead
from .routing import RoutingBusy

ASSIGNMENTS_SHOWN = 20  # a lead's page lists its latest attempts


END_REASONS = {"sla_missed": "SLA missed", "reassigned": "reassigned", "rerouted": "routed again", "closed": "closed"}


class AssignmentInline(admin.TabularInline):
    model = Assignment
    verbose_name_plural = f"assignments (the latest {ASSIGNMENTS_SHOWN}; the audit trail has them all)"
    extra = 0
    can_delete = False
    fields = (
        "attempt",
        "rep",
        "reason",
        "started_at",
        "due_at",
        "accepted_at",
        "ended_at",
        "ended_by",
        "given_over_cap",
    )
    readonly_fields = fields

    @admin.display(description="End reason")
    def ended_by(self, obj: Assignment) -> str:
        # In words: the code "sla_missed" read as a value left unrendered.
        return END_REASONS.get(obj.end_reason, obj.end_reason) or "-"

    @admin.display(description="Over cap")
    def given_over_cap(self, obj: Assignment) -> str:
        # A word where it happened, nothing elsewhere: a red cross on every ordinary turn read
        # as something having gone wrong.
        return "yes, given by hand over a cap" if obj.over_cap else "-"

    def has_add_permission(self, request: HttpRequest, obj: Lead | None = None) -> bool:
        return False

    def get_queryset(self, request: HttpRequest) -> QuerySet[Assignment]:
        # The latest attempts only: a lead moved hundreds of times made a page of every one
        # (400 rows, 870 KB, over a second); the audit trail, linked above, has them all.
        later = (
            Assignment.objects.filter(lead=OuterRef("lead"), attempt__gt=OuterRef("attempt"))
            .values("lead")
            .annotate(n=Count("id"))
            .values("n")[:1]
        )
        recent = Q(later__isnull=True) | Q(later__lt=ASSIGNMENTS_SHOWN)
        return super().get_queryset(request).alias(later=Subquery(later)).filter(recent).select_related("rep")


# What a lead's page edits: the contact fields and the routing facts a manager may correct.
ADMIN_EDITABLE = (*actions.CONTACT_FIELDS, *actions.SCALAR_FACTS)


class LeadForm(forms.ModelForm):
    class Meta:
        model = Lead
        fields = ADMIN_EDITABLE  # the rest is read-only here

    def clean_country(self) -> str:
        """As intake and the API's PATCH take it: an ISO 3166-1 alpha-2 code, upper-cased."""
        value = self.cleaned_data["country"] or ""
        code = value.strip().upper() if value.isascii() else "?"
        if code and code not in COUNTRY_CODES:
            raise forms.ValidationError(
                "'%(value)s' is not an ISO 3166-1 alpha-2 country code.", params={"value": value}
            )
        return code

    def clean_score(self) -> int | None:
        score = self.cleaned_data["score"]
        if score is not None and score > 100:
            raise forms.ValidationError("A score is 0 to 100.")
        return score  # type: ignore[no-any-return]

    def clean_company_size(self) -> int | None:
        size = self.cleaned_data["company_size"]
        if size is not None and size > 10_000_000:
            raise forms.ValidationError("At most 10,000,000.")
        return size  # type: ignore[no-any-return]

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


# How many of the newest leads the source filter takes its choices from.
SOURCE_LOOKBACK = 10_000


class SourceFilter(admin.SimpleListFilter):
    """By source. The choices are the sources of the newest SOURCE_LOOKBACK leads (read back
    through the primary key), not a `SELECT DISTINCT source` over every lead; an older source
    still filters when given in the address (`?source=...`)."""

    title = "source"
    parameter_name = "source"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        with connection.cursor() as cursor:  # the newest rows through the primary key, then their sources
            cursor.execute(
                f"SELECT DISTINCT source FROM (SELECT source FROM {Lead._meta.db_table}"  # noqa: S608 - no input
                " ORDER BY id DESC LIMIT %s) newest",
                [SOURCE_LOOKBACK],
            )
            sources = {row[0] for row in cursor.fetchall()}
        sources.discard("")
        if self.value():
            sources.add(self.value())
        return [(source, source) for source in sorted(sources)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Lead]) -> QuerySet[Lead]:
        return queryset.filter(source=self.value()) if self.value() is not None else queryset


class NoGroupFilter(admin.RelatedFieldListFilter):
    """By group, its last choice said in words: Django's "-" read as a stray dash."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.empty_value_display = mark_safe("(no group)")  # noqa: S308 - a constant


class NoOwnerFilter(admin.RelatedFieldListFilter):
    """By owner, its last choice said in words (queued or closed leads have none)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.empty_value_display = mark_safe("(no rep)")  # noqa: S308 - a constant


class LeadSearchMixin:
    """A whole address is looked up by its normalised form, through lead_dedup_idx: the search
    managers make most. Django's search compares it as a substring (`UPPER(email) LIKE`), which
    reads every lead. A term that is a lead's external id exactly finds that lead through
    lead_external_id_idx. A number (or "#41") is also a lead's id, the one the rep's e-mail and
    every page quote. Only when none of these finds a lead does the substring search over the
    address, names, company, phone and external id run (reading every lead), so a partial
    value still finds."""

    def get_search_results(self, request: HttpRequest, queryset: QuerySet[Lead], search_term: str) -> Any:
        from .services import normalize_email

        term = search_term.strip()
        if "@" in term and not term.startswith("@") and not any(c.isspace() for c in term):
            try:
                normalized = normalize_email(ascii_email(term))
            except serializers.ValidationError:
                normalized = None
            if normalized is not None:
                exact = queryset.filter(email_normalized=normalized)
                if exact.exists():
                    return exact, False
        elif term and not any(c.isspace() for c in term):
            by_id = term.removeprefix("#")
            if by_id.isascii() and by_id.isdigit() and len(by_id) <= 18:
                exact = queryset.filter(pk=int(by_id)) | queryset.filter(external_id=term)
            else:
                exact = queryset.filter(external_id=term)  # through lead_external_id_idx
            if exact.exists():
                return exact, False
        return super().get_search_results(request, queryset, search_term)  # type: ignore[misc]


def _fact(value: Any) -> str:
    """An attribute's value as written in a rule: true/false, numbers and text as they are."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# The facts the routing decided on. Managers may correct the scalar ones (the API's PATCH
# also takes attributes); the lead stays where it is until "Route again" moves it.
ROUTING_FACTS = ("country", "region", "source", "product", "score", "company_size", "external_id", "attributes_text")


@admin.register(Lead)
class LeadAdmin(LeadSearchMixin, LeadActionsAdminMixin, admin.ModelAdmin):
    # Who, where it stands, with whom and until when, first: on a laptop, beside the menu and
    # the filters, the columns past the SLA are the ones scrolled to.
    list_display = ("id", "email", "status", "owner", "sla_due", "group", "company", "created_at", "escalations")
    # Dates by range (today, past 7 days, this month, this year) rather than a date hierarchy,
    # whose drill-down reads every lead's date on each page view.
    list_filter = (
        "status",
        ("group", NoGroupFilter),
        ("owner", NoOwnerFilter),
        SourceFilter,
        ("created_at", DateRangeFilter),
    )
    search_fields = ("email", "first_name", "last_name", "company", "phone", "external_id")
    search_help_text = (
        "A lead's id (41 or #41), an e-mail address, a name, a company, a phone number or an external id."
    )
    list_select_related = ("group", "owner")
    paginator = EstimatedCountPaginator
    show_facets = admin.ShowFacets.NEVER  # counts per filter choice: a scan of every lead
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
        "external_id",
        "attributes_text",
    )
    fieldsets = (
        ("Contact", {"fields": ("email", "first_name", "last_name", "company", "phone")}),
        ("Routing facts", {"fields": (*ROUTING_FACTS, "requested_group")}),
        ("Routing", {"fields": ("status", "group", "owner", "queue_reason", "outcome", "escalations", "manage_links")}),
        ("Times", {"fields": ("created_at", "assigned_at", "accepted_at", "closed_at", "sla_due_at")}),
        ("Raw", {"classes": ("collapse",), "fields": ("raw_payload", "email_normalized", "api_client")}),
    )

    @admin.display(description="SLA due at", ordering="sla_due_at")
    def sla_due(self, obj: Lead) -> datetime | None:
        """Only while the SLA runs (assigned, not yet accepted): a closed or accepted lead's due
        time read as a deadline still pending."""
        return obj.sla_due_at if obj.status == LeadStatus.ASSIGNED else None

    @admin.display(description="Attributes")
    def attributes_text(self, obj: Lead) -> str:
        """One "key: value" a line, as a rule names them (attributes.<key>), not the JSON."""
        items = sorted((obj.attributes or {}).items())
        if not items:
            return "-"
        return format_html_join(mark_safe("<br>"), "{}: {}", ((key, _fact(value)) for key, value in items))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # leads come in through intake, which routes them

    def has_delete_permission(self, request: HttpRequest, obj: Lead | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Lead, form: Any, change: bool) -> None:
        """Contact edits as the API makes them (leads/actions.py: lead_update): under the lead's
        lock, the email normalised again for dedup, and a lead.changed event naming the fields."""
        changes = {name: form.cleaned_data[name] for name in form.changed_data if name in ADMIN_EDITABLE}
        if changes:
            try:
                actions.lead_update(lead_id=obj.pk, changes=changes, actor=admin_actor(request))
            except RoutingBusy:
                # The lead was locked by a routing change (an escalation, an accept).
                request._lead_unsaved = "The lead is being changed right now; nothing was saved. Save again."  # type: ignore[attr-defined]
            except actions.LeadConflict as exc:  # an intake of the new address got there first
                request._lead_unsaved = f"Nothing was saved: {exc}"  # type: ignore[attr-defined]

    def log_change(self, request: HttpRequest, obj: Lead, message: Any) -> Any:
        # Nothing was saved (save_model said why): the lead's history must not record the edit.
        if getattr(request, "_lead_unsaved", None):
            return None
        return super().log_change(request, obj, message)

    def response_change(self, request: HttpRequest, obj: Lead) -> HttpResponse:
        unsaved = getattr(request, "_lead_unsaved", None)
        if unsaved:
            self.message_user(request, unsaved, messages.ERROR)
            return HttpResponseRedirect(request.path)
        return super().response_change(request, obj)


@admin.register(QueuedLead)
class QueueAdmin(LeadSearchMixin, QueueActionsAdminMixin, admin.ModelAdmin):
    # Why it waits and where, before who: on a laptop the columns past these are scrolled to.
    list_display = ("id", "created_at", "group", "queue_reason", "email", "company")
    list_filter = (("group", NoGroupFilter),)
    search_fields = ("email", "first_name", "last_name", "company", "phone", "external_id")
    search_help_text = (
        "A lead's id (41 or #41), an e-mail address, a name, a company, a phone number or an external id."
    )
    list_select_related = ("group",)
    show_facets = admin.ShowFacets.NEVER  # counts per filter choice: a scan of every lead
    ordering = ("id",)
    readonly_fields = (
        "email",
        "company",
        "group",
        "queue_reason",
        "created_at",
        "requested_group",
        "manage",
        "see_also",
    )
    fields = readonly_fields[:-1]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lead]:
        return super().get_queryset(request).filter(status=LeadStatus.QUEUED)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        """Titled as the page a manager works ("Select queued lead to change" said otherwise)."""
        title = "Fallback queue: leads waiting for a rep, oldest first"
        return super().changelist_view(request, {"title": title, **(extra_context or {})})

    def has_change_permission(self, request: HttpRequest, obj: Lead | None = None) -> bool:
        """The change permission runs the list's actions; a queued lead's own page has nothing
        to save (the actions move it), so it is shown read-only, with no Save button that would
        say "changed successfully" having changed nothing."""
        return obj is None and super().has_change_permission(request)

    def get_fields(self, request: HttpRequest, obj: Lead | None = None) -> Any:
        fields = super().get_fields(request, obj)
        if super().has_change_permission(request):
            return fields
        # No "Assign…" leading to a 403; the lead's page and its trail, all the same.
        return [f if f != "manage" else "see_also" for f in fields]

    @admin.display(description="Manage")
    def manage(self, obj: Lead) -> str:
        if obj.pk is None:
            return ""
        return format_html(
            '<a class="button" href="{}">Assign…</a> <a class="button" href="{}">Close…</a> {} '
            "(route again: from the queue's actions)",
            reverse("admin:leads_lead_reassign", args=[obj.pk]),
            reverse("admin:leads_lead_close", args=[obj.pk]),
            self.see_also(obj),
        )

    @admin.display(description="See also")
    def see_also(self, obj: Lead) -> str:
        """The lead's page and its trail: in "Manage", and alone for those who only read."""
        if obj.pk is None:
            return ""
        return format_html(
            '<a href="{}">The lead\'s page</a> <a href="{}?lead_id={}">Audit trail</a>',
            reverse("admin:leads_lead_change", args=[obj.pk]),
            reverse("admin:audit_auditevent_changelist"),
            obj.pk,
        )

    def save_model(self, request: HttpRequest, obj: Lead, form: Any, change: bool) -> None:
        """Never reached (the page is read-only), and a no-op all the same: a plain save would
        write back the whole row as read, without its lock: over a drain or an assignment
        committed meanwhile, the lead would be queued again with an open assignment."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Lead | None = None) -> bool:
        return False
