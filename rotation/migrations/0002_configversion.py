"""The configuration version and the triggers that move it (PostgreSQL only: elsewhere
nothing is cached, see routing_project/configcache.py)."""

from django.db import migrations, models

# Statement-level: one bump per statement, whatever the number of rows; TRUNCATE included.
TRIGGERS = {
    "rotation_group": "INSERT OR UPDATE OR DELETE OR TRUNCATE",
    "rotation_routingrule": "INSERT OR UPDATE OR DELETE OR TRUNCATE",
    "rotation_account": "INSERT OR UPDATE OR DELETE OR TRUNCATE",
    # A rep's active flag decides whether an account owner is offered: the rest of a rep is
    # read under the rotation lock, never from the cache.
    "rotation_rep": "INSERT OR UPDATE OF active OR DELETE OR TRUNCATE",
    # Not last_used_at: it is written once a minute per client and nothing cached reads it.
    "leads_apiclient": (
        "INSERT OR UPDATE OF name, token_hash, token_prefix, scopes, active, rate_limit_per_minute "
        "OR DELETE OR TRUNCATE"
    ),
}

FORWARD = [
    "CREATE SEQUENCE rotation_configversion_seq",
    "INSERT INTO rotation_configversion (id, version) VALUES (1, nextval('rotation_configversion_seq'))",
    """
    CREATE FUNCTION rotation_config_bump() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        INSERT INTO rotation_configversion (id, version) VALUES (1, nextval('rotation_configversion_seq'))
        ON CONFLICT (id) DO UPDATE SET version = EXCLUDED.version;
        RETURN NULL;
    END
    $$
    """,
    *(
        f"CREATE TRIGGER {table}_config_bump AFTER {events} ON {table} "
        "FOR EACH STATEMENT EXECUTE FUNCTION rotation_config_bump()"
        for table, events in TRIGGERS.items()
    ),
]
BACKWARD = [
    *(f"DROP TRIGGER IF EXISTS {table}_config_bump ON {table}" for table in TRIGGERS),
    "DROP FUNCTION IF EXISTS rotation_config_bump()",
    "DROP SEQUENCE IF EXISTS rotation_configversion_seq",
]


def forward(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        for sql in FORWARD:
            schema_editor.execute(sql)


def backward(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        for sql in BACKWARD:
            schema_editor.execute(sql)


class Migration(migrations.Migration):
    dependencies = [
        ("rotation", "0001_initial"),
        ("leads", "0001_initial"),
    ]

    operations = [
        migrations.CreateModel(
            name="ConfigVersion",
            fields=[
                ("id", models.PositiveSmallIntegerField(default=1, primary_key=True, serialize=False)),
                ("version", models.BigIntegerField(default=0)),
            ],
        ),
        migrations.RunPython(forward, backward),
    ]
