"""The locked block's reads and its advance in plain SQL, on PostgreSQL.

These statements run while a group's rotation row is locked, so their cost is paid once per
lead by the whole group: on a small machine, compiling an ORM query costs about a
millisecond of CPU, several times the statement itself. Same statements, same lock clauses,
same results as the ORM versions in leads/routing.py (which the embedded SQLite default
keeps using); the column lists come from the models, so a new field is picked up.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, time
from decimal import Decimal
from functools import cache
from typing import Any
from uuid import UUID

import orjson
from django.db import DEFAULT_DB_ALIAS, connection, connections
from django.db.models import Field, Model
from django.utils import timezone

from rotation.models import Absence, Group, Membership, Rep, RotationState
from routing_project.db import server_bound_cursor

from .models import IdempotencyRecord, Lead


@cache
def _qn(name: str) -> str:
    # Identifiers come from the models, a fixed set: quoted once each (this module runs on
    # PostgreSQL only, so the quoting never changes within a process).
    return connection.ops.quote_name(name)


@cache
def _converters(fields: tuple[Field, ...]) -> list[tuple[Any, ...]]:
    return [tuple(f.get_db_converters(connection)) for f in fields]  # type: ignore[attr-defined]


def _convert(fields: tuple[Field, ...], row: tuple[Any, ...]) -> list[Any]:
    """Applies the fields' own converters (JSON columns arrive as text), as the ORM would."""
    values = []
    conn = connections[DEFAULT_DB_ALIAS]  # looked up once, not through the proxy per value
    for converters, value in zip(_converters(fields), row, strict=True):
        for converter in converters:
            value = converter(value, None, conn)
        values.append(value)
    return values


@cache
def _lock_statement(many: bool = False) -> tuple[str, tuple[Field, ...], tuple[Field, ...]]:
    state_fields = tuple(RotationState._meta.concrete_fields)
    group_fields = tuple(Group._meta.concrete_fields)
    columns = [f"r.{_qn(f.column)}" for f in state_fields] + [f"g.{_qn(f.column)}" for f in group_fields]
    group_id = f"r.{_qn('group_id')}"
    # Several rows: locked in group id order (LockRows runs above the sort).
    where = f"{group_id} = ANY(%s) ORDER BY {group_id}" if many else f"{group_id} = %s"
    sql = (
        # Identifiers come from the models; values are parameters.
        f"SELECT {', '.join(columns)} FROM {_qn(RotationState._meta.db_table)} r "  # noqa: S608
        f"INNER JOIN {_qn(Group._meta.db_table)} g ON g.{_qn(Group._meta.pk.column)} = {group_id} "
        f"WHERE {where} FOR NO KEY UPDATE OF r, g"
    )
    return sql, state_fields, group_fields


def rotation_lock_fetch(group_id: int) -> RotationState | None:
    """SELECT ... FOR NO KEY UPDATE OF the rotation row and the group row (as the ORM query in
    routing.lock_rotation), returning the state with its group loaded; None when missing."""
    sql, state_fields, group_fields = _lock_statement()
    with server_bound_cursor() as cursor:
        cursor.execute(sql, [group_id])
        row = cursor.fetchone()
    if row is None:
        return None
    n = len(state_fields)
    state = RotationState.from_db(connection.alias, [f.attname for f in state_fields], _convert(state_fields, row[:n]))
    group = Group.from_db(connection.alias, [f.attname for f in group_fields], _convert(group_fields, row[n:]))
    state.group = group
    return state


def rotation_lock_fetch_with_members(
    group_ids: list[int], now: datetime
) -> tuple[dict[int, RotationState], dict[int, list[MemberRow]]]:
    """`rotation_lock_fetch` for several groups, locked in group id order (the lock order
    everywhere; groups without a rotation row are left out), then `member_rows_many` of the
    same groups, in one round trip: both statements in one query string, on Django's own cursor (psycopg binds the
    values on the client and sends the string with the simple protocol). In READ COMMITTED
    every statement of a query string takes its own snapshot, so the members are read after
    the locks are granted, exactly as when the two are sent apart: a rep paused while this
    waited for a lock is seen paused. The round trip saved is one fewer wait for a CPU while
    the group's lock is held."""
    lock_sql, state_fields, group_fields = _lock_statement(many=True)
    with connection.cursor() as cursor:
        cursor.execute(f"{lock_sql}; {_members_statement()}", [group_ids, now, now, group_ids])
        states = _states(cursor.fetchall(), state_fields, group_fields)
        cursor.nextset()
        members = _member_rows(cursor.fetchall())
    return states, members


