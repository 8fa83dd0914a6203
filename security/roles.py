"""Admin roles as Django groups: what each may see and do in the admin.

- Sales ops edit the routing configuration (groups, reps, memberships, absences, rules,
  accounts), import leads from CSV, and read leads, the audit trail and the delivery log.
- Managers work the fallback queue and reassign (change leads), read the configuration and
  the audit trail.
- Auditors read everything routing-related and change nothing.

Nobody but a superuser sees API clients, intake sources or webhook endpoints (they hold
credentials), and nobody at all adds, changes or deletes audit events (the admin refuses;
PostgreSQL refuses too).
The groups are created by a migration; `roles_sync` runs again after every `migrate`, so the
permissions of models added later join the roles.
"""

from __future__ import annotations

from typing import Any

ALL = ("add", "change", "delete", "view")
VIEW = ("view",)
CONFIG_MODELS = ("group", "rep", "membership", "absence", "routingrule", "account")
# Holding credentials: superusers only.
SECRET_MODELS = {
    ("leads", "apiclient"),
    ("hooks", "intakesource"),
    ("hooks", "hookdelivery"),
    ("notifications", "webhookendpoint"),  # holds the signing secret
}

SALES_OPS = "Sales ops"
MANAGERS = "Managers"
AUDITORS = "Auditors"

# role -> [(app label, model name or "*" for every model of the app, actions)]
ROLES: dict[str, list[tuple[str, str, tuple[str, ...]]]] = {
    SALES_OPS: [
        *[("rotation", model, ALL) for model in CONFIG_MODELS],
        ("rotation", "*", VIEW),
        ("leads", "lead", ("add",)),  # the CSV import page (leads are never added one by one)
        ("leads", "*", VIEW),
        ("audit", "*", VIEW),
        ("notifications", "*", VIEW),  # the delivery log
    ],
    MANAGERS: [
        ("leads", "lead", ("view", "change")),
        ("leads", "queuedlead", ("view", "change")),
        ("leads", "*", VIEW),
        ("rotation", "*", VIEW),
        ("audit", "*", VIEW),
        ("notifications", "*", VIEW),
    ],
    AUDITORS: [
        ("leads", "*", VIEW),
        ("rotation", "*", VIEW),
        ("audit", "*", VIEW),
        ("notifications", "*", VIEW),
    ],
}


def role_codenames(role: str, models_by_app: dict[str, list[str]]) -> set[tuple[str, str]]:
    """(app label, codename) pairs the role holds, given the models each app has."""
    wanted: set[tuple[str, str]] = set()
    for app_label, model, actions in ROLES[role]:
        models = models_by_app.get(app_label, []) if model == "*" else [model]
        for name in models:
            if (app_label, name) in SECRET_MODELS:
                continue
            wanted.update((app_label, f"{action}_{name}") for action in actions)
    return wanted


def roles_sync(*, group_model: Any, permission_model: Any) -> None:
    """Creates the role groups if missing and grants them their permissions (adds only:
    permissions granted by hand are left alone, except on audit events, which are withdrawn)."""
    permissions = permission_model.objects.select_related("content_type")
    by_key = {(p.content_type.app_label, p.codename): p for p in permissions}
    models_by_app: dict[str, list[str]] = {}
    for app_label, codename in by_key:
        if codename.startswith("view_"):
            models_by_app.setdefault(app_label, []).append(codename[len("view_") :])
    for role in ROLES:
        group, _ = group_model.objects.get_or_create(name=role)
        wanted = [by_key[key] for key in sorted(role_codenames(role, models_by_app)) if key in by_key]
        group.permissions.add(*wanted)
        forbidden = [p for (app, code), p in by_key.items() if app == "audit" and not code.startswith("view_")]
        group.permissions.remove(*forbidden)


def roles_sync_after_migrate(sender: Any, **kwargs: Any) -> None:
    from django.apps import apps as global_apps

    # Once per migrate, after every app's permissions exist: on the last app's signal.
    if sender.label != list(global_apps.get_app_configs())[-1].label:
        return
    from django.contrib.auth.models import Group, Permission

    using = kwargs.get("using", "default")
    if not Permission.objects.using(using).exists():
        return
    roles_sync(group_model=Group, permission_model=Permission)
