"""Names and reasons written before 0012 refused control and reordering characters, brought
onto one line, so that such a row does not make every later edit of it a 400 (a rep named
with a tab could not be deactivated without being renamed first): line breaks, tabs and
other separators become a space, the invisible characters are dropped, runs of spaces are
made one. A rule's name is unique: one the cleaning would make another's takes its id."""

import re

from django.db import migrations

# As rotation.models._NOT_IN_A_NAME was when this ran.
NOT_IN_A_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b\u2028-\u202e\u2060-\u2069\ufeff]")
SEPARATORS = re.compile(r"[\t\n\x0b\x0c\r\x1c-\x1f\x85\u2028\u2029]")

FIELDS = [
    ("Group", "name"),
    ("Rep", "name"),
    ("RoutingRule", "name"),
    ("Account", "name"),
    ("Membership", "paused_reason"),
    ("Absence", "reason"),
]


def one_line(value: str) -> str:
    value = NOT_IN_A_NAME.sub("", SEPARATORS.sub(" ", value))
    return re.sub(r" {2,}", " ", value).strip()


def clean(apps, schema_editor):
    for model_name, field in FIELDS:
        model = apps.get_model("rotation", model_name)
        spec = model._meta.get_field(field)
        # Read here, not by a database pattern: the characters are written alike in both.
        for pk, old in list(model.objects.values_list("pk", field)):
            if not NOT_IN_A_NAME.search(old):
                continue
            new = one_line(old)
            if not new and not spec.blank:
                new = f"#{pk}"
            if spec.unique and model.objects.filter(**{field: new}).exclude(pk=pk).exists():
                new = f"{new[: spec.max_length - 12]} (#{pk})"
            model.objects.filter(pk=pk).update(**{field: new})


class Migration(migrations.Migration):
    dependencies = [
        ("rotation", "0012_names_on_one_line"),
    ]

    operations = [migrations.RunPython(clean, migrations.RunPython.noop)]
