"""Prometheus metrics: what intake counts, how long routing and its lock take, and the gauges
computed from the database when `/metrics` is scraped.

Under gunicorn (several worker processes) prometheus-client runs in multiprocess mode: each
process writes its samples to files in PROMETHEUS_MULTIPROC_DIR (set by gunicorn.conf.py or
scripts/run.sh before any worker starts) and a scrape sums them. Without that variable (tests,
`runserver`, a one-process deployment) the process's own registry is served.

Other parts of the product record through the small functions below (`lead_received`,
`intake_finished`, `rotation_lock_waited`, `escalation_recorded`, `sla_breach_recorded`), so
metric names and labels live in one place. No metric carries contact data: labels are group
slugs and fixed words.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Iterator
from datetime import datetime

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    values,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

NO_GROUP = "none"
# Read once: prometheus-client asks for the identifier on every sample it writes.
_HOST = socket.gethostname().replace("_", "-")  # "_" separates the parts of a file name


def process_identifier(pid: int | None = None) -> str:
    """The name of a process's sample files in PROMETHEUS_MULTIPROC_DIR: its host and pid.
    docker-compose.yml shares one directory between the web, worker and beat containers, and
    each container numbers its processes from 1: by pid alone (prometheus-client's default)
    two processes wrote into one file, each overwriting the samples the other added."""
    return f"{_HOST}-{os.getpid() if pid is None else pid}"


if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    # Before any metric below is made: each one takes its value class when it is created.
    values.ValueClass = values.MultiProcessValue(process_identifier=process_identifier)

# Latency buckets for a transaction that should take a few milliseconds and must stay well
# under the lock timeout (2 s by default).
_FAST_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# Past the default lock timeout too: a wait that ends in a 503 lasts a little longer than the
# timeout (ROUTING_LOCK_TIMEOUT_MS, which may be raised), and fell in +Inf with any longer one.
_LOCK_BUCKETS: tuple[float, ...] = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
_LOCK_BUCKETS += (1.0, 2.0, 2.5, 5.0, 10.0)

LEADS_RECEIVED = Counter("leadrouter_leads_received", "Leads taken in by intake, by resolved group.", ["group"])
LEADS_ROUTED = Counter("leadrouter_leads_routed", "Leads assigned to a rep by intake, by group.", ["group"])
LEADS_QUEUED = Counter("leadrouter_leads_queued", "Leads put in the fallback queue by intake, by group.", ["group"])
LEADS_DUPLICATE = Counter(
    "leadrouter_leads_duplicate", "Leads answered as a duplicate of an open lead (no rotation turn).", ["group"]
)
ROUTING_BUSY = Counter(
    "leadrouter_routing_busy", "Intakes refused with 503 because the rotation row stayed locked.", ["group"]
)
ROUTING_SECONDS = Histogram(
    "leadrouter_routing_duration_seconds",
    "Time to route one lead: the intake service, its transaction and retries included; an intake refused "
    "with 503 (the rotation row stayed locked) with its whole wait.",
    buckets=_FAST_BUCKETS,
)
LOCK_WAIT_SECONDS = Histogram(
    "leadrouter_rotation_lock_wait_seconds",
    "Time to acquire a group's rotation row lock (SELECT ... FOR NO KEY UPDATE), or to give up on it (a 503).",
    buckets=_LOCK_BUCKETS,
)
LOCK_HELD_SECONDS = Histogram(
    "leadrouter_rotation_lock_held_seconds",
    "Time a routing transaction holds a group's rotation row lock, from acquiring it to COMMIT.",
    buckets=_LOCK_BUCKETS,
)
INTAKE_BATCH_SIZE = Histogram(
    "leadrouter_intake_batch_size",
    "Leads routed together in one routing transaction by a web process (1: on its own).",
    buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64),
)
ESCALATIONS = Counter(
    "leadrouter_escalations", "Escalations of unaccepted leads, by group and outcome.", ["group", "outcome"]
)
SLA_BREACHES = Counter("leadrouter_sla_breaches", "Assignments whose SLA passed before acceptance.", ["group"])
DELIVERIES = Counter(
    "leadrouter_deliveries",
    "Notification delivery tries by channel (webhook, email) and outcome: sent, retry (failed, tried"
    " again later), failed (the last attempt failed: given up).",
    ["channel", "outcome"],
)
HTTP_SECONDS = Histogram(
    "leadrouter_http_request_duration_seconds",
    "HTTP requests by method, view (the URL pattern's name, never the raw path) and status.",
    ["method", "view", "status"],
    buckets=_FAST_BUCKETS,
)


def _group(slug: str | None) -> str:
    return slug or NO_GROUP


def lead_received(*, group: str | None) -> None:
    LEADS_RECEIVED.labels(_group(group)).inc()


def intake_finished(*, group: str | None, status: str, duplicate: bool, seconds: float) -> None:
    """One intake ended: `status` is the lead's status (assigned or queued)."""
    label = _group(group)
    if duplicate:
        LEADS_DUPLICATE.labels(label).inc()
    elif status == "queued":
        LEADS_QUEUED.labels(label).inc()
    else:
        LEADS_ROUTED.labels(label).inc()
    ROUTING_SECONDS.observe(seconds)


def intake_refused_busy(*, seconds: float) -> None:
    """An intake answered 503 (its group's rotation stayed locked): its time is a routing time."""
    ROUTING_SECONDS.observe(seconds)


def leads_imported(*, group: str | None, routed: int, queued: int, duplicate: int) -> None:
    """A bulk import's batch committed: its leads counted as intake counts its own."""
    label = _group(group)
    LEADS_RECEIVED.labels(label).inc(routed + queued + duplicate)
    for counter, n in ((LEADS_ROUTED, routed), (LEADS_QUEUED, queued), (LEADS_DUPLICATE, duplicate)):
        if n:
            counter.labels(label).inc(n)


def routing_busy(*, group: str | None) -> None:
    ROUTING_BUSY.labels(_group(group)).inc()


def intake_batch(size: int) -> None:
    INTAKE_BATCH_SIZE.observe(size)


def rotation_lock_waited(seconds: float) -> None:
    LOCK_WAIT_SECONDS.observe(seconds)


def rotation_lock_held(seconds: float) -> None:
    LOCK_HELD_SECONDS.observe(seconds)


def delivery_tried(*, channel: str, outcome: str) -> None:
    """A notification delivery was tried (or held: not sent, as its endpoint gave another no
    answer). Call after commit."""
    DELIVERIES.labels(channel, outcome).inc()


def escalation_recorded(*, group: str | None, outcome: str) -> None:
    """An escalation happened (`outcome`: e.g. "reassigned" or "queued"). Call after commit."""
    ESCALATIONS.labels(_group(group), outcome).inc()


def sla_breach_recorded(*, group: str | None) -> None:
    SLA_BREACHES.labels(_group(group)).inc()


# The client chooses the method token (any word is accepted and answered 405): a label value
# per made-up method would grow the series without bound.
_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def http_request_observed(*, method: str, view: str, status: int, seconds: float) -> None:
    HTTP_SECONDS.labels(method if method in _HTTP_METHODS else "other", view, str(status)).observe(seconds)


class DatabaseGauges(Collector):
    """Gauges read from the database at scrape time: the fallback queue's depth per group,
    the assignments past their SLA right now and the deliveries pending (each served by an
    index)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily("leadrouter_metrics_database_up", "1 when the scrape-time database gauges were read.")
        queue = GaugeMetricFamily("leadrouter_queue_depth", "Leads in the fallback queue, by group.", labels=["group"])
        overdue = GaugeMetricFamily(
            "leadrouter_sla_overdue_assignments",
            "Open assignments past their SLA due time and not accepted, by group.",
            labels=["group"],
        )
        pending = GaugeMetricFamily(
            "leadrouter_deliveries_pending",
            "Notification deliveries not sent yet and not given up on, by channel (a receiver down grows it).",
            labels=["channel"],
        )
        try:
            from django.db.models import Count
            from django.utils import timezone

            from leads.models import Assignment, Lead, LeadStatus
            from notifications.models import Delivery
            from rotation.models import Group
            from routing_project.health import check_database

            # Within a scrape's timeout: a database that does not answer is reported at once.
            reachable, detail = check_database()
            if not reachable:
                raise ConnectionError(detail)

            now: datetime = timezone.now()
            # Every group has its series, at 0 when nothing is queued or late: a drained queue
            # reads 0, not "no data" (a series that vanishes cannot be told from a failed read).
            late: dict[str | None, int] = dict.fromkeys(Group.objects.values_list("slug", flat=True), 0)
            # And the leads no group holds (no rule matched, no default group), as "none".
            queued = {**late, None: 0}
            queued.update(
                Lead.objects.filter(status=LeadStatus.QUEUED)
                .order_by()
                .values_list("group__slug")
                .annotate(n=Count("id"))
                .values_list("group__slug", "n")
            )
            late.update(
                Assignment.objects.filter(ended_at__isnull=True, accepted_at__isnull=True, due_at__lt=now)
                .order_by()
                .values_list("group__slug")
                .annotate(n=Count("id"))
                .values_list("group__slug", "n")
            )
            depth: dict[str, int] = {}
            for slug, n in queued.items():  # one sample per label, should a group be named "none"
                depth[_group(slug)] = depth.get(_group(slug), 0) + n
            for label, n in depth.items():
                queue.add_metric([label], n)
            for slug, n in late.items():
                overdue.add_metric([_group(slug)], n)
            waiting = dict.fromkeys(Delivery.Channel.values, 0)
            waiting.update(  # through delivery_pending_idx: the pending ones only
                Delivery.objects.filter(status=Delivery.Status.PENDING)
                .order_by()
                .values_list("channel")
                .annotate(n=Count("id"))
                .values_list("channel", "n")
            )
            for channel, n in waiting.items():
                pending.add_metric([channel], n)
            up.add_metric([], 1)
        except Exception:
            logger.warning("metrics: database gauges unavailable", exc_info=True)
            up.add_metric([], 0)
            yield up
            return
        yield up
        yield queue
        yield overdue
        yield pending


_database_registry = CollectorRegistry(auto_describe=False)
_database_registry.register(DatabaseGauges())


# Every metric a process may write, declared on every scrape (below).
_DECLARED = (
    LEADS_RECEIVED,
    LEADS_ROUTED,
    LEADS_QUEUED,
    LEADS_DUPLICATE,
    ROUTING_BUSY,
    ROUTING_SECONDS,
    LOCK_WAIT_SECONDS,
    LOCK_HELD_SECONDS,
    INTAKE_BATCH_SIZE,
    ESCALATIONS,
    SLA_BREACHES,
    HTTP_SECONDS,
)


class ProcessSamples(Collector):
    """The samples every process wrote to PROMETHEUS_MULTIPROC_DIR, plus the `HELP` and
    `TYPE` of each metric no process has written yet (no escalation since the start, say):
    as a one-process registry serves them, so a scrape shows every metric the product has
    and a dashboard or an alert can tell "none yet" from "not exported"."""

    def collect(self) -> Iterator[Metric]:
        seen = set()
        for family in multiprocess.MultiProcessCollector(None).collect():
            seen.add(family.name)
            yield family
        for metric in _DECLARED:
            for family in metric.describe():
                if family.name not in seen:
                    yield family


def exposition() -> bytes:
    """The text a scrape gets: every process's samples, then the database gauges."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        registry.register(ProcessSamples())
        process_part = generate_latest(registry)
    else:
        process_part = generate_latest(REGISTRY)
    return process_part + generate_latest(_database_registry)


@csrf_exempt
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    """GET /metrics: Prometheus text format, no authentication (SPEC 6)."""
    return HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
