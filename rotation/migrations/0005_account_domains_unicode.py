"""Account domains kept as rules and ownership compare them (rotation/domains.py): an IDNA
spelling (`xn--bcher-kva.example`) read back to Unicode, unless that domain exists already."""

from django.db import migrations


def forward(apps, schema_editor):
    from rotation.domains import domain_unicode

    Account = apps.get_model("rotation", "Account")
    for account in Account.objects.filter(domain__contains="xn--"):
        domain = domain_unicode(account.domain)
        if domain != account.domain and not Account.objects.filter(domain=domain).exists():
            Account.objects.filter(pk=account.pk).update(domain=domain)


class Migration(migrations.Migration):
    dependencies = [("rotation", "0004_admin_limits_as_the_api")]
    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
