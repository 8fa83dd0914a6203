"""Account domains are kept without DNS's final dot from now on (rotation/domains.py): no lead
address ends with it, so an account saved as "acme.example." never matched a lead. The stored
ones lose it, unless an account of the same domain without the dot exists (then sales ops see
the pair in the admin, and the one with the dot is refused when next saved)."""

from django.db import migrations


def forward(apps, schema_editor):
    Account = apps.get_model("rotation", "Account")
    for account in Account.objects.filter(domain__endswith=".").only("pk", "domain").iterator():
        domain = account.domain.rstrip(".")
        if domain and not Account.objects.filter(domain=domain).exists():
            Account.objects.filter(pk=account.pk).update(domain=domain)


class Migration(migrations.Migration):
    dependencies = [("rotation", "0007_auto_pause_help")]
    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
