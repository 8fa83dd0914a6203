import json
from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import ObjectDoesNotExist
from django.db import models, transaction
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html

from audit.models import AuditEvent
from audit.services import audit_record
from routing_project.admin_lists import DateRangeFilter, EstimatedCountPaginator
from security.admin_views import SuperusersOnly

from . import services
from .models import Delivery, OutboxMessage, WebhookEndpoint, url_shown


def _actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(SuperusersOnly, admin.ModelAdmin):
    """A group's webhook receivers. The signing secret is shown once (on creation and on
    rotation) and never again, like intake sources' secrets."""

    list_display = ("group", "address", "active", "unreachable_until", "secret_hint", "created_at")
    list_filter = ("active", "group")
    list_select_related = ("group",)
    search_fields = ("url", "group__slug")
    fields = (
        "group",
        "url",
        "active",
        "secret_hint",
        "secret_rotated_at",
        "old_secret_signs_until",
        "unreachable_until",
    )
    readonly_fields = ("secret_hint", "secret_rotated_at", "old_secret_signs_until", "unreachable_until")
    actions = ["rotate_secret", "revoke_previous_secrets"]
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}

    @admin.display(description="URL", ordering="url")
    def address(self, obj: WebhookEndpoint) -> str:
        # Its password masked: read over a shoulder, or on a shared screen (the edit form has it).
        return url_shown(obj.url)

    @admin.display(description="Secret")
    def secret_hint(self, obj: WebhookEndpoint) -> str:
        return f"{obj.secret[:4]}…" if obj.pk else "generated on save, shown once"

    @admin.display(description="Old secret signs until")
    def old_secret_signs_until(self, obj: WebhookEndpoint) -> Any:
        previous = services.endpoint_signing_secrets(obj)[1] if obj.pk else []
        return obj.previous_secret_expires_at if previous else self.get_empty_value_display()

    def save_model(self, request: HttpRequest, obj: WebhookEndpoint, form: Any, change: bool) -> None:
        # Where every lead's contact data is sent: who created or re-pointed it is audited.
        with transaction.atomic():
            super().save_model(request, obj, form, change)
            if change:
                fields = [f for f in form.changed_data if f in ("group", "url", "active")]
                if not fields:
                    return
                shown = {"group": obj.group.slug, "url": url_shown(obj.url)}  # its password masked
                values = {f: shown.get(f, getattr(obj, f)) for f in fields}
                explanation = {"webhook_endpoint": obj.pk, "change": "edited", "fields": values}
                if "active" in fields and not obj.active:
                    services.endpoint_stopped(endpoint_id=obj.pk, gone="deactivated")
                elif "group" in fields:
                    # Its pending deliveries carry the other group's leads: not for this receiver.
                    services.endpoint_stopped(endpoint_id=obj.pk, gone="moved to another group")
                elif "url" in fields and obj.active:
                    # The new address is tried at once, not after the old one's backoff and hold.
                    services.endpoint_repointed(endpoint_id=obj.pk)
            else:
                explanation = {
                    "webhook_endpoint": obj.pk,
                    "change": "created",
                    "url": url_shown(obj.url),
                    "active": obj.active,
                }
            audit_record(
                type=AuditEvent.Type.CLIENT_CHANGED,
                actor=_actor(request),
                group=obj.group.slug,
                explanation=explanation,
            )

    def delete_model(self, request: HttpRequest, obj: WebhookEndpoint) -> None:
        # Where the group's leads were sent: who stopped it is audited, as who created it.
        with transaction.atomic():
            explanation = {"webhook_endpoint": obj.pk, "change": "deleted", "url": url_shown(obj.url)}
            group = obj.group.slug
            services.endpoint_stopped(endpoint_id=obj.pk, gone="deleted")  # before its deliveries lose it
            super().delete_model(request, obj)
            audit_record(
                type=AuditEvent.Type.CLIENT_CHANGED, actor=_actor(request), group=group, explanation=explanation
            )

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        for endpoint in queryset.select_related("group"):
            self.delete_model(request, endpoint)

    def response_add(
        self, request: HttpRequest, obj: WebhookEndpoint, post_url_continue: str | None = None
    ) -> HttpResponse:
        return self._show(request, f"Webhook endpoint for '{obj.group}' created", [(url_shown(obj.url), obj.secret)])

    @admin.action(
        description="Rotate the signing secret (deliveries are signed under the old one too for 24 hours)",
        permissions=["change"],
    )
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> HttpResponse:
        actor = _actor(request)
        items = [
            (url_shown(endpoint.url), services.endpoint_rotate_secret(endpoint=endpoint, actor=actor))
            for endpoint in queryset
        ]
        return self._show(
            request,
            "Secrets rotated",
            items,
            note="From now on each delivery's X-Signature carries two v1 values, one under the new secret and "
            "one under the old, for 24 hours: give the receiver the new secret within that time. Then "
            '"Stop signing with the old secret" (or wait 24 hours).',
        )

    @admin.action(description="Stop signing with the old secret (after a rotation)", permissions=["change"])
    def revoke_previous_secrets(self, request: HttpRequest, queryset: QuerySet[WebhookEndpoint]) -> None:
        actor = _actor(request)
        dropped = sum(
            1 for endpoint in queryset if services.endpoint_revoke_previous_secrets(endpoint=endpoint, actor=actor)
        )
        if dropped:
            self.message_user(request, f"Deliveries to {dropped} endpoint(s) are signed with the current secret only.")
        else:
            self.message_user(request, "None of these endpoints was signing with an old secret.", messages.WARNING)

    def _show(self, request: HttpRequest, title: str, items: list[tuple[str, str]], note: str = "") -> HttpResponse:
        from security.admin_views import shown_once

        return shown_once(
            request,
            title=title,
            what="the signing secret" if len(items) == 1 else "the signing secrets",
            items=items,
            stored=f"{'It is' if len(items) == 1 else 'They are'} kept to sign deliveries, and never displayed again",
            lost="rotate it",
            back=reverse("admin:notifications_webhookendpoint_changelist"),
            note=note
            or 'Receivers check X-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>"> '
            "under this secret.",
        )


