from django.apps import AppConfig


class LeadsConfig(AppConfig):
    name = "leads"
    verbose_name = "Leads"

    def ready(self) -> None:
        from rotation.hooks import on_capacity_freed, on_capacity_frees_at

        from .scheduling import drain_publish, drain_publish_at

        # Configuration changes that free capacity (rotation/services.py) drain the queue,
        # now or when an absence ends.
        on_capacity_freed(drain_publish)
        on_capacity_frees_at(drain_publish_at)
