from django.apps import AppConfig


class LeadsConfig(AppConfig):
    name = "leads"
    verbose_name = "Leads"

    def ready(self) -> None:
        from rotation.hooks import on_capacity_freed

        from .scheduling import drain_publish

        # Configuration changes that free capacity (rotation/services.py) drain the queue.
        on_capacity_freed(drain_publish)