# The lead events announced to webhooks and reps (leads/notify.py).
ANNOUNCED_EVENTS = (
    "lead.assigned",
    "lead.escalated",
    "lead.rerouted",
    "lead.accepted",
    "lead.closed",
    "lead.moved_away",
)


class EventFilter(admin.SimpleListFilter):
    """By the message's event, from the events announced, not a `SELECT DISTINCT` over every
    message; any other event still filters when given in the address."""

    title = "event"
    parameter_name = "message__event"
    field = "message__event"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        events = set(ANNOUNCED_EVENTS)
        if self.value():
            events.add(str(self.value()))
        return [(event, event) for event in sorted(events)]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> QuerySet[Delivery]:
        return queryset.filter(**{self.field: self.value()}) if self.value() is not None else queryset


class MessageEventFilter(EventFilter):
    parameter_name = field = "event"


def lead_shown(message: OutboxMessage) -> str:
    """The lead a message announces, as its payload names it (the contact as sent: the outbox
    row holds it, so the list reads no lead), linked to the lead's page."""
    lead = message.payload.get("lead") if isinstance(message.payload, dict) else None
    lead = lead if isinstance(lead, dict) else {}
    name = " ".join(str(lead.get(f) or "").strip() for f in ("first_name", "last_name")).strip()
    email = str(lead.get("email") or "")
    who = f"{name} <{email}>" if name and email else name or email
    url = reverse("admin:leads_lead_change", args=[message.lead_id])
    if not who:
        return format_html('<a href="{}">#{}</a>', url, message.lead_id)
    return format_html('<a href="{}">#{}</a> {}', url, message.lead_id, who)


def _related_shown(message: OutboxMessage, name: str) -> str:
    """The message's group or rep by name. Its key has no constraint: one deleted since is
    said with the id the message names, not shown as none."""
    key = getattr(message, f"{name}_id")
    if key is None:
        return "-"
    try:
        related = getattr(message, name)  # joined by the list (list_select_related)
    except ObjectDoesNotExist:
        related = None
    return str(related) if related is not None else f"#{key} (deleted)"