def _states(
    rows: list[Any], state_fields: tuple[Field, ...], group_fields: tuple[Field, ...]
) -> dict[int, RotationState]:
    n = len(state_fields)
    states = {}
    for row in rows:
        state = RotationState.from_db(
            connection.alias, [f.attname for f in state_fields], _convert(state_fields, row[:n])
        )
        state.group = Group.from_db(
            connection.alias, [f.attname for f in group_fields], _convert(group_fields, row[n:])
        )
        states[state.group_id] = state
    return states


@dataclass
class RepRow:
    name: str
    email: str
    active: bool
    timezone: str
    working_hours: Any


@dataclass
class MemberRow:
    """What routing.member_facts reads of a membership (the same attribute names)."""

    rep_id: int
    position: int
    weight: int
    active: bool
    max_open: int | None
    max_per_day: int | None
    paused_reason: str
    rep: RepRow
    away_from: datetime | None
    away_until: datetime | None


@cache
def _members_statement() -> str:
    m, r, a = Membership._meta.db_table, Rep._meta.db_table, Absence._meta.db_table
    return (
        # Identifiers come from the models; values are parameters.
        "SELECT m.group_id, m.rep_id, m.position, m.weight, m.active, m.max_open, m.max_per_day, "  # noqa: S608
        "m.paused_reason, r.name, r.email, r.active, r.timezone, r.working_hours, a.starts_at, a.ends_at "
        f"FROM {_qn(m)} m INNER JOIN {_qn(r)} r ON r.id = m.rep_id "
        # The absences covering now, and on through those that follow on without a gap (a day
        # off, then a week's holiday): the reason says when the rep is back. A rep away from
        # nothing costs one probe of the index.
        "LEFT JOIN LATERAL (WITH RECURSIVE chain(starts_at, ends_at) AS ("
        f"SELECT starts_at, ends_at FROM {_qn(a)} WHERE rep_id = m.rep_id AND starts_at <= %s AND ends_at > %s "
        f"UNION SELECT c.starts_at, x.ends_at FROM chain c JOIN {_qn(a)} x "
        "ON x.rep_id = m.rep_id AND x.starts_at <= c.ends_at AND x.ends_at > c.ends_at"
        ") SELECT min(starts_at) AS starts_at, max(ends_at) AS ends_at FROM chain) a ON true "
        "WHERE m.group_id = ANY(%s) ORDER BY m.group_id, m.position, m.rep_id"
    )


def member_rows(group_id: int, now: datetime) -> list[MemberRow]:
    """Members in rotation order with their rep and the time away covering now (from the
    earliest absence covering now to the end of those that follow on), in one statement."""
    return member_rows_many([group_id], now).get(group_id, [])


def member_rows_many(group_ids: list[int], now: datetime) -> dict[int, list[MemberRow]]:
    """`member_rows` of several groups in one statement."""
    with server_bound_cursor() as cursor:
        cursor.execute(_members_statement(), [now, now, group_ids])
        return _member_rows(cursor.fetchall())


def _member_rows(rows: list[Any]) -> dict[int, list[MemberRow]]:
    out: dict[int, list[MemberRow]] = {}
    for (
        group_id,
        rep_id,
        position,
        weight,
        active,
        max_open,
        max_per_day,
        paused,
        name,
        email,
        rep_active,
        tz,
        hours,
        a0,
        a1,
    ) in rows:
        if isinstance(hours, str):
            hours = json.loads(hours)
        rep = RepRow(name, email, rep_active, tz, hours)
        member = MemberRow(rep_id, position, weight, active, max_open, max_per_day, paused, rep, a0, a1)
        out.setdefault(group_id, []).append(member)
    return out


