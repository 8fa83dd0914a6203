"""docker-compose.yml (the production shape) and scripts/run.sh, as their logs come out."""

from pathlib import Path

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"


def test_celery_services_print_no_banner_outside_the_json_lines():
    # Celery prints its start-up banner (about thirty lines of text) outside logging: under
    # LOG_FORMAT=json, production's default, a log shipper gets lines that are not JSON.
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    celery = {name: s["command"] for name, s in services.items() if s.get("command", [None])[0] == "celery"}
    assert set(celery) == {"worker", "notifier", "beat"}
    for name, command in celery.items():
        assert command[:4] == ["celery", "-A", "routing_project", "--quiet"], (name, command)  # before the subcommand


def test_make_run_starts_celery_without_the_banner():
    # The same under `make run` with LOG_FORMAT=json: var/log/worker.log began with the banner.
    run = (COMPOSE.parent / "scripts" / "run.sh").read_text()
    starts = [line for line in run.splitlines() if line.startswith('"$VENV/bin/celery"')]
    assert len(starts) == 3
    for line in starts:
        assert line.startswith('"$VENV/bin/celery" -A routing_project --quiet '), line