def lead_id_search(queryset: Any, term: str, field: str) -> Any | None:
    """A number is a lead id, compared as a number: Django's "=lead_id" search compares the
    ids as text, which reads and converts every row (five times slower here)."""
    term = term.strip()
    # ASCII only: "²" and "①" are digits to isdigit() but no number to int().
    if term.isascii() and term.isdigit() and int(term) < 2**63:
        return queryset.filter(**{field: int(term)})
    return None


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    """The delivery log: every webhook and e-mail, its attempts, status and last error."""

    list_display = (
        "id",
        "channel",
        "event",
        "lead_link",
        "target",
        "status",
        "attempts",
        "last_status_code",
        "short_error",
        "created_at",
        "next_attempt",
        "sent_at",
    )
    # Dates by range rather than a date hierarchy, whose drill-down reads every delivery's date.
    list_filter = ("status", "channel", EventFilter, ("created_at", DateRangeFilter))
    search_fields = ("=message__lead_id", "target")
    list_select_related = ("message",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    show_facets = admin.ShowFacets.NEVER  # counts per filter choice: a scan of every delivery
    readonly_fields = (
        "message",
        "channel",
        "endpoint",
        "rep",
        "target",
        "status",
        "attempts",
        "last_status_code",
        "last_error",
        "created_at",
        "last_attempt_at",
        "next_attempt",
        "sent_at",
        "payload",
    )
    fields = readonly_fields
    actions = ["send_again"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Delivery]:
        return super().get_queryset(request).select_related("message", "endpoint", "rep")

    def has_resend_permission(self, request: HttpRequest) -> bool:
        # Where the leads' contact data goes is the superusers' (they manage the endpoints).
        return bool(request.user.is_superuser)

    @admin.action(description="Send the selected failed deliveries again", permissions=["resend"])
    def send_again(self, request: HttpRequest, queryset: QuerySet[Delivery]) -> None:
        """After a receiver was down for longer than the retries lasted: a new round of attempts."""
        selected = list(queryset.values_list("id", flat=True))
        with transaction.atomic():
            again = services.deliveries_send_again(ids=selected)
        left = len(selected) - len(again)
        message = f"{len(again)} {'delivery' if len(again) == 1 else 'deliveries'} will be sent again."
        if left:
            message += (
                f" {left} left as they are: only failed deliveries are sent again, and not to an endpoint"
                " deleted, deactivated or moved to another group since."
            )
        self.message_user(request, message, messages.SUCCESS if again else messages.WARNING)

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> tuple[Any, bool]:
        by_lead = lead_id_search(queryset, search_term, "message__lead_id")
        if by_lead is not None:
            return by_lead, False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="Event", ordering="message__event")
    def event(self, obj: Delivery) -> str:
        return obj.message.event

    @admin.display(description="Lead", ordering="message__lead_id")
    def lead_link(self, obj: Delivery) -> str:
        return lead_shown(obj.message)

    @admin.display(description="Next attempt at", ordering="next_attempt_at")
    def next_attempt(self, obj: Delivery) -> datetime | str:
        # Only a pending delivery has one: a sent or failed one kept the time it was last due
        # ("next attempt at 13:05" on a delivery given up on read as a try still to come).
        pending = obj.status == Delivery.Status.PENDING and obj.next_attempt_at is not None
        return obj.next_attempt_at if pending else self.get_empty_value_display()

    @admin.display(description="Last error")
    def short_error(self, obj: Delivery) -> str:
        return obj.last_error[:80]

    @admin.display(description="Payload")
    def payload(self, obj: Delivery) -> str:
        return format_html(
            "<pre style='white-space:pre-wrap'>{}</pre>", json.dumps(obj.message.payload, indent=2, ensure_ascii=False)
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Delivery | None = None) -> bool:
        return False


@admin.register(OutboxMessage)
class OutboxMessageAdmin(admin.ModelAdmin):
    """The outbox: each lead event to announce, for which lead, group and rep, and when it was
    fanned out into deliveries."""

    list_display = ("id", "event", "lead", "group_shown", "rep_shown", "created_at", "dispatched_at")
    # Newest first, as the delivery log: what was just announced is on the first page.
    ordering = ("-id",)
    list_select_related = ("group", "rep")  # one query for the page, not one per row
    list_filter = (MessageEventFilter,)
    search_fields = ("=lead_id",)
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    show_facets = admin.ShowFacets.NEVER  # counts per filter choice: a scan of every message

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> tuple[Any, bool]:
        by_lead = lead_id_search(queryset, search_term, "lead_id")
        if by_lead is not None:
            return by_lead, False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="Lead", ordering="lead_id")
    def lead(self, obj: OutboxMessage) -> str:
        return lead_shown(obj)

    @admin.display(description="Group")
    def group_shown(self, obj: OutboxMessage) -> str:
        return _related_shown(obj, "group")

    @admin.display(description="Rep")
    def rep_shown(self, obj: OutboxMessage) -> str:
        return _related_shown(obj, "rep")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: OutboxMessage | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: OutboxMessage | None = None) -> bool:
        return False
