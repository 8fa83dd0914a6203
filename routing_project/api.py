"""Pieces every app's API shares."""

from typing import Any

from rest_framework import serializers

# JSON types the API's schema promises for a field, and DRF's own wording when they are wrong.
# DRF's fields coerce (5 to "5" for a CharField, "5" to 5 for an IntegerField, "yes" to True),
# which suits form posts and CSV files but makes a JSON request the schema rejects succeed.
_JSON_TYPES: tuple[tuple[type[serializers.Field], tuple[type, ...], str], ...] = (
    (serializers.BooleanField, (bool,), "Must be a valid boolean."),
    (serializers.CharField, (str,), "Not a valid string."),
    (serializers.IntegerField, (int,), "A valid integer is required."),
    (serializers.FloatField, (int, float), "A valid number is required."),
    (serializers.DecimalField, (int, float), "A valid number is required."),
)


def json_type_error(field: serializers.Field, value: Any) -> str | None:
    """DRF's message when `value` is not of the JSON type `field` is documented with (None is
    left to the field's allow_null)."""
    if value is None:
        return None
    if isinstance(field, serializers.DecimalField) and field.coerce_to_string and isinstance(value, str):
        return None  # such a decimal is documented as a string
    for field_class, types, message in _JSON_TYPES:
        if isinstance(field, field_class):
            wrong = isinstance(value, bool) and bool not in types
            return message if wrong or not isinstance(value, types) else None
    return None


class RejectUnknownFieldsMixin:
    """A request naming a field the resource does not have is a 400 naming that field,
    reported together with every other bad field; so is a value of the wrong JSON type
    (a number for a string, a string for an integer), unless the serializer's context says
    `lenient_types` (form posts and CSV rows, where every value arrives as text)."""

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": [f"Expected a JSON object, got {type(data).__name__}."]}
            )
        fields = self.fields  # type: ignore[attr-defined]
        writable = {name for name, f in fields.items() if not f.read_only}
        unknown = sorted(set(data) - writable)
        errors: dict[str, Any] = {}
        try:
            value = super().to_internal_value(data)  # type: ignore[misc]
        except serializers.ValidationError as exc:
            errors.update(exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail})
            value = None
        if not self.context.get("lenient_types"):  # type: ignore[attr-defined]
            for name in writable & set(data):
                if name not in errors and (message := json_type_error(fields[name], data[name])):
                    errors[name] = [message]
        for name in unknown:
            readonly = name in fields
            errors[str(name)[:100]] = ["This field is read-only." if readonly else "Unknown field."]
        if errors:
            raise serializers.ValidationError(errors)
        return value