def rotation_advance(state: RotationState) -> None:
    """UPDATE of the rotation row with the state's new pointer, weights and turns (as
    state.save(update_fields=[...]) would write them)."""
    state.updated_at = timezone.now()
    table = _qn(RotationState._meta.db_table)
    with server_bound_cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET pointer = %s, current_weights = %s::jsonb, turns = %s, updated_at = %s "  # noqa: S608
            "WHERE group_id = %s",
            [state.pointer, json.dumps(state.current_weights), state.turns, state.updated_at, state.group_id],
        )


def open_lead_may_exist(*, email_normalized: str, statuses: tuple[str, ...], since: datetime) -> bool:
    """The dedup check's common answer (no open lead for this email) in one cheap statement on
    PostgreSQL; True elsewhere, or when there is one (the caller then loads it with the ORM)."""
    if connection.vendor != "postgresql":
        return True
    table = _qn(Lead._meta.db_table)
    with server_bound_cursor() as cursor:
        cursor.execute(
            f"SELECT 1 FROM {table} WHERE email_normalized = %s AND status = ANY(%s) AND created_at >= %s LIMIT 1",  # noqa: S608
            [email_normalized, [str(s) for s in statuses], since],
        )
        return cursor.fetchone() is not None


# --- the intake's writes, in one statement -----------------------------------------------------

LEAD_ID = "(SELECT id FROM new_lead)"  # in a dependent row: the id of the lead inserted with it


@cache
def _insert_fields(model: type[Model]) -> list[Field]:
    return [f for f in model._meta.concrete_fields if not f.primary_key]


@cache
def _insert_getters(model: type[Model]) -> list[tuple[Field, str, bool]]:
    """(field, column, whether its value needs the field's pre_save: auto_now and the like;
    the others are read as attributes, which costs far less)."""
    return [
        (f, f.column, bool(getattr(f, "auto_now", False) or getattr(f, "auto_now_add", False)))
        for f in _insert_fields(model)
    ]


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date | time):
        return value.isoformat()
    if isinstance(value, Decimal | UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _dumps(value: Any) -> str:
    """JSON for a parameter: orjson (several times faster, and this runs under a rotation
    lock), or the standard library for what orjson refuses (integers past 64 bits, which a
    client's raw payload may hold)."""
    try:
        return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, default=_json_default)


@cache
def _insert_statement(
    model: type[Model], refs: tuple[tuple[str, str], ...]
) -> tuple[str, list[tuple[Field, str, bool]]]:
    """The INSERT's text and the getters of the values its JSON parameter carries, once per
    (model, refs): building them costs more than the statement under a hot group's lock."""
    by_name = dict(refs)
    fields = _insert_fields(model)
    table = _qn(model._meta.db_table)
    getters = [g for g in _insert_getters(model) if "%s" in by_name.get(g[0].attname, "%s")]
    columns = ", ".join(_qn(f.column) for f in fields)
    values = ", ".join(by_name.get(f.attname, "%s").replace("%s", f"r.{_qn(f.column)}") for f in fields)
    sql = (
        f"INSERT INTO {table} ({columns}) SELECT {values} "  # noqa: S608 - identifiers from the models
        f"FROM jsonb_populate_recordset(NULL::{table}, %s::jsonb) r RETURNING id"
    )
    return sql, getters


def _insert(model: type[Model], objs: Sequence[Model], refs: dict[str, str], params: list[Any]) -> str:
    """INSERT ... SELECT of `objs` from one JSON parameter (jsonb_populate_recordset: PostgreSQL
    converts each value to its column's type), so the statement has a handful of parameters
    whatever the number of columns and rows: psycopg then caches its conversion and prepares
    it. `refs` puts SQL in place of a field's value (`%s` in it: the value)."""
    sql, getters = _insert_statement(model, tuple(sorted(refs.items())))
    rows = [
        {
            column: f.pre_save(obj, True) if pre_save else getattr(obj, f.attname)  # type: ignore[attr-defined]
            for f, column, pre_save in getters
        }
        for obj in objs
    ]
    params.append(_dumps(rows))
    return sql


