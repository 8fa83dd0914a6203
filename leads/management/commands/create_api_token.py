from django.core.management.base import BaseCommand, CommandError, CommandParser

from leads.models import ApiClient
from leads.tokens import api_client_create


class Command(BaseCommand):
    help = "Creates an API client and prints its token once (only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--scopes", default="intake,read", help="Comma-separated: intake,read,manage")

    def handle(self, *args: object, name: str, scopes: str, **options: object) -> None:
        if ApiClient.objects.filter(name=name).exists():
            raise CommandError(f"An API client named '{name}' exists already.")
        try:
            _client, token = api_client_create(name=name, scopes=[s.strip() for s in scopes.split(",") if s.strip()])
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(token)
