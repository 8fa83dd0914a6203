"""The admin roles (Sales ops, Managers, Auditors) as Django groups with their permissions."""

from django.contrib.auth.management import create_permissions
from django.db import migrations


def forward(apps, schema_editor):
    from security.roles import roles_sync

    # Permissions are normally created after migrate; the roles need them now.
    for app_config in apps.get_app_configs():
        app_config.models_module = True
        create_permissions(app_config, apps=apps, verbosity=0)
        app_config.models_module = None
    roles_sync(group_model=apps.get_model("auth", "Group"), permission_model=apps.get_model("auth", "Permission"))


def backward(apps, schema_editor):
    from security.roles import ROLES

    apps.get_model("auth", "Group").objects.filter(name__in=list(ROLES)).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("auth", "0012_alter_user_first_name_max_length"),
        ("contenttypes", "0002_remove_content_type_name"),
        ("audit", "0002_append_only_trigger"),
        ("rotation", "0001_initial"),
        ("leads", "0001_initial"),
        ("hooks", "0001_intake_sources"),
    ]
    operations = [migrations.RunPython(forward, backward)]
