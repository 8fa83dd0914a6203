from django.apps import AppConfig


class NotificationsConfig(AppConfig):
    name = "notifications"
    verbose_name = "Notifications"

    def ready(self) -> None:
        from rotation.hooks import on_group_deleting

        from .services import group_endpoints_deleted

        # A deleted group takes its webhook endpoints with it (rotation/services.py): audited.
        on_group_deleting(group_endpoints_deleted)
