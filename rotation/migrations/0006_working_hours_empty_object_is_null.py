"""Working hours stored as `{}` (no day listed) were read as "always", as null is; an empty
object is refused from now on (rotation/eligibility.py), so the stored ones become the null they
were read as, and the rep can still be edited."""

from django.db import migrations


def forward(apps, schema_editor):
    Rep = apps.get_model("rotation", "Rep")
    for rep in Rep.objects.filter(working_hours__isnull=False).only("pk", "working_hours").iterator():
        if rep.working_hours == {}:
            Rep.objects.filter(pk=rep.pk).update(working_hours=None)


class Migration(migrations.Migration):
    dependencies = [("rotation", "0005_account_domains_unicode")]
    operations = [migrations.RunPython(forward, migrations.RunPython.noop)]
