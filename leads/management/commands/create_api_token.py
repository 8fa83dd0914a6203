from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import transaction

from leads.models import ApiClient
from leads.tokens import api_client_audit_created, api_client_create

# Who created the token, in its `client.changed` event (the admin's say `admin:<username>`).
ACTOR = "system:create_api_token"
NAME_MAX = ApiClient._meta.get_field("name").max_length or 100
RATE_LIMIT_MAX = 2**31 - 1  # the column's range (PositiveIntegerField)


class Command(BaseCommand):
    help = "Creates an API client and prints its token once (only its hash is stored)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name")
        parser.add_argument("--scopes", default="intake,read", help="Comma-separated: intake,read,manage")
        parser.add_argument(
            "--rate-limit",
            type=int,
            default=None,
            help="Requests a minute for this client (default: the API_RATE_LIMIT_PER_MINUTE setting).",
        )

    def handle(self, *args: object, name: str, scopes: str, rate_limit: int | None, **options: object) -> None:
        # Refused here with a line naming the problem, as the admin's form refuses them, rather
        # than a database traceback (or a token that can call nothing).
        if rate_limit is not None and not 1 <= rate_limit <= RATE_LIMIT_MAX:
            raise CommandError(f"--rate-limit is a number of requests a minute, from 1 to {RATE_LIMIT_MAX}.")
        name = name.strip()
        if not name or len(name) > NAME_MAX:
            raise CommandError(f"The name must be 1 to {NAME_MAX} characters.")
        scope_list = [s.strip() for s in scopes.split(",") if s.strip()]
        if not scope_list:
            raise CommandError("--scopes must name at least one of intake, read, manage.")
        if ApiClient.objects.filter(name=name).exists():
            raise CommandError(f"An API client named '{name}' exists already.")
        try:
            with transaction.atomic():
                client, token = api_client_create(name=name, scopes=scope_list, rate_limit_per_minute=rate_limit)
                api_client_audit_created(client=client, actor=ACTOR)
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(token)
