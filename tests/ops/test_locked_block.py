"""The locked block holds only the statements that need the rotation lock (SPEC 3.6, 9).

One group's leads serialize on its rotation row, so every statement between taking that
lock and COMMIT is paid once per lead by the whole group. This test pins them down.
"""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

LOCK = "FOR NO KEY UPDATE"
OUTBOX = "notifications_outbox"  # the notification outbox row is written in the same transaction


def kind(sql: str) -> str:
    if sql.lstrip().startswith("WITH "):
        # One statement of data-modifying CTEs: what it writes, in order.
        writes = re.findall(r'(INSERT INTO|UPDATE)\s+"?(\w+)"?', sql)
        return "WITH " + ", ".join(f"{verb.split()[0]} {table}" for verb, table in writes)
    m = re.match(r'\s*(SELECT|INSERT INTO|UPDATE)\s.*?"?(\w+)"?', sql, re.S)
    if m and m.group(1) == "SELECT":
        outer = sql
        while re.search(r"\([^()]*\)", outer):  # drop subqueries: the main table is the outer FROM
            outer = re.sub(r"\([^()]*\)", "", outer)
        table = re.search(r'FROM\s+"(\w+)"', outer)
        return f"SELECT {table.group(1) if table else '?'}"
    return f"{m.group(1).split()[0]} {m.group(2)}" if m else sql[:40]


def round_trips_after_the_lock(sqls: list[str]) -> list[list[str]]:
    """What runs under the lock, by round trip: first the statements sent in the lock's own
    query string after the lock, then each later query up to COMMIT."""
    start = next(i for i, s in enumerate(sqls) if LOCK in s)
    end = next((i for i, s in enumerate(sqls) if i > start and s.strip().upper() == "COMMIT"), len(sqls))
    with_lock = [part for part in sqls[start].split("; ") if part.strip()]
    assert LOCK in with_lock[0], with_lock[0]
    return [[kind(s) for s in with_lock[1:]]] + [[kind(s)] for s in sqls[start + 1 : end]]


# By round trip. The members are read in the lock's own round trip, after it (their own
# snapshot: a rep paused while the lock was awaited is seen paused).
EXPECTED = [
    ["SELECT rotation_membership"],  # eligibility (members, reps, absences: one query)
    # The only write: the lead, its audit events (lead.received, lead.assigned), its assignment,
    # the notification outbox row and the rotation's advance, in one statement.
    [
        f"WITH INSERT leads_lead, INSERT audit_auditevent, INSERT leads_assignment, INSERT {OUTBOX}message, "
        "UPDATE rotation_rotationstate"
    ],
]
BATCH_EXPECTED = [
    ["SELECT rotation_membership"],  # every locked group's members, one query
    # The batch's leads, their audit events, assignments and outbox rows, and the advances.
    [
        f"WITH INSERT leads_lead, INSERT audit_auditevent, INSERT leads_assignment, INSERT {OUTBOX}message, "
        "UPDATE rotation_rotationstate"
    ],
]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("with_key", [False, True], ids=["no-key", "idempotency-key"])
def test_locked_block_holds_only_what_needs_the_lock(make_group, post_lead, with_key):
    group, _reps = make_group(3)
    post_lead(group=group.slug)  # warm: the first intake of a process may load more
    headers = {"Idempotency-Key": "count-the-queries"} if with_key else {}
    with CaptureQueriesContext(connection) as ctx:
        response = post_lead(group=group.slug, headers=headers)
    assert response.status_code == 201
    assert response.json()["owner"]["name"]
    locked = round_trips_after_the_lock([q["sql"] for q in ctx.captured_queries])
    expected = EXPECTED + ([["UPDATE leads_idempotencyrecord"]] if with_key else [])
    assert locked == expected, locked


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_batch_holds_the_same_two_round_trips_for_all_its_leads(make_group):
    from django.db import transaction

    from leads import services
    from tests.conftest import lead_body

    group, _reps = make_group(3)
    other, _ = make_group(2)
    jobs = []
    for target in (group, other, group, other, group):
        data = lead_body()
        resolution = services.lead_resolve_group(data=data, requested=target)
        jobs.append(services.IntakeJob(data, data, target, resolution, None, "test", "", data["email"]))
    with CaptureQueriesContext(connection) as ctx, transaction.atomic():
        results = services._intake_locked_many(jobs)
    assert [r.status_code for r in results] == [201] * 5
    locked = round_trips_after_the_lock([q["sql"] for q in ctx.captured_queries])
    assert locked == BATCH_EXPECTED, locked
