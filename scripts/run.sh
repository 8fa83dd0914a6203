#!/usr/bin/env bash
# Runs the whole product on this machine: migrations, demo data, web, Celery worker and beat.
# With no DATABASE_URL / REDIS_URL it runs on the embedded default (SQLite, filesystem broker).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
# The links in notification e-mails (the lead in the admin, the rep's accept link).
export PUBLIC_BASE_URL=${PUBLIC_BASE_URL:-http://$HOST:$PORT}
# The printed curl and those links name $HOST: Django answers a host it does not allow with 400.
export ALLOWED_HOSTS=${ALLOWED_HOSTS:-localhost,127.0.0.1,[::1],$HOST}
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-routing_project.settings.local}
mkdir -p var/log
# One Prometheus multiprocess directory for web, worker and beat, emptied before they start:
# GET /metrics then also shows what the worker counts (escalations, SLA breaches).
export PROMETHEUS_MULTIPROC_DIR=${PROMETHEUS_MULTIPROC_DIR:-$PWD/var/metrics}
rm -rf "$PROMETHEUS_MULTIPROC_DIR" && mkdir -p "$PROMETHEUS_MULTIPROC_DIR"

"$VENV/bin/python" manage.py create_database  # PostgreSQL: the DATABASE_URL's database, if missing
"$VENV/bin/python" manage.py migrate --noinput -v 0
"$VENV/bin/python" manage.py seed_demo --base-url "http://$HOST:$PORT" ${ADMIN_PASSWORD:+--admin-password "$ADMIN_PASSWORD"}

pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; }
trap cleanup EXIT INT TERM

# Runs a command in the background, and again whenever it stops on its own (a worker killed
# mid-escalation, out of memory): the web keeps taking leads meanwhile, and the restarted
# worker and the sweep catch up without a hand. Its log ($1) is appended to. Stopping this
# loop (cleanup) stops the command.
keep_running() {
    local log=$1 child='' status
    shift
    : >"$log"
    trap 'kill $child 2>/dev/null; wait $child 2>/dev/null; exit 0' TERM INT
    while true; do
        "$@" >>"$log" 2>&1 &
        child=$!
        status=0
        wait "$child" || status=$?
        echo "$log: the process stopped (exit status $status); starting it again." >&2
        sleep 2
    done
}

# Two workers: routing (SLA timers, queue drains) and notifications (webhooks, e-mails), so
# that a slow webhook receiver never delays an escalation. --quiet: no start-up banner, which
# Celery prints outside logging (not JSON under LOG_FORMAT=json).
keep_running var/log/worker.log \
"$VENV/bin/celery" -A routing_project --quiet worker -Q celery -n "routing.$PORT@%h" --loglevel INFO --concurrency 2 &
pids+=($!)
keep_running var/log/notify-worker.log \
"$VENV/bin/celery" -A routing_project --quiet worker -Q notify -n "notify.$PORT@%h" --loglevel INFO --concurrency 2 &
pids+=($!)
keep_running var/log/beat.log \
"$VENV/bin/celery" -A routing_project --quiet beat --loglevel INFO --schedule var/celerybeat-schedule &
pids+=($!)
echo "Worker and beat started (logs in var/log/, e-mails to reps in var/mail/). Web on http://$HOST:$PORT/ (Ctrl-C stops everything)."
"$VENV/bin/gunicorn" routing_project.wsgi:application --config gunicorn.conf.py --bind "$HOST:$PORT" &
pids+=($!)
wait -n "${pids[@]}"
