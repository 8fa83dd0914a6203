"""Pieces every app's API shares."""

import codecs
import json
import math
import re
from collections.abc import Iterable
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.urls import reverse
from drf_spectacular.extensions import OpenApiSerializerFieldExtension
from drf_spectacular.utils import OpenApiParameter
from rest_framework import parsers, serializers
from rest_framework.exceptions import NotAcceptable, ParseError
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer
from rest_framework.utils import json as drf_json

from rotation.domains import domain_ascii

# JSON types the API's schema promises for a field, and DRF's own wording when they are wrong.
# DRF's fields coerce (5 to "5" for a CharField, "5" to 5 for an IntegerField, "yes" to True),
# which suits form posts and CSV files but makes a JSON request the schema rejects succeed.
_JSON_TYPES: tuple[tuple[type[serializers.Field], tuple[type, ...], str], ...] = (
    (serializers.BooleanField, (bool,), "Must be a valid boolean."),
    (serializers.CharField, (str,), "Not a valid string."),
    (serializers.IntegerField, (int,), "A valid integer is required."),
    (serializers.FloatField, (int, float), "A valid number is required."),
    (serializers.DecimalField, (int, float), "A valid number is required."),
    # An id: 4.5 or "4" is not rep 4.
    (serializers.PrimaryKeyRelatedField, (int,), "Incorrect type. Expected pk value (an integer)."),
)


def json_type_error(field: serializers.Field, value: Any) -> str | None:
    """DRF's message when `value` is not of the JSON type `field` is documented with (None is
    left to the field's allow_null)."""
    if value is None:
        return None
    documented_as_text = isinstance(field, DecimalField) or getattr(field, "coerce_to_string", False)
    if isinstance(field, serializers.DecimalField) and documented_as_text and isinstance(value, str):
        return None  # a decimal as text ("0.05", exact): the field parses it or names the problem
    for field_class, types, message in _JSON_TYPES:
        if isinstance(field, field_class):
            wrong = isinstance(value, bool) and bool not in types
            return message if wrong or not isinstance(value, types) else None
    return None


MAX_EMAIL = 254  # the email columns' length


def ascii_email(value: str) -> str:
    """An address as stored and answered: trimmed, its domain in ASCII (IDNA: `bücher.example`
    is `xn--bcher-kva.example`), so that every answer holding it is the schema's `email`.
    The ASCII form is longer, and must still fit the column: checked here, not by the database.

    The local part is ASCII too: Django's validator, which refuses "josé@", matches its
    letters ignoring case and so lets through the few others that fold to ASCII ("İ", the
    Kelvin sign, the long "ſ"), which lower-casing for dedup would lengthen past the column
    ("İ" is two characters in lower case) or leave apart from their ASCII twins."""
    value = value.strip()
    local, at, domain = value.rpartition("@")
    if not local.isascii():
        raise serializers.ValidationError("Enter a valid email address.")
    if not at or domain.isascii():
        return value
    try:
        value = f"{local}@{domain_ascii(domain)}"
    except UnicodeError:
        raise serializers.ValidationError("Enter a valid email address.") from None
    if len(value) > MAX_EMAIL:
        raise serializers.ValidationError(
            f"Ensure this field has no more than {MAX_EMAIL} characters once its domain is in ASCII "
            f"(it has {len(value)})."
        )
    return value