def lead_insert_with(
    lead: Lead, dependents: list[tuple[list[Model], dict[str, str]]], advance: RotationState | None
) -> list[int | None]:
    """INSERTs the lead and the rows that go with it (assignment, audit events, outbox), and
    UPDATEs the rotation row when `advance` is given, in one statement (data-modifying CTEs):
    under a hot group's lock, every round trip saved is saved once per lead for the whole
    group. `dependents` are (rows of one model, {field: SQL}) with LEAD_ID where the new
    lead's id goes. Returns the lead's id, then the first id of each dependent's rows."""
    params: list[Any] = []
    ctes = [f"new_lead AS ({_insert(Lead, [lead], {}, params)})"]
    for n, (objs, refs) in enumerate(dependents):
        ctes.append(f"d{n} AS ({_insert(type(objs[0]), objs, refs, params)})")
    if advance is not None:
        advance.updated_at = timezone.now()
        ctes.append(
            f"advance AS (UPDATE {_qn(RotationState._meta.db_table)} SET pointer = %s, "  # noqa: S608
            "current_weights = %s::jsonb, turns = %s, updated_at = %s WHERE group_id = %s)"
        )
        params += [
            advance.pointer,
            json.dumps(advance.current_weights),
            advance.turns,
            advance.updated_at,
            advance.group_id,
        ]
    selects = ["(SELECT id FROM new_lead)", *(f"(SELECT min(id) FROM d{n})" for n in range(len(dependents)))]  # noqa: S608
    with server_bound_cursor() as cursor:
        cursor.execute(f"WITH {', '.join(ctes)} SELECT {', '.join(selects)}", params)
        row = cursor.fetchone()
    assert row is not None
    return list(row)


def intake_begin(*, email_normalized: str, lock_timeout_ms: int) -> int | None:
    """The routing transaction's first statement: its lock timeout (SET LOCAL), the same bound
    on each later statement (PostgreSQL counts lock_timeout per lock: a request queued behind
    another waiter for a row waits for its place, then again for the holder), and the email's
    advisory lock, which serializes intake of one address so two concurrent posts cannot both
    miss dedup. The dedup check must be a later statement: its snapshot has to follow the lock.
    Returns the configuration version (routing_project/configcache.py), before any write."""
    with server_bound_cursor() as cursor:
        cursor.execute(
            "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true), "
            "pg_advisory_xact_lock(hashtextextended(%s, 0)), "
            "(SELECT version FROM rotation_configversion WHERE id = 1)",
            [f"{lock_timeout_ms}ms", f"{lock_timeout_ms}ms", email_normalized],
        )
        row = cursor.fetchone()
    return None if row is None or row[3] is None else int(row[3])


# --- batches: several intakes in one transaction (leads/batching.py) ---------------------------


def intake_begin_many(*, emails: list[str], lock_timeout_ms: int) -> int | None:
    """`intake_begin` for a batch: the lock timeout, then every email's advisory lock, taken
    in the order of the lock keys, the one order of every holder of several email locks (a
    CSV import takes them so too, leads/bulk.py): two batches, or a batch and an import, never
    wait on each other in a cycle (a single intake holds one email lock). Returns the
    configuration version."""
    with server_bound_cursor() as cursor:
        # One statement: the target list runs in order, so the timeout is set before any wait.
        cursor.execute(
            "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', %s, true), "
            "(SELECT count(pg_advisory_xact_lock(k)) FROM "
            "(SELECT DISTINCT hashtextextended(e, 0) AS k FROM unnest(%s::text[]) AS e ORDER BY k) AS keys), "
            "(SELECT version FROM rotation_configversion WHERE id = 1)",
            [f"{lock_timeout_ms}ms", f"{lock_timeout_ms}ms", emails],
        )
        row = cursor.fetchone()
    return None if row is None or row[3] is None else int(row[3])


def open_leads_newest(*, emails: list[str], statuses: tuple[str, ...], since: datetime) -> dict[str, datetime]:
    """For each of these emails with a lead in `statuses` created since `since`: the newest
    one's creation time (the batch's dedup check, one statement).

    One index probe per email (a lateral subquery on email_normalized = that email): with
    `email_normalized = ANY(...)` a young table's missing statistics led the planner to scan
    every open lead by status and filter on the email, a cost growing with the table."""
    table = _qn(Lead._meta.db_table)
    with server_bound_cursor() as cursor:
        cursor.execute(
            "SELECT e.email, newest.at FROM unnest(%s::text[]) AS e(email) CROSS JOIN LATERAL "  # noqa: S608 - identifiers from the models
            f"(SELECT max(created_at) AS at FROM {table} WHERE email_normalized = e.email "
            "AND status = ANY(%s::text[]) AND created_at >= %s) AS newest WHERE newest.at IS NOT NULL",
            [emails, [str(s) for s in statuses], since],
        )
        return dict(cursor.fetchall())


