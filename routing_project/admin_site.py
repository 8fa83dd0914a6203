"""The admin site: Django's, with autocomplete answers a model admin can label.

Two reps may share a name; picking one for a group or an account by name alone would be a
guess. A model admin with an `autocomplete_label(obj)` method gives the text shown in its
autocomplete results (and, through `CheckedAutocompleteMixin`, for the value already chosen).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.apps import AdminConfig
from django.contrib.admin.views.autocomplete import AutocompleteJsonView
from django.db.models import Model
from django.http import HttpRequest, HttpResponse
from django.urls import reverse


class LabelledAutocompleteJsonView(AutocompleteJsonView):
    def serialize_result(self, obj: Model, to_field_name: str) -> dict[str, Any]:
        result = super().serialize_result(obj, to_field_name)  # type: ignore[misc]  # not in django-stubs
        label = getattr(self.model_admin, "autocomplete_label", None)
        if label is not None:
            result["text"] = label(obj)
        return result


class RouterAdminSite(admin.AdminSite):
    def autocomplete_view(self, request: HttpRequest) -> HttpResponse:
        return LabelledAutocompleteJsonView.as_view(admin_site=self)(request)  # type: ignore[return-value]

    def each_context(self, request: HttpRequest) -> dict[str, Any]:
        """The sidebar lists the operations pages too (the dashboard, the import), which the
        index links above its apps: a manager working the queue reaches the dashboard from it."""
        context = super().each_context(request)
        pages = _operations_pages(request)
        if pages and "available_apps" in context:
            operations = {
                "name": "Operations",
                "app_label": "operations",
                "app_url": pages[0]["admin_url"],
                "has_module_perms": True,
                "models": pages,
            }
            context["available_apps"] = [operations, *context["available_apps"]]
        return context

    def _build_app_dict(self, request: HttpRequest, label: Any = None) -> Any:
        """Django's user groups are the admin roles (sales ops, managers, auditors): listed as
        "User roles", so the index and the sidebar do not show two "Groups", one of them the
        routing groups."""
        app_dict = super()._build_app_dict(request, label)  # type: ignore[misc]  # not in django-stubs
        for model in app_dict.get("auth", {}).get("models", []):
            if model["object_name"] == "Group":
                model["name"] = "User roles"
        return app_dict


def _operations_pages(request: HttpRequest) -> list[dict[str, Any]]:
    user = request.user
    pages = []
    if user.has_perm("leads.view_lead"):
        pages.append({"name": "Routing dashboard", "object_name": "dashboard", "admin_url": reverse("admin-dashboard")})
    if user.has_perm("leads.add_lead"):
        pages.append({"name": "Import leads (CSV)", "object_name": "import", "admin_url": reverse("admin-lead-import")})
    return pages


class RouterAdminConfig(AdminConfig):
    """Installed in place of `django.contrib.admin`: `admin.site` is a `RouterAdminSite`."""

    default_site = "routing_project.admin_site.RouterAdminSite"
