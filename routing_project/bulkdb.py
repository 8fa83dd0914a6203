"""Fast bulk writes for batch jobs: PostgreSQL COPY, with ids taken from the sequence first,
and updates of many rows from arrays.

`bulk_create` pays for every value in Python (field preparation, array adaptation); COPY
streams rows to the server in one command. `bulk_update` builds a `CASE WHEN id = ...` per
row and field and resolves each as an expression: most of the time of a burst of
escalations went there; `objects_update` sends one array per column instead. Rows go in the
caller's transaction. On other databases (the embedded SQLite default) they fall back to
`bulk_create` and `bulk_update`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

import orjson
from django.db import connection, models
from psycopg import sql


def _json(value: Any) -> str:
    """JSON text for a jsonb column (orjson: several times json's speed; keys as json makes
    them), or the standard library's for what orjson refuses (integers past 64 bits, which a
    lead's attributes may hold, as intake's do)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value)


def ids_reserve(model: type[models.Model], n: int) -> list[int]:
    """`n` new primary keys from the table's sequence (PostgreSQL), in ascending order."""
    if n <= 0:
        return []
    table, pk = model._meta.db_table, model._meta.pk.column  # type: ignore[union-attr]
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, %s)) FROM generate_series(1, %s)", [table, pk, n])
        return sorted(row[0] for row in cursor.fetchall())


def rows_copy(model: type[models.Model], columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """COPY rows (tuples in `columns` order, database column names) into the model's table.
    JSON columns take Python dicts and lists; everything else its plain Python value."""
    json_columns = {i for i, name in enumerate(columns) if isinstance(_field_by_column(model, name), models.JSONField)}
    if json_columns:
        rows = ([_json(v) if i in json_columns else v for i, v in enumerate(row)] for row in rows)
    return _copy(model, columns, rows)


def _copy(model: type[models.Model], columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> int:
    """COPY ready rows (JSON already text)."""
    statement = sql.SQL("COPY {} ({}) FROM STDIN").format(
        sql.Identifier(model._meta.db_table), sql.SQL(", ").join(sql.Identifier(c) for c in columns)
    )
    n = 0
    with connection.cursor() as cursor:
        raw = cursor.cursor  # the psycopg cursor under Django's wrapper
        with raw.copy(statement) as copy:
            for row in rows:
                copy.write_row(row)
                n += 1
    return n


def objects_create(model: type[models.Model], objs: Sequence[models.Model]) -> None:
    """`bulk_create` of unsaved instances with plain values (no save() or pre_save hooks):
    on PostgreSQL their ids are taken from the sequence and set on them, and the rows
    COPYed, without compiling an INSERT of every value."""
    if not objs:
        return
    if not supports_copy():
        model._default_manager.bulk_create(objs)
        return
    for obj, pk in zip(objs, ids_reserve(model, len(objs)), strict=True):
        obj.pk = pk
    fields = model._meta.concrete_fields
    rows_copy(model, [f.column for f in fields], ([getattr(o, f.attname) for f in fields] for o in objs))
    for obj in objs:
        obj._state.adding, obj._state.db = False, connection.alias


def rows_insert(model: type[models.Model], rows: Sequence[dict[str, Any]]) -> int:
    """Writes rows given as {attname: value} (missing fields take their defaults, evaluated
    once per call: no per-row generated defaults; keys that are not fields are ignored). The
    primary key is written when the rows carry it."""
    if not rows:
        return 0
    with_pk = model._meta.pk.attname in rows[0]  # type: ignore[union-attr]
    fields = [f for f in model._meta.concrete_fields if with_pk or not f.primary_key]
    if not supports_copy():
        names = {f.attname for f in fields}
        model._default_manager.bulk_create([model(**{k: v for k, v in r.items() if k in names}) for r in rows])
        return len(rows)
    # One pass per row: the value (or the field's default), JSON columns encoded here.
    spec = [(f.attname, f.get_default(), isinstance(f, models.JSONField)) for f in fields]
    return _copy(
        model,
        [f.column for f in fields],
        ([_json(r.get(a, d)) if j else r.get(a, d) for a, d, j in spec] for r in rows),
    )


def objects_update(model: type[models.Model], objs: Sequence[models.Model], fields: Sequence[str]) -> int:
    """Saves `fields` (names, as for `bulk_update`) of saved instances, each row its own
    values, in one `UPDATE ... FROM unnest(arrays)` (no save() or pre_save hooks run, as with
    `bulk_update`). Returns the rows updated."""
    if not objs:
        return 0
    if not supports_copy():
        return model._default_manager.bulk_update(objs, fields)
    pk = model._meta.pk
    assert pk is not None
    chosen = [model._meta.get_field(name) for name in fields]
    columns: list[models.Field] = [pk, *chosen]  # type: ignore[list-item]
    arrays = [[f.get_db_prep_save(getattr(o, f.attname), connection) for o in objs] for f in columns]
    sets: list[sql.Composable] = [sql.SQL("{0} = v.{0}").format(sql.Identifier(f.column)) for f in columns[1:]]
    casts: list[sql.Composable] = [sql.SQL("%s::{}[]").format(sql.SQL(f.db_type(connection) or "")) for f in columns]
    names: list[sql.Composable] = [sql.Identifier(f.column) for f in columns]
    statement = sql.SQL(
        "UPDATE {table} AS t SET {sets} FROM unnest({arrays}) AS v({names}) WHERE t.{pk} = v.{pk}"
    ).format(
        table=sql.Identifier(model._meta.db_table),
        sets=sql.SQL(", ").join(sets),
        arrays=sql.SQL(", ").join(casts),
        names=sql.SQL(", ").join(names),
        pk=sql.Identifier(pk.column),
    )
    with connection.cursor() as cursor:
        cursor.execute(statement.as_string(cursor.cursor), arrays)
        return cursor.rowcount


def _field_by_column(model: type[models.Model], column: str) -> models.Field:
    for f in model._meta.concrete_fields:
        if f.column == column:
            return f  # type: ignore[return-value]
    raise ValueError(f"{model.__name__} has no column {column!r}")


def supports_copy() -> bool:
    return connection.vendor == "postgresql"
