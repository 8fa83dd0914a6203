"""Re-encrypts every stored secret with the first of SECRET_BOX_KEYS (after a key rotation:
put the new key first, keep the old ones until this has run, then drop them)."""

from typing import Any

from django.apps import apps
from django.core.management.base import BaseCommand
from django.db import transaction

from security.fields import SealedField


class Command(BaseCommand):
    help = "Re-encrypt the stored secrets (webhook and intake HMAC keys) with the first SECRET_BOX_KEYS key."

    def handle(self, *args: Any, **options: Any) -> None:
        total = 0
        with transaction.atomic():
            for model in apps.get_models():
                fields = [f.name for f in model._meta.concrete_fields if isinstance(f, SealedField)]
                if not fields:
                    continue
                # Their own rows, by key: a model ordered by a relation (webhook endpoints, by
                # group) would join and lock the related rows too, routing's group rows among them.
                rows = model._default_manager.select_for_update(of=("self",)).order_by("pk").only("pk", *fields)
                for obj in rows:
                    # Read plain (any key decrypts), written sealed with the first key.
                    model._default_manager.filter(pk=obj.pk).update(**{f: getattr(obj, f) for f in fields})
                    total += 1
        self.stdout.write(f"{total} rows re-encrypted.")
