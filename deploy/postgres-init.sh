#!/bin/sh
# The postgres image runs this once, on an empty data volume (docker-compose.yml): the
# application's own role, which owns nothing. `manage.py grant_app_role leadrouter_app`, run
# by the `migrate` service after each migrate, gives it what it needs.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
    -v password="$APP_DB_PASSWORD" <<'SQL'
CREATE ROLE leadrouter_app LOGIN PASSWORD :'password';
SQL
