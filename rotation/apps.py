from django.apps import AppConfig


class RotationConfig(AppConfig):
    name = "rotation"
    verbose_name = "Routing configuration"
