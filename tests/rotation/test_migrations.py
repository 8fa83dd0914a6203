"""Data migrations, run on rows as an earlier version wrote them."""

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("rotation", "0012_names_on_one_line")]
AFTER = [("rotation", "0013_names_cleaned_onto_one_line")]


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def test_names_written_before_the_one_line_check_are_brought_onto_one_line():
    """A rep named with a tab (the API took it) could not be deactivated, renamed aside, until
    someone fixed the name first: every save checked it."""
    apps = migrate(BEFORE)
    try:
        Group, Rep, Rule = (apps.get_model("rotation", m) for m in ("Group", "Rep", "RoutingRule"))
        Membership, Absence = apps.get_model("rotation", "Membership"), apps.get_model("rotation", "Absence")
        group = Group.objects.create(slug="emea", name="EMEA\u202e inbound")
        tabbed = Rep.objects.create(name="Ada\tLovelace", email="ada@sales.example")
        persian = Rep.objects.create(name="\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645", email="fa@sales.example")
        blank = Rep.objects.create(name="\n\u200b", email="blank@sales.example")
        Membership.objects.create(group=group, rep=tabbed, position=0, active=False, paused_reason="off\r\nsick")
        Absence.objects.create(
            rep=tabbed, starts_at="2026-01-01T00:00Z", ends_at="2026-01-02T00:00Z", reason="holiday\x07\x1b"
        )
        Rule.objects.create(name="Big deals", priority=1, conditions=[], group=group)
        clash = Rule.objects.create(name="Big\ndeals", priority=2, conditions=[], group=group)

        apps = migrate(AFTER)
        Group, Rep, Rule = (apps.get_model("rotation", m) for m in ("Group", "Rep", "RoutingRule"))
        Membership, Absence = apps.get_model("rotation", "Membership"), apps.get_model("rotation", "Absence")
        assert Group.objects.get().name == "EMEA inbound"
        assert Rep.objects.get(pk=tabbed.pk).name == "Ada Lovelace"
        assert Rep.objects.get(pk=persian.pk).name == persian.name  # its joiner is the word's, kept
        assert Rep.objects.get(pk=blank.pk).name == f"#{blank.pk}"
        assert Membership.objects.get().paused_reason == "off sick"
        assert Absence.objects.get().reason == "holiday"
        assert Rule.objects.get(pk=clash.pk).name == f"Big deals (#{clash.pk})"
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
