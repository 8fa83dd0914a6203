#!/usr/bin/env bash
# Runs the whole product on this machine: migrations, demo data, web, Celery worker and beat.
# With no DATABASE_URL / REDIS_URL it runs on the embedded default (SQLite, filesystem broker).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-8000}
# Before a port (the URLs, the bind address) an IPv6 address is bracketed: [::1]:8000.
case $HOST in
    \[*\]) ADDRESS=$HOST ;;
    *:*) ADDRESS="[$HOST]" ;;
    *) ADDRESS=$HOST ;;
esac
# The links in notification e-mails (the lead in the admin, the rep's accept link).
export PUBLIC_BASE_URL=${PUBLIC_BASE_URL:-http://$ADDRESS:$PORT}
# The printed curl and those links name $HOST: Django answers a host it does not allow with 400.
export ALLOWED_HOSTS=${ALLOWED_HOSTS:-localhost,127.0.0.1,[::1],$ADDRESS}
export DJANGO_SETTINGS_MODULE=${DJANGO_SETTINGS_MODULE:-routing_project.settings.local}
mkdir -p var/log

# A line of this script's own: JSON under LOG_FORMAT=json, as the processes' lines are (a log
# shipper reading the output takes every line), else text. say LEVEL MESSAGE
say() {
    if [ "${LOG_FORMAT:-}" = json ]; then
        local message=${2//\\/\\\\}
        message=${message//\"/\\\"}
        printf '{"ts": "%s", "level": "%s", "logger": "run.sh", "message": "%s", "request_id": "-"}\n' \
            "$(date -u +%Y-%m-%dT%H:%M:%S.%3N+00:00)" "$1" "$message"
    else
        printf '%s\n' "$2"
    fi
}

# One Prometheus multiprocess directory for web, worker and beat, emptied before they start:
# GET /metrics then also shows what the worker counts (escalations, SLA breaches).
export PROMETHEUS_MULTIPROC_DIR=${PROMETHEUS_MULTIPROC_DIR:-$PWD/var/metrics}
# Its sample files only (*.db): a directory given that holds anything else keeps it.
mkdir -p "$PROMETHEUS_MULTIPROC_DIR" && find "$PROMETHEUS_MULTIPROC_DIR" -maxdepth 1 -type f -name '*.db' -delete

# What can stop the start is checked before anything is written (the admin password reset, the
# demo token replaced, the workers started): the port, the web server's settings
# (gunicorn.conf.py, run as a script, refuses a bad WEB_* naming it), and Django's settings.
case $PORT in
    '' | *[!0-9]*)
        say ERROR "Configuration error: PORT is '$PORT': give a port number (8000)." >&2
        exit 1
        ;;
esac
"$VENV/bin/python" gunicorn.conf.py
"$VENV/bin/python" manage.py create_database  # PostgreSQL: the DATABASE_URL's database, if missing
"$VENV/bin/python" manage.py migrate --noinput -v 0
"$VENV/bin/python" manage.py seed_demo --base-url "http://$ADDRESS:$PORT" ${ADMIN_PASSWORD:+--admin-password "$ADMIN_PASSWORD"}

pids=()
# keep_running's: TERM to the command, KILL to its process group if it is still there after 10 s.
stop_child() {
    local watchdog
    set -m
    (set +m; sleep 10 && kill -KILL -- "-$child") >/dev/null 2>&1 &
    watchdog=$!
    set +m
    kill -TERM "$child" 2>/dev/null || true
    # A TERM that reached this shell before its trap ignored TERM (make run's whole group and
    # cleanup both send one) cuts a wait short: wait again until the command has gone, or the
    # KILL above would land before the command's own TERM handler had run.
    while kill -0 "$child" 2>/dev/null; do
        wait "$child" 2>/dev/null || true  # its status is the signal's (errexit)
    done
    kill -KILL -- "-$child" "-$watchdog" 2>/dev/null || true
}
# Stops every process this script started: its jobs, not only those in pids, since a signal
# can run the trap between a process's start and its entry in pids (the web server, left
# running, and this script waiting for it). A signal then ends the script, which would
# otherwise go on to start what was left to start. A second signal (Ctrl-C again) changes
# nothing: the script returns once everything it started has stopped.
cleanup() {
    local started
    trap '' INT TERM
    started=$(jobs -p)
    [ -z "$started" ] || kill $started 2>/dev/null || true
    wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# Runs a command in the background, and again whenever it stops on its own (a worker killed
# mid-escalation, out of memory): the web keeps taking leads meanwhile, and the restarted
# worker and the sweep catch up without a hand. Its log ($1) is appended to. Stopping this
# loop (cleanup) stops the command: one TERM, and what is left of it 10 s later is killed.
# The command runs in a process group of its own (set -m), out of reach of a signal sent to
# make run's group (Ctrl-C, `kill -- -PGID`, a service manager): given straight to a worker's
# pool processes, it killed them holding the pool's queue lock and the worker hung in its
# shutdown; and Celery, signalled again while its first handler ran, deadlocked in it (beat).
# The trap runs between two commands, so it can run after the command has started and before
# `child=$!`: it takes the command's pid from $! whenever $! has changed since `before`.
keep_running() {
    local log=$1 child='' status before=${!-}
    shift
    : >"$log"
    trap 'trap "" TERM INT; [ "${!-}" = "$before" ] || child=$!; stop_child; exit 0' TERM INT
    while true; do
        before=${!-}
        set -m
        "$@" >>"$log" 2>&1 &
        child=$!
        set +m
        status=0
        wait "$child" || status=$?
        say WARNING "$log: the process stopped (exit status $status); starting it again." >&2
        sleep 2
    done
}

# Two workers: routing (SLA timers, queue drains) and notifications (webhooks, e-mails), so
# that a slow webhook receiver never delays an escalation. Notifications wait on the network,
# not the CPU: that worker runs threads (NOTIFY_WORKER_CONCURRENCY, 8), so a receiver slow to
# answer holds one of them per delivery, not the worker, and the reps' e-mails go out beside
# it. It takes 8 tasks a thread at a time (--prefetch-multiplier): with one, each thread
# waited on the broker's next poll for its next task, and e-mails went out at about 15 a
# second, behind a burst of intake by minutes. --quiet: no start-up banner, which Celery prints outside logging (not JSON under
# LOG_FORMAT=json).
keep_running var/log/worker.log \
"$VENV/bin/celery" -A routing_project --quiet worker -Q celery -n "routing.$PORT@%h" --loglevel INFO --concurrency 2 &
pids+=($!)
keep_running var/log/notify-worker.log \
"$VENV/bin/celery" -A routing_project --quiet worker -Q notify -n "notify.$PORT@%h" --loglevel INFO \
    --pool threads --concurrency "${NOTIFY_WORKER_CONCURRENCY:-8}" --prefetch-multiplier 8 &
pids+=($!)
keep_running var/log/beat.log \
"$VENV/bin/celery" -A routing_project --quiet beat --loglevel INFO --schedule var/celerybeat-schedule &
pids+=($!)
say INFO "Worker and beat started (logs in var/log/, e-mails to reps in var/mail/). Web on http://$ADDRESS:$PORT/ (Ctrl-C stops everything)."
"$VENV/bin/gunicorn" routing_project.wsgi:application --config gunicorn.conf.py --bind "$ADDRESS:$PORT" &
pids+=($!)
wait -n "${pids[@]}"