class DecimalField(serializers.DecimalField):
    """A decimal given as a JSON number (0.5) or, exactly, as text ("0.5"); answered as a number.
    Its schema states its limits (DecimalFieldSchema).

    A JSON number is a binary float: one with more decimal places than the field keeps (1.234)
    is rounded to them, half up, as the schema's number form (a minimum and a maximum, no
    step) allows it; its range is checked before rounding, so 0.004 stays under a minimum of
    0.01. Text is exact: ASCII digits with an optional fraction, as its pattern says (Python's
    Decimal would read "1e3", " 7 ", "1_000", "+5", ".5" and other scripts' digits); more
    places than the field keeps is a 400."""

    _TEXT = re.compile(r"[0-9]+(?:\.[0-9]+)?")

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("coerce_to_string", False)
        super().__init__(**kwargs)

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if isinstance(data, str):
            return (False, data)  # "" is no number (DRF reads it as null): only null is null
        return super().validate_empty_values(data)

    def to_internal_value(self, data: Any) -> Decimal:
        if isinstance(data, str) and not self._TEXT.fullmatch(data):
            raise serializers.ValidationError(
                "Write the number with the digits 0-9 and a point for a fraction (7, 0.5, 12.25), or as a JSON number."
            )
        if isinstance(data, float) and self.decimal_places is not None and math.isfinite(data):
            raw = Decimal(repr(data))
            if self.min_value is not None and raw < self.min_value:
                self.fail("min_value", min_value=self.min_value)
            if self.max_digits is not None:
                top = Decimal(10) ** (self.max_digits - self.decimal_places) - Decimal(10) ** -self.decimal_places
                if raw > top:
                    raise serializers.ValidationError(f"Ensure this value is less than or equal to {top}.")
            data = raw.quantize(Decimal(10) ** -self.decimal_places, rounding=ROUND_HALF_UP)
        return super().to_internal_value(data)


class DecimalFieldSchema(OpenApiSerializerFieldExtension):
    """`DecimalField` in the schema: in a request, a number, or text of at most its digits and
    places, within its minimum and maximum, so that a request the schema allows is one the
    field takes; in an answer, the number it is answered as."""

    target_class = DecimalField

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        field = self.target
        places, digits = field.decimal_places, field.max_digits
        number: dict[str, Any] = {"type": "number"}
        if field.min_value is not None:
            number["minimum"] = float(field.min_value)
        if digits is not None and places is not None:
            number["maximum"] = float(Decimal(10) ** (digits - places) - Decimal(10) ** -places)
        if direction == "response" and not field.coerce_to_string:
            return number  # answered as a number, never as its text
        whole = f"{{1,{digits - places}}}" if digits is not None and places is not None else "+"
        fraction = rf"(\.\d{{1,{places}}})?" if places else ""
        text: dict[str, Any] = {"type": "string", "pattern": rf"^\d{whole}{fraction}$", "example": "0.5"}
        if field.min_value is not None and field.min_value > 0:
            text["not"] = {"pattern": r"^0+(\.0+)?$"}  # zero, however written, is under the minimum
        limits = f"at most {places} decimal places" if places is not None else "a decimal"
        return {"oneOf": [number, text], "description": f"A number or its text, {limits}."}


class ContentNegotiation(DefaultContentNegotiation):
    """`?format=` naming a format no renderer offers is a 406 saying so, as an Accept header
    naming none is (DRF's default answers it with a bare 404, as if the resource were missing);
    an empty Accept header is no header.
    The schema's `?format=json` still picks its JSON renderer.

    A body of a structured JSON type (`application/<name>+json`, RFC 6839: a JSON:API client's
    `application/vnd.api+json`, a PATCH sent as `application/merge-patch+json`, whose meaning
    is this API's partial update) is read as JSON, as signed intake reads it. JSON Patch
    (`application/json-patch+json`, a list of operations) is not what it looks like here: 415."""

    def select_parser(self, request: Any, offered: Iterable[parsers.BaseParser]) -> parsers.BaseParser | None:
        offered = list(offered)
        chosen = super().select_parser(request, offered)
        if chosen is None and structured_json(request.content_type):
            chosen = next((p for p in offered if p.media_type == "application/json"), None)
        return chosen

    def get_accept_list(self, request: Any) -> list[str]:
        """An Accept header sent empty (`Accept:`, as some HTTP libraries send when told to
        send none) is read as no header, any type: DRF read it as naming none, a 406."""
        header = request.META.get("HTTP_ACCEPT", "")
        return super().get_accept_list(request) if header.strip() else ["*/*"]

    def filter_renderers(self, renderers: Iterable[BaseRenderer], format: str) -> list[BaseRenderer]:  # noqa: A002
        kept = [renderer for renderer in renderers if renderer.format == format]
        if not kept:
            offered = ", ".join(sorted({renderer.format for renderer in renderers}))
            raise NotAcceptable(f"Format '{format[:50]}' is not offered here; this resource answers in: {offered}.")
        return kept


