from django.apps import AppConfig


class LeadsConfig(AppConfig):
    name = "leads"
    verbose_name = "Leads"
