from django.apps import AppConfig


class SecurityConfig(AppConfig):
    name = "security"
    verbose_name = "Security"

    def ready(self) -> None:
        from django.contrib import admin
        from django.db.models.signals import post_migrate

        from . import login, roles

        admin.site.login_form = login.ThrottledAdminAuthenticationForm  # says when a login is locked

        # Models added after the roles migration get their permissions into the roles too.
        post_migrate.connect(roles.roles_sync_after_migrate, dispatch_uid="security.roles_sync")