def structured_json(content_type: str | None) -> bool:
    """`application/<name>+json` (RFC 6839's structured syntax suffix), JSON Patch excepted."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media.startswith("application/") and media.endswith("+json") and media != "application/json-patch+json"


CREATED_LOCATION = OpenApiParameter(
    "Location", str, OpenApiParameter.HEADER, required=True, response=[201], description="The new resource's URL."
)


class CreatedLocationMixin:
    """A 201 says where the resource it created lives (`Location`), as intake's does: a
    client that created a group, rep, rule, membership or absence addresses it next (PATCH,
    DELETE) without building the URL itself. DRF's own header needs a `url` field in the body,
    which these resources do not have. `location_field` is the body's field that the detail
    route takes (slug, id, or the member's rep id)."""

    location_field = "id"

    def get_success_headers(self, data: Any) -> dict[str, str]:
        lookup = self.lookup_url_kwarg or self.lookup_field  # type: ignore[attr-defined]
        kwargs = {**self.kwargs, lookup: data[self.location_field]}  # type: ignore[attr-defined]
        return {"Location": reverse(f"{self.basename}-detail", kwargs=kwargs)}  # type: ignore[attr-defined]


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
        fixed = getattr(self, "fixed_fields", ())  # the resource has them; this request cannot set them
        for name in unknown:
            readonly = name in fields or name in fixed
            errors[str(name)[:100]] = ["This field is read-only." if readonly else "Unknown field."]
        if errors:
            raise serializers.ValidationError(errors)
        return value


# --- JSON bodies -----------------------------------------------------------------------------

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _object_once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose names are unique: with one twice (`{"email": "a@x", "email":
    "b@y"}`) parsers disagree on which counts (Python's the last, many the first), so a proxy
    or a log that read one and the router that took the other would tell two stories."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for name, _value in pairs:
            if name in seen:
                raise ValueError(f"the name {name[:64]!r} appears more than once in one object")
            seen.add(name)
    return obj


def json_loads_client(text: str) -> Any:
    """`json.loads` for a client's body, with NaN and Infinity refused, and a name given twice
    in one object (`_object_once_each`). Raises ValueError with
    a message a client can act on also where the standard parser would go on or fail hard: a
    lone UTF-16 surrogate ("\\ud800", which Python accepts but no UTF-8 text, PostgreSQL's
    jsonb included, can hold) and nesting too deep to parse (RecursionError)."""
    try:
        data = json.loads(text, parse_constant=drf_json.strict_constant, object_pairs_hook=_object_once_each)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    # A surrogate can only arrive escaped: look for one only when the text has such an escape.
    if _SURROGATE_ESCAPE.search(text):
        try:
            json.dumps(data, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError("a string holds a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
    return data


class StrictJSONParser(parsers.JSONParser):
    """DRF's JSON parser with `json_loads_client`'s checks: each is a 400, never a 500."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        # The request's charset: any codec Python knows (Django keeps only a known one).
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        try:
            # bytes.decode, not codecs.getreader: it takes text encodings only, where a reader
            # of rot13, zlib, bz2 or quopri fails in ways of its own (TypeError, zlib.error,
            # OSError) and one of base64 decodes into bytes.
            text = stream.read().decode(encoding)
            if codecs.lookup(encoding).name != "utf-8":
                # UTF-8 never decodes to a lone surrogate; unicode_escape or utf-7 can, from
                # plain ASCII, leaving no "\ud800" escape for json_loads_client to find.
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    raise ValueError("the body holds a lone UTF-16 surrogate (\\ud800-\\udfff)") from None
            return json_loads_client(text)
        except LookupError:
            raise ParseError(f"JSON parse error - '{encoding[:40]}' is not a text encoding: send UTF-8.") from None
        except ValueError as exc:  # UnicodeDecodeError included
            raise ParseError(f"JSON parse error - {exc}") from None
