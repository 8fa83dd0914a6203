"""The models and their migrations agree: a model change committed without its migration
would leave `migrate` on a fresh database short of what the code expects."""

import io

import pytest
from django.core.management import call_command

pytestmark = pytest.mark.django_db


def test_every_model_change_has_its_migration():
    out = io.StringIO()
    try:
        call_command("makemigrations", "--check", "--dry-run", stdout=out, stderr=out)
    except SystemExit as exc:  # --check exits 1 when a migration is missing
        pytest.fail(f"models changed without a migration (exit {exc.code}):\n{out.getvalue()}")
