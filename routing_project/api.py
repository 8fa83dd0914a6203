"""Pieces every app's API shares."""

from typing import Any

from rest_framework import serializers


class RejectUnknownFieldsMixin:
    """A request naming a field the resource does not have is a 400 naming that field,
    reported together with every other bad field."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": [f"Expected a JSON object, got {type(data).__name__}."]}
            )
        writable = {name for name, f in self.fields.items() if not f.read_only}  # type: ignore[attr-defined]
        unknown = sorted(set(data) - writable)
        errors: dict[str, Any] = {}
        try:
            value = super().to_internal_value(data)  # type: ignore[misc]
        except serializers.ValidationError as exc:
            errors.update(exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail})
            value = None
        for name in unknown:
            readonly = name in self.fields  # type: ignore[attr-defined]
            errors[str(name)[:100]] = ["This field is read-only." if readonly else "Unknown field."]
        if errors:
            raise serializers.ValidationError(errors)
        return value
