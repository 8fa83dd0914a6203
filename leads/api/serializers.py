from __future__ import annotations

import copy
from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from audit.models import AuditEvent
from leads.models import LEAD_DATA_FIELDS, Lead
from leads.services import group_by_slug
from rotation.models import Group
from rotation.rules import COUNTRY_CODES, MAX_ATTRIBUTE_KEY, MAX_COMPANY_SIZE
from routing_project.api import RejectUnknownFieldsMixin, ascii_email

MAX_ATTRIBUTES = 50
MAX_ATTRIBUTE_VALUE = 1000


class StrictSerializer(RejectUnknownFieldsMixin, serializers.Serializer):
    """A serializer that rejects unknown top-level fields."""


class OptionalTextField(serializers.CharField):
    """An optional text field that takes `null` as empty: a form service or a client's
    serializer sends a field left empty as null as often as it sends "" or nothing."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(required=False, allow_blank=True, allow_null=True, **kwargs)

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if data is None:
            return True, ""
        return super().validate_empty_values(data)


@extend_schema_field(
    {
        "type": "object",
        "additionalProperties": {
            "oneOf": [{"type": "string", "maxLength": MAX_ATTRIBUTE_VALUE}, {"type": "number"}, {"type": "boolean"}]
        },
        "maxProperties": MAX_ATTRIBUTES,
        "nullable": True,
    }
)
class AttributesField(serializers.Field):
    """A flat object of strings, numbers and booleans; `null` is taken as none (`{}`)."""

    default_error_messages = {"invalid": "Must be a flat object of strings, numbers and booleans."}

    def validate_empty_values(self, data: Any) -> tuple[bool, Any]:
        if data is None:
            return True, {}
        return super().validate_empty_values(data)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        if not isinstance(data, dict):
            self.fail("invalid")
        if len(data) > MAX_ATTRIBUTES:
            raise serializers.ValidationError(f"At most {MAX_ATTRIBUTES} attributes.")
        problems = []
        for key, value in data.items():
            if not key or len(key) > MAX_ATTRIBUTE_KEY or "\x00" in key:
                problems.append(f"Attribute names are 1-{MAX_ATTRIBUTE_KEY} characters, no NUL.")
            elif isinstance(value, bool | int | float):
                if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
                    problems.append(f"'{key}': not a finite number.")
            elif isinstance(value, str):
                if len(value) > MAX_ATTRIBUTE_VALUE:
                    problems.append(f"'{key}': at most {MAX_ATTRIBUTE_VALUE} characters.")
                elif "\x00" in value:
                    problems.append(f"'{key}': NUL characters are not allowed.")
            else:
                problems.append(f"'{key}': must be a string, number or boolean.")
        if problems:
            raise serializers.ValidationError(problems[:10])
        return data

    def to_representation(self, value: Any) -> Any:
        return value


class LeadInSerializer(StrictSerializer):
    """A lead as posted. Every field but `email` is optional, and `null` is taken as not
    given (text as "", the rest as none)."""

    email = serializers.EmailField(max_length=254)
    first_name = OptionalTextField(max_length=100)
    last_name = OptionalTextField(max_length=100)
    company = OptionalTextField(max_length=200)
    phone = OptionalTextField(max_length=40)
    country = OptionalTextField(max_length=2, help_text="ISO 3166-1 alpha-2 code.")
    region = OptionalTextField(max_length=100)
    source = OptionalTextField(max_length=100)  # type: ignore[assignment]
    product = OptionalTextField(max_length=100)
    score = serializers.IntegerField(min_value=0, max_value=100, required=False, allow_null=True)
    company_size = serializers.IntegerField(min_value=0, max_value=MAX_COMPANY_SIZE, required=False, allow_null=True)
    group = serializers.SlugField(
        max_length=64, required=False, allow_null=True, help_text="Used when no rule matches."
    )
    external_id = OptionalTextField(max_length=255)
    attributes = AttributesField(required=False)

    def get_fields(self) -> dict[str, serializers.Field]:
        # Shallow copies of the declared fields: the default deep copy re-creates every field
        # and its validators, about half a millisecond of CPU per lead. A copy gets its own
        # binding (name, parent) and validators; nothing else is written during validation.
        return {name: copy.copy(field) for name, field in self._declared_fields.items()}  # type: ignore[attr-defined]

    def validate_email(self, value: str) -> str:
        ProhibitNullCharactersValidator()(value)
        return ascii_email(value)

    def validate_country(self, value: str) -> str:
        # ASCII first: upper() turns the dotless "ı" and the long "ſ" into I and S.
        code = value.strip().upper() if value.isascii() else "?"
        if code and code not in COUNTRY_CODES:
            raise serializers.ValidationError(f"'{value}' is not an ISO 3166-1 alpha-2 country code.")
        return code

    def validate_group(self, value: str | None) -> Group | None:
        if value is None:
            return None
        group = group_by_slug(value)
        if group is None:
            raise serializers.ValidationError(f"No group with slug '{value}'.")
        return group


class RepBriefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    email = serializers.EmailField()


@extend_schema_field(
    {"type": "object", "additionalProperties": {"oneOf": [{"type": "string"}, {"type": "number"}, {"type": "boolean"}]}}
)
class StoredAttributesField(serializers.JSONField):
    """A lead's attributes as stored: the flat object intake took in."""


