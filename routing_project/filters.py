"""Query filters that say what is wrong instead of ignoring it."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import extend_schema_field
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.views import APIView


class FilterBackend(DjangoFilterBackend):
    """django-filter's backend, whose 400 also names the bad page parameters: a list request
    is checked whole, not its filters first and its paging on the next try."""

    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: APIView) -> QuerySet[Any]:
        try:
            return super().filter_queryset(request, queryset, view)
        except ValidationError as exc:
            paginator = getattr(view, "paginator", None)
            query_errors = getattr(paginator, "query_errors", None)
            if query_errors is None or not isinstance(exc.detail, dict):
                raise
            raise ValidationError({**exc.detail, **query_errors(request)}) from None


class StrictFilterSet(django_filters.FilterSet):
    """A filter parameter given empty (`?created_after=`, `?group=`) or twice
    (`?owner=1&owner=2`) is a 400 naming it, rather than silently ignored: a client that meant
    to filter (a template whose slug was left blank) learns it did not, instead of reading
    every lead."""

    def is_valid(self) -> bool:
        valid = super().is_valid()
        getlist = getattr(self.data, "getlist", None)
        for name in self.filters:
            if name not in self.data:
                continue
            values = getlist(name) if getlist else [self.data.get(name)]
            problem = None
            if len(values) > 1:
                problem = "Give this parameter once."
            elif values[0] == "":
                problem = "Give a value, or leave the parameter out."
            if problem:
                self.form.add_error(name, problem)
                valid = False
        return valid


# A positive offset written into a URL unencoded (`?created_after=2026-01-05T09:00:00+01:00`,
# what `datetime.isoformat()` gives) reaches us with its "+" decoded as a space. After a time
# ("T" then hh:mm), a space then hh[:mm] can only have been that "+".
_OFFSET_PLUS_AS_SPACE = re.compile(r"(T\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?) (\d{2}(?::?\d{2})?)\Z")


class UtcDateTimeField(django_filters.fields.IsoDateTimeField):
    """An ISO 8601 date-time, converted to UTC here: any offset Python accepts (up to ±24 h)
    becomes a value the database takes, and an instant out of range is a 400, not a 500."""

    def to_python(self, value: Any) -> datetime | None:
        if isinstance(value, str):
            value = _OFFSET_PLUS_AS_SPACE.sub(r"\1+\2", value.strip())
        parsed = super().to_python(value)
        if parsed is None:
            return None
        try:
            return parsed.astimezone(UTC)
        except (OverflowError, ValueError):
            raise forms.ValidationError("Out of range.", code="invalid") from None


class UtcDateTimeFilter(django_filters.IsoDateTimeFilter):
    field_class = UtcDateTimeField


@extend_schema_field({"type": "string", "minLength": 1, "maxLength": 64})
class SlugFilter(django_filters.CharFilter):
    """A group's slug: given empty, a 400 (StrictFilterSet), never every row."""


@extend_schema_field({"type": "boolean"})
class TrueFalseFilter(django_filters.TypedChoiceFilter):
    """`true` or `false`; anything else is a 400 naming the parameter (django-filter's own
    boolean filter ignores a value it cannot read, and the list comes back unfiltered)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("choices", [("true", "true"), ("false", "false")])
        kwargs.setdefault("coerce", lambda value: value == "true")
        super().__init__(*args, **kwargs)
