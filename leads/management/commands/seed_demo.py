import json
import secrets
from datetime import UTC, datetime
from decimal import Decimal

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from leads.models import ApiClient
from leads.tokens import api_client_audit_created, api_client_create, api_client_delete
from rotation import services
from rotation.models import Group, Membership, Rep, RoutingRule

ACTOR = "system:seed_demo"

GROUPS = [
    ("emea", "EMEA inbound", "round_robin", True),
    ("north-america", "North America enterprise", "weighted", False),
    ("smb", "SMB self-serve", "least_loaded", False),
]
REPS = [
    ("Ada Lovelace", "ada@example.com", "Europe/London", ["emea"]),
    ("Grace Hopper", "grace@example.com", "America/New_York", ["north-america", "smb"]),
    ("Alan Turing", "alan@example.com", "Europe/London", ["emea", "smb"]),
    ("Katherine Johnson", "katherine@example.com", "America/Chicago", ["north-america"]),
    ("Edsger Dijkstra", "edsger@example.com", "Europe/Amsterdam", ["emea"]),
    ("Barbara Liskov", "barbara@example.com", "America/New_York", ["north-america", "smb"]),
]
RULES = [
    (
        "Enterprise in North America",
        10,
        [{"field": "country", "op": "in", "value": ["US", "CA"]}, {"field": "company_size", "op": "gte", "value": 500}],
        "north-america",
    ),
    ("Small companies", 20, [{"field": "company_size", "op": "lte", "value": 50}], "smb"),
    (
        "Europe, Middle East, Africa",
        30,
        [{"field": "country", "op": "in", "value": ["GB", "FR", "DE", "NL", "BE", "ES", "IT", "AE", "ZA"]}],
        "emea",
    ),
]


class Command(BaseCommand):
    help = "Loads demo groups, reps and rules, an admin login and an API token (safe to run again)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--admin-password", default=None)
        parser.add_argument("--base-url", default="http://127.0.0.1:8000")

    def handle(self, *args: object, admin_password: str | None, base_url: str, **options: object) -> None:
        with transaction.atomic():
            for slug, name, strategy, is_default in GROUPS:
                if not Group.objects.filter(slug=slug).exists():
                    services.group_save(
                        group=Group(
                            slug=slug,
                            name=name,
                            strategy=strategy,
                            is_default=is_default,
                            sla_minutes=Decimal("30"),
                            max_attempts=3,
                        ),
                        actor=ACTOR,
                    )
            for name, email, tz, groups in REPS:
                rep = Rep.objects.filter(email=email).first() or services.rep_save(
                    rep=Rep(name=name, email=email, timezone=tz), actor=ACTOR
                )
                for slug in groups:
                    group = Group.objects.get(slug=slug)
                    if not Membership.objects.filter(group=group, rep=rep).exists():
                        weight = 2 if email.startswith(("grace", "katherine")) and slug == "north-america" else 1
                        services.membership_add(group=group, rep=rep, actor=ACTOR, weight=weight)
            for name, priority, conditions, slug in RULES:
                if not RoutingRule.objects.filter(name=name).exists():
                    services.rule_save(
                        rule=RoutingRule(
                            name=name, priority=priority, conditions=conditions, group=Group.objects.get(slug=slug)
                        ),
                        actor=ACTOR,
                    )

        User = get_user_model()
        password = admin_password or secrets.token_urlsafe(12)
        admin = User.objects.filter(username="admin").first()
        if admin is None:
            User.objects.create_superuser("admin", "admin@example.com", password)
        else:
            admin.set_password(password)
            admin.save(update_fields=["password"])

        # The demo token is replaced on every run, audited as any token created or deleted is.
        with transaction.atomic():
            for old in ApiClient.objects.filter(name="demo"):
                api_client_delete(client=old, actor=ACTOR)
            client, token = api_client_create(name="demo", scopes=["intake", "read", "manage"])
            api_client_audit_created(client=client, actor=ACTOR)

        # An address of its own each run: the data are kept from one `make run` to the next,
        # and the same address again is a duplicate of the open lead (200, not a new lead).
        email = f"jane.{secrets.token_hex(3)}@acme.example"
        curl = (
            f"curl -sS -X POST {base_url}/api/v1/leads/ -H 'Authorization: Bearer {token}' "
            "-H 'Content-Type: application/json' "
            f'-d \'{{"email": "{email}", "first_name": "Jane", "company": "Acme", "country": "FR"}}\''
        )
        if settings.LOGGING["handlers"]["console"]["formatter"] == "json":
            # One JSON object, as every other line of `make run` under LOG_FORMAT=json: a log
            # shipper reading the output takes every line. Written as it is, not through logging,
            # whose redaction would blank the curl's example address.
            line = {
                "ts": datetime.now(UTC).isoformat(timespec="milliseconds"),
                "level": "INFO",
                "logger": "seed_demo",
                "message": "Demo data loaded.",
                "request_id": "-",  # as every line outside a request
                "admin_url": f"{base_url}/admin/",
                "admin_login": "admin",
                "admin_password": password,
                "token": token,
                "token_scopes": ["intake", "read", "manage"],
                "docs_url": f"{base_url}/api/docs/",
                "curl": curl,
            }
            self.stdout.write(json.dumps(line))
            return
        self.stdout.write(self.style.SUCCESS("Demo data loaded."))
        self.stdout.write(f"Admin:  {base_url}/admin/  login admin / {password}")
        self.stdout.write(f"Token:  {token}  (scopes intake, read, manage)")
        self.stdout.write(f"Docs:   {base_url}/api/docs/")
        self.stdout.write("Post a lead:")
        self.stdout.write(f"  {curl}")
