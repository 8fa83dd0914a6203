"""Pieces that keep the admin's big list pages (leads, the audit trail, deliveries) fast.

Django's defaults read the whole table on every page view: the date hierarchy's drill-down
(`SELECT DISTINCT date_trunc(...)`), a list filter on a plain text column (`SELECT DISTINCT
column`) and the paginator's `COUNT(*)`. What replaces them here answers from an index or
from the planner's statistics instead.
"""

from __future__ import annotations

import json
from contextlib import suppress
from datetime import datetime, time
from functools import cached_property
from typing import Any

from django.contrib import admin
from django.core.exceptions import EmptyResultSet
from django.core.paginator import Page, Paginator
from django.db import connections
from django.db.models import QuerySet
from django.utils import timezone
from django.utils.dateparse import parse_date, parse_datetime

# Below this many rows (by the planner's estimate) a page counts them exactly.
EXACT_COUNT_UP_TO = 20_000
# Past the count, pages open up to this one: further is past any table here, and its OFFSET
# would overflow PostgreSQL's bigint (a server error) long before it found a row.
LAST_OPEN_PAGE = 10_000_000


class EstimatedCountPaginator(Paginator):
    """Counts exactly up to EXACT_COUNT_UP_TO rows; past that (PostgreSQL only), the page says
    "about N", from the planner's estimate: an exact `COUNT(*)` of hundreds of thousands of rows
    costs more than the rest of the page. Page links past the true end show an empty page, and
    pages past the estimate still open (an estimate under the true count left the last pages
    of 200,000 leads unreachable).

    Where the estimate is low and the rows are many (a substring search, whose match the planner
    guesses at a few hundred rows, found 150,000), the exact count stops after EXACT_COUNT_UP_TO
    rows and the page says "more than" that: counting them all was most of a second."""

    estimated = False
    at_least = False

    @cached_property
    def count(self) -> int:
        queryset = self.object_list
        if not isinstance(queryset, QuerySet) or connections[queryset.db].vendor != "postgresql":
            return super().count
        estimate = _planner_rows(queryset)
        if estimate is None or estimate <= EXACT_COUNT_UP_TO or _never_analysed(queryset):
            counted = queryset.order_by()[: EXACT_COUNT_UP_TO + 1].count()
            if counted <= EXACT_COUNT_UP_TO:
                return counted
            self.at_least = True
            return EXACT_COUNT_UP_TO
        self.estimated = True
        return estimate

    @property
    def count_prefix(self) -> str:
        return "more than" if self.at_least else "about" if self.estimated else ""

    @property
    def open_ended(self) -> bool:
        """The rows may go on past `count`: a later page is read, not refused."""
        return bool(self.count) and (self.at_least or self.estimated)

    def validate_number(self, number: Any) -> int:
        if self.open_ended:
            with suppress(TypeError, ValueError):
                if 1 <= int(number) <= LAST_OPEN_PAGE:
                    return int(number)
        return super().validate_number(number)

    def page(self, number: Any) -> Page:
        number = self.validate_number(number)
        if not self.open_ended:
            return super().page(number)
        bottom = (number - 1) * self.per_page
        return Page(self.object_list[bottom : bottom + self.per_page], number, self)


def _never_analysed(queryset: QuerySet[Any]) -> bool:
    """The table has no statistics yet (never analysed, autovacuum off or not come by): the
    planner guesses from its size on disk, and an update-heavy table (the outbox) read as
    7 times its rows. Counted then, up to EXACT_COUNT_UP_TO."""
    with connections[queryset.db].cursor() as cursor:
        cursor.execute("SELECT reltuples FROM pg_class WHERE oid = %s::regclass", [queryset.model._meta.db_table])
        row = cursor.fetchone()
    return row is None or row[0] < 0


def _planner_rows(queryset: QuerySet[Any]) -> int | None:
    try:
        sql, params = queryset.order_by().values("pk").query.sql_with_params()
    except EmptyResultSet:
        # A filter that can match nothing, such as an id past the column's range in the
        # address (`?lead_id=99999999999999999999`): Django compiles it to no SQL at all.
        return 0
    with connections[queryset.db].cursor() as cursor:
        cursor.execute(f"EXPLAIN (FORMAT JSON) {sql}", params)  # noqa: S608 - Django's own SQL
        plan = cursor.fetchone()[0]
    if isinstance(plan, str):
        plan = json.loads(plan)
    rows = plan[0]["Plan"].get("Plan Rows")
    return int(rows) if rows is not None else None


def distinct_indexed_values(table: str, column: str) -> list[str]:
    """The distinct values of an indexed text column, by skipping through its index (one index
    probe per value) where `SELECT DISTINCT` would read every row."""
    connection = connections["default"]
    qn = connection.ops.quote_name
    t, c = qn(table), qn(column)
    if connection.vendor != "postgresql":
        # The embedded default (SQLite) takes no parenthesised first term in a recursive CTE;
        # its tables are small, so a plain DISTINCT does.
        with connection.cursor() as cursor:
            cursor.execute(f"SELECT DISTINCT {c} FROM {t} WHERE {c} IS NOT NULL ORDER BY {c}")  # noqa: S608
            return [row[0] for row in cursor.fetchall()]
    sql = (
        f"WITH RECURSIVE v(value) AS ("  # noqa: S608 - names from the models, not from a request
        f" (SELECT {c} FROM {t} ORDER BY {c} LIMIT 1)"
        f" UNION ALL"
        f" SELECT (SELECT {c} FROM {t} WHERE {c} > v.value ORDER BY {c} LIMIT 1) FROM v WHERE v.value IS NOT NULL"
        f") SELECT value FROM v WHERE value IS NOT NULL"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return [row[0] for row in cursor.fetchall()]


class DateRangeFilter(admin.DateFieldListFilter):
    """Django's date ranges (today, past 7 days, this month, this year), and a date typed in the
    address (`?created_at__gte=2026-12-01`, `&created_at__lt=2026-12-08 12:00`) read as it is
    meant: a day is its midnight, and a time without an offset is the site's time zone's, as
    in the filter's own links. Django took such a value as a naive datetime and logged a
    warning for every page. A value that is no date is left to Django, whose list then says
    the address is wrong (`?e=1`), as for any bad filter."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Django (5.0 on) keeps each parameter's values as a list; its stubs say one value.
        used: dict[str, Any] = self.used_parameters
        for key in (self.lookup_kwarg_since, self.lookup_kwarg_until):
            if key in used:
                used[key] = [_aware(value) for value in used[key]]


def _aware(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        moment = parse_datetime(value.strip())
        if moment is None:
            day = parse_date(value.strip())
            if day is None:
                return value
            moment = datetime.combine(day, time())
    except ValueError:  # well formed, no such day or time (2026-02-30)
        return value
    return timezone.make_aware(moment) if timezone.is_naive(moment) else moment
