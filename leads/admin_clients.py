"""API clients in the admin: create a token (shown once), set scopes and rate limits, revoke."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse

from security.admin_views import SuperusersOnly, shown_once

from .models import ApiClient
from .tokens import (
    api_client_audit_created,
    api_client_create,
    api_client_delete,
    api_client_revoke,
    api_client_update,
)


def _actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


class ApiClientForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(
        choices=ApiClient.Scope.choices,
        widget=forms.CheckboxSelectMultiple,
        help_text="intake: post leads, simulate; read: leads, events, queue; manage: configuration and actions.",
    )

    class Meta:
        model = ApiClient
        fields = ("name", "scopes", "rate_limit_per_minute", "active")


@admin.register(ApiClient)
class ApiClientAdmin(SuperusersOnly, admin.ModelAdmin):
    """Only the token's SHA-256 is stored; the token itself is shown once, on creation."""

    form = ApiClientForm
    list_display = (
        "name",
        "token_prefix",
        "scope_list",
        "rate_limit_per_minute",
        "active",
        "created_at",
        "last_used_at",
    )
    list_filter = ("active",)
    search_fields = ("name", "token_prefix")
    readonly_fields = ("token_prefix", "created_at", "last_used_at", "revoked_at")
    actions = ["revoke"]

    def get_readonly_fields(self, request: HttpRequest, obj: ApiClient | None = None) -> Any:
        # A revoked token stays revoked: its client can be renamed or deleted, not switched on.
        fields = super().get_readonly_fields(request, obj)
        return (*fields, "active") if obj is not None and obj.revoked_at is not None else fields

    @admin.display(description="scopes")
    def scope_list(self, obj: ApiClient) -> str:
        return ", ".join(obj.scopes) or "-"  # "intake, read", not its JSON

    def save_model(self, request: HttpRequest, obj: ApiClient, form: Any, change: bool) -> None:
        if change:
            api_client_update(client=obj, fields=list(form.changed_data), actor=_actor(request))
            return
        client, token = api_client_create(name=obj.name, scopes=list(obj.scopes))
        if obj.rate_limit_per_minute is not None or not obj.active:
            client.rate_limit_per_minute, client.active = obj.rate_limit_per_minute, obj.active
            client.save(update_fields=["rate_limit_per_minute", "active"])
        api_client_audit_created(client=client, actor=_actor(request))
        obj.pk, obj._new_token = client.pk, token  # type: ignore[attr-defined]

    def response_add(self, request: HttpRequest, obj: ApiClient, post_url_continue: str | None = None) -> HttpResponse:
        return shown_once(
            request,
            title=f"API client '{obj.name}' created",
            what="the token",
            items=[(obj.name, obj._new_token)],  # type: ignore[attr-defined]
            stored="Only its SHA-256 is kept",
            lost="revoke it and create another",
            back=reverse("admin:leads_apiclient_changelist"),
            note="Send it as `Authorization: Bearer <token>`.",
        )

    def delete_model(self, request: HttpRequest, obj: ApiClient) -> None:
        api_client_delete(client=obj, actor=_actor(request))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApiClient]) -> None:
        for client in queryset:
            api_client_delete(client=client, actor=_actor(request))

    @admin.action(description="Revoke the selected tokens (for good)", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiClient]) -> None:
        actor = _actor(request)
        clients = list(queryset.filter(active=True))
        for client in clients:
            api_client_revoke(client=client, actor=actor)
        self.message_user(request, f"Revoked {len(clients)} token(s).", messages.SUCCESS)