BATCH_LEAD_ID = "(SELECT id FROM numbered WHERE numbered.n = %s)"  # a dependent's lead, by its place


def batch_write(
    leads: list[Lead], dependents: list[tuple[list[Model], dict[str, str]]], advances: list[RotationState]
) -> tuple[list[int], list[list[int]]]:
    """Writes a batch in one statement: its leads, the rows that go with them and the rotation
    rows' advances. A dependent row's `lead_id` holds the 1-based place of its lead in `leads`
    (BATCH_LEAD_ID in its refs turns it into the new id). Returns the leads' ids and each
    dependent list's ids, in the order given (a sequence numbers the rows of one INSERT in
    order)."""
    params: list[Any] = []
    ctes = [
        f"new_leads AS ({_insert(Lead, leads, {}, params)})",
        "numbered AS (SELECT id, row_number() OVER (ORDER BY id) AS n FROM new_leads)",
    ]
    selects = ["(SELECT array_agg(id ORDER BY id) FROM new_leads)"]
    for n, (objs, refs) in enumerate(dependents):
        if objs:
            ctes.append(f"d{n} AS ({_insert(type(objs[0]), objs, refs, params)})")
            selects.append(f"(SELECT array_agg(id ORDER BY id) FROM d{n})")  # noqa: S608
        else:
            selects.append("NULL")
    if advances:
        now = timezone.now()
        for state in advances:
            state.updated_at = now
        rows = [
            {"group_id": s.group_id, "pointer": s.pointer, "weights": s.current_weights, "turns": s.turns}
            for s in advances
        ]
        table = _qn(RotationState._meta.db_table)
        ctes.append(
            f"advance AS (UPDATE {table} s SET pointer = v.pointer, current_weights = v.weights, "  # noqa: S608
            "turns = v.turns, updated_at = %s FROM jsonb_to_recordset(%s::jsonb) "
            "AS v(group_id bigint, pointer integer, weights jsonb, turns integer) WHERE s.group_id = v.group_id)"
        )
        params += [now, json.dumps(rows)]
    with server_bound_cursor() as cursor:
        cursor.execute(f"WITH {', '.join(ctes)} SELECT {', '.join(selects)}", params)
        row = cursor.fetchone()
    assert row is not None
    lead_ids = list(row[0])
    for lead, lead_id in zip(leads, lead_ids, strict=True):
        lead.id = lead_id
        lead._state.adding = False
    return lead_ids, [list(ids or []) for ids in row[1:]]


def idempotency_store_many(rows: list[tuple[IdempotencyRecord, int, bytes, int]], *, done: str) -> int:
    """Stores a batch's answers to Idempotency-Key requests (claimed record, status, body, lead
    id) in one statement, as `services._idempotency_store` does one by one: only into claims
    still in flight as claimed (not taken over by a retry). Returns how many were stored."""
    table = _qn(IdempotencyRecord._meta.db_table)
    values = [
        {
            "id": record.pk,
            "created_at": record.created_at.isoformat(),
            "status": status,
            "body": base64.b64encode(body).decode(),
            "lead_id": lead_id,
        }
        for record, status, body, lead_id in rows
    ]
    with server_bound_cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} i SET state = %s, response_status = v.status, "  # noqa: S608 - identifiers from the models
            "response_body = decode(v.body, 'base64'), lead_id = v.lead_id "
            "FROM jsonb_to_recordset(%s::jsonb) "
            "AS v(id bigint, created_at timestamptz, status integer, body text, lead_id bigint) "
            "WHERE i.id = v.id AND i.state = %s AND i.created_at = v.created_at",
            [str(done), json.dumps(values), str(IdempotencyRecord.State.IN_FLIGHT)],
        )
        return cursor.rowcount