@extend_schema_field({"type": "object", "description": "Why, in the words of the part that decided."})
class ExplanationField(serializers.JSONField):
    """An audit event's explanation: always an object."""


class LeadSerializer(serializers.ModelSerializer):
    group: serializers.SlugRelatedField = serializers.SlugRelatedField(
        slug_field="slug", read_only=True, allow_null=True
    )
    owner = RepBriefSerializer(read_only=True, allow_null=True)
    queue_reason = serializers.SerializerMethodField()
    duplicate_of = serializers.SerializerMethodField()
    outcome = serializers.SerializerMethodField()
    attributes = StoredAttributesField(read_only=True)

    class Meta:
        model = Lead
        fields = [
            "id",
            "status",
            "group",
            "owner",
            "assigned_at",
            "sla_due_at",
            "queue_reason",
            "duplicate_of",
            "created_at",
            "accepted_at",
            "closed_at",
            "outcome",
            "escalations",
            *LEAD_DATA_FIELDS,
            "attributes",
        ]
        read_only_fields = fields
        extra_kwargs = {
            "sla_due_at": {
                "help_text": "When the current (or last) assignment is due to be accepted. It stays on an "
                "accepted or closed lead as the time that applied: a lead is overdue while it is assigned, "
                "not accepted, past it. Null with no SLA, or while the lead has no owner (queued)."
            }
        }

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_queue_reason(self, lead: Lead) -> str | None:
        return lead.queue_reason or None if lead.status == "queued" else None

    @extend_schema_field(serializers.IntegerField(allow_null=True))
    def get_duplicate_of(self, lead: Lead) -> int | None:
        return self.context.get("duplicate_of")

    @extend_schema_field(serializers.ChoiceField(choices=Lead.Outcome.choices, allow_null=True))
    def get_outcome(self, lead: Lead) -> str | None:
        return lead.outcome or None


_DATETIME = serializers.DateTimeField()
_DATETIME_FIELDS = frozenset(("assigned_at", "sla_due_at", "created_at", "accepted_at", "closed_at"))


def lead_document(lead: Lead, duplicate_of: int | None = None) -> dict[str, Any]:
    """What `LeadSerializer` gives for a lead, built directly: intake answers every lead with
    it, and a serializer's field set-up costs more CPU than the rest of the answer. The
    serializer stays the schema and serves the other endpoints; a test holds both equal."""
    doc: dict[str, Any] = {}
    for name in LeadSerializer.Meta.fields:
        if name == "group":
            doc[name] = lead.group.slug if lead.group_id is not None and lead.group is not None else None
        elif name == "owner":
            owner = lead.owner if lead.owner_id is not None else None
            doc[name] = {"id": owner.id, "name": owner.name, "email": owner.email} if owner is not None else None
        elif name == "queue_reason":
            doc[name] = lead.queue_reason or None if lead.status == "queued" else None
        elif name == "duplicate_of":
            doc[name] = duplicate_of
        elif name == "outcome":
            doc[name] = lead.outcome or None
        elif name in _DATETIME_FIELDS:
            doc[name] = _DATETIME.to_representation(getattr(lead, name))
        else:
            doc[name] = getattr(lead, name)
    return doc


class AuditEventSerializer(serializers.ModelSerializer):
    lead = serializers.IntegerField(source="lead_id", allow_null=True)
    rep = serializers.IntegerField(source="rep_id", allow_null=True)
    group = serializers.SerializerMethodField()
    explanation = ExplanationField(read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "type", "at", "actor", "lead", "group", "rep", "explanation", "request_id"]
        read_only_fields = fields

    @extend_schema_field(serializers.CharField(allow_null=True))
    def get_group(self, event: AuditEvent) -> str | None:
        return event.group or None
