from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from routing_project.admin_forms import STRICT_JSON
from security.admin_views import SuperusersOnly, shown_once

from . import services
from .models import IntakeSource, field_map_problems


def _actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


class IntakeSourceForm(forms.ModelForm):
    class Meta:
        model = IntakeSource
        fields = ("slug", "name", "field_map", "active", "rate_limit_per_minute")

    def clean_field_map(self) -> Any:
        value = self.cleaned_data.get("field_map") or {}
        problems = field_map_problems(value)
        if problems:
            raise forms.ValidationError(problems)
        return value


@admin.register(IntakeSource)
class IntakeSourceAdmin(SuperusersOnly, admin.ModelAdmin):
    formfield_overrides = STRICT_JSON
    """Web forms allowed to post signed leads. The secret is shown once (on creation and on
    rotation) and never again."""

    form = IntakeSourceForm
    list_display = ("slug", "name", "secret_prefix", "active", "rate_limit_per_minute", "last_used_at")
    list_filter = ("active",)
    search_fields = ("slug", "name")
    readonly_fields = ("secret_prefix", "secret_rotated_at", "previous_secret_expires_at", "created_at", "last_used_at")
    actions = ["rotate_secret", "revoke_previous_secrets"]

    def save_model(self, request: HttpRequest, obj: IntakeSource, form: Any, change: bool) -> None:
        if change:
            services.source_update(source=obj, fields=list(form.changed_data), actor=_actor(request))
            return
        source, secret = services.source_create(
            slug=obj.slug,
            name=obj.name,
            actor=_actor(request),
            field_map=obj.field_map,
            rate_limit_per_minute=obj.rate_limit_per_minute,
            active=obj.active,
        )
        obj.pk, obj._new_secret = source.pk, secret  # type: ignore[attr-defined]

    def response_add(
        self, request: HttpRequest, obj: IntakeSource, post_url_continue: str | None = None
    ) -> HttpResponse:
        return shown_once(
            request,
            title=f"Intake source '{obj.slug}' created",
            what="the signing secret",
            items=[(obj.slug, obj._new_secret)],  # type: ignore[attr-defined]
            stored="It is kept to verify signatures, and never displayed again",
            lost="rotate it",
            back=reverse("admin:hooks_intakesource_changelist"),
            note=f"The form posts to /api/v1/hooks/{obj.slug}/ with X-Signature: t=<unix seconds>,"
            'v1=<hex HMAC-SHA256 of "<t>.<raw body>">.',
        )

    def delete_model(self, request: HttpRequest, obj: IntakeSource) -> None:
        services.source_delete(source=obj, actor=_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[IntakeSource]) -> None:
        for source in queryset:
            services.source_delete(source=source, actor=_actor(request))

    @admin.action(description="Rotate the secret (the old one stays valid for 24 hours)", permissions=["change"])
    def rotate_secret(self, request: HttpRequest, queryset: QuerySet[IntakeSource]) -> HttpResponse:
        actor = _actor(request)
        items = [(source.slug, services.source_rotate_secret(source=source, actor=actor)) for source in queryset]
        return shown_once(
            request,
            title="Secrets rotated",
            what="the new secret" if len(items) == 1 else "the new secrets",
            items=items,
            stored=f"{'It is' if len(items) == 1 else 'They are'} kept to verify signatures, and never displayed again",
            lost="rotate again",
            back=reverse("admin:hooks_intakesource_changelist"),
            note="Signatures made with the previous secret are accepted for 24 more hours. If it leaked, "
            '"Revoke the old secrets now" ends that at once.',
        )

    @admin.action(description="Revoke the old secrets now (after a leak)", permissions=["change"])
    def revoke_previous_secrets(self, request: HttpRequest, queryset: QuerySet[IntakeSource]) -> None:
        actor = _actor(request)
        revoked = sum(1 for source in queryset if services.source_revoke_previous_secrets(source=source, actor=actor))
        if revoked:
            self.message_user(request, f"{revoked} source(s) now accept signatures under their current secret only.")
        else:
            self.message_user(request, "None of these sources had an old secret still valid.", messages.WARNING)
