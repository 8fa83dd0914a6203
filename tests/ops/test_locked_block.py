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
    m = re.match(r'\s*(SELECT|INSERT INTO|UPDATE)\s.*?"?(\w+)"?', sql, re.S)
    if m and m.group(1) == "SELECT":
        outer = sql
        while re.search(r"\([^()]*\)", outer):  # drop subqueries: the main table is the outer FROM
            outer = re.sub(r"\([^()]*\)", "", outer)
        table = re.search(r'FROM\s+"(\w+)"', outer)
        return f"SELECT {table.group(1) if table else '?'}"
    return f"{m.group(1).split()[0]} {m.group(2)}" if m else sql[:40]


def locked_statements(ctx: CaptureQueriesContext) -> list[str]:
    sqls = [q["sql"] for q in ctx.captured_queries]
    start = next(i for i, s in enumerate(sqls) if LOCK in s)
    end = next(i for i, s in enumerate(sqls) if i > start and s.strip().upper() == "COMMIT")
    return [kind(s) for s in sqls[start + 1 : end]]


EXPECTED = [
    "SELECT rotation_membership",  # eligibility, read after the lock (members, reps, absences: one query)
    "INSERT leads_lead",
    "INSERT leads_assignment",
    "UPDATE rotation_rotationstate",  # the advance
    "INSERT audit_auditevent",  # lead.received and lead.assigned in one INSERT
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
    locked = locked_statements(ctx)
    outbox = [k for k in locked if OUTBOX in k]
    assert len(outbox) <= 1, locked
    expected = EXPECTED + (["UPDATE leads_idempotencyrecord"] if with_key else [])
    assert [k for k in locked if OUTBOX not in k] == expected, "\n".join(locked)
