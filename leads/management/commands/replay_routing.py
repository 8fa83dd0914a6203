"""manage.py replay_routing: what a past window's leads would have got under the current or a
proposed configuration (leads/replay.py). Reads only."""

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from leads.replay import ReplayError, routing_replay


def _when(value: str) -> datetime:
    try:
        parsed = parse_datetime(value)
    except ValueError:  # well formed, but no such day or time (2026-02-30)
        parsed = None
    if parsed is None:
        raise CommandError(f"'{value}' is not an ISO 8601 date-time.")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, timezone.get_current_timezone())


class Command(BaseCommand):
    help = (
        "Replays the routing decisions of [since, until) in memory through the current or a proposed "
        "configuration and prints per-rep counts, actual vs proposed. Writes nothing."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", required=True, help="ISO 8601, e.g. 2026-11-01T00:00:00Z")
        parser.add_argument("--until", default=None, help="ISO 8601; default now")
        parser.add_argument("--group", default=None, help="group slug")
        parser.add_argument(
            "--config",
            default=None,
            help='proposed configuration: JSON, or @file.json, e.g. \'{"members": {"3": {"weight": 4}}}\'',
        )
        parser.add_argument("--json", action="store_true", help="print the result as JSON")

    def handle(self, *args: Any, **options: Any) -> None:
        since = _when(options["since"])
        until = _when(options["until"]) if options["until"] else timezone.now()
        config = None
        if options["config"]:
            text = options["config"]
            if text.startswith("@"):
                try:
                    text = Path(text[1:]).read_text()
                except (OSError, UnicodeDecodeError) as exc:
                    raise CommandError(f"--config {text}: cannot read it ({exc}).") from None
            try:
                config = json.loads(text)
            except json.JSONDecodeError as exc:
                raise CommandError(f"--config is not JSON: {exc}") from None
        try:
            result = routing_replay(since=since, until=until, group=options["group"], config=config)
        except ReplayError as exc:
            raise CommandError("; ".join(f"{k}: {m}" for k, ms in exc.errors.items() for m in ms)) from None
        if options["json"]:
            self.stdout.write(json.dumps(result, indent=2))
            return
        self.stdout.write(
            f"Replay {result['since']} .. {result['until']}: {result['turns']} routing decisions, "
            f"{result['changed']} would change."
        )
        for g in result["groups"]:
            strategy = g["strategy"]
            if g["proposed_strategy"] != strategy:
                strategy = f"{strategy} -> {g['proposed_strategy']}"
            self.stdout.write(f"\n{g['group'] or '(no group)'}  [{strategy}]")
            self.stdout.write(f"  {'rep':<24} {'weight':>8} {'actual':>7} {'proposed':>9} {'diff':>6}")
            for r in g["reps"]:
                weight = "" if r["weight"] is None else str(r["weight"])
                if r["proposed_weight"] is not None and r["proposed_weight"] != r["weight"]:
                    weight = f"{weight}->{r['proposed_weight']}"
                self.stdout.write(
                    f"  {r['rep']['name'][:24]:<24} {weight:>8} {r['actual']:>7} {r['proposed']:>9} "
                    f"{r['difference']:>+6}"
                )
            q = g["queued"]
            self.stdout.write(f"  {'(queued)':<24} {'':>8} {q['actual']:>7} {q['proposed']:>9}")
            for reason, n in g["proposed_queued_because"].items():
                self.stdout.write(f"    queued in the replay: {n} ({reason})")
            for slug, n in g["moved_to"].items():
                self.stdout.write(f"    {n} sent to {slug} by the proposal")
            for slug, n in g["moved_from"].items():
                self.stdout.write(f"    {n} brought from {slug} by the proposal")
