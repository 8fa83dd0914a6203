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


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)  # a CONCURRENTLY statement refuses a transaction
def test_the_trails_new_indexes_are_built_without_holding_off_intake():
    """Every routed lead writes the audit trail: a plain CREATE INDEX on it holds off every
    insert while it reads the whole trail, so intake would wait out the build and answer 503.
    On PostgreSQL the trail's indexes since 0007 are built and dropped CONCURRENTLY."""
    out = io.StringIO()
    call_command("sqlmigrate", "audit", "0007", stdout=out)
    statements = [line for line in out.getvalue().splitlines() if line.startswith(("CREATE", "DROP"))]
    assert len(statements) >= 3, out.getvalue()
    assert all("CONCURRENTLY" in line for line in statements), statements
