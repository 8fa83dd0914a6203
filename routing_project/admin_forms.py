"""Form pieces the admin's model forms share."""

from __future__ import annotations

from typing import Any

from django import forms
from django.core.exceptions import ValidationError
from django.db import models
from django.forms.fields import InvalidJSONInput, JSONString

from .api import json_loads_client


class ClientJSONFormField(forms.JSONField):
    """A JSON field that parses as the API does (`json_loads_client`): NaN, Infinity, a lone
    UTF-16 surrogate or nesting too deep is a form error, where Django's would let it through
    to a 500 (PostgreSQL refuses NaN in jsonb) or fail parsing it."""

    def to_python(self, value: Any) -> Any:
        if self.disabled:
            return value
        if value in self.empty_values:
            return None
        if isinstance(value, list | dict | int | float | JSONString):
            return value
        try:
            converted = json_loads_client(value)
        except ValueError as exc:
            raise ValidationError(f"Enter valid JSON: {exc}.", code="invalid") from None
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return json_loads_client(data)
        except ValueError:
            return InvalidJSONInput(data)


# For a ModelAdmin: `formfield_overrides = STRICT_JSON`.
STRICT_JSON: dict[type[models.Field], dict[str, Any]] = {models.JSONField: {"form_class": ClientJSONFormField}}
