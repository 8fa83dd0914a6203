"""Request bodies of the lead actions (accept, reassign, reroute, close, PATCH)."""

from __future__ import annotations

import copy
from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from rest_framework import serializers

from leads.models import Lead
from rotation.models import Rep, validate_one_line
from routing_project.api import ascii_email

from .serializers import AttributesField, LeadInSerializer, LeadSerializer, OptionalTextField, StrictSerializer


def _existing_rep(value: int) -> int:
    if not Rep.objects.filter(pk=value).exists():
        raise serializers.ValidationError(f"No rep with id {value}.")
    return value


class AcceptSerializer(StrictSerializer):
    rep = serializers.IntegerField(min_value=1, help_text="The rep accepting: must be the current owner.")

    def validate_rep(self, value: int) -> int:
        return _existing_rep(value)


class ReassignSerializer(StrictSerializer):
    rep = serializers.IntegerField(min_value=1, help_text="The rep to give the lead to.")
    reason = serializers.CharField(max_length=500, help_text="Why, for the audit trail (required).")

    def validate_rep(self, value: int) -> int:
        # The service checks again under the rep's lock (a deactivation may commit meanwhile);
        # checked here too, so that a 400 names an inactive rep with any other bad field.
        active = Rep.objects.filter(pk=value).values_list("active", flat=True).first()
        if active is None:
            raise serializers.ValidationError(f"No rep with id {value}.")
        if not active:
            raise serializers.ValidationError(f"Rep {value} is inactive.")
        return value

    def validate_reason(self, value: str) -> str:
        value = value.strip()
        if not value:
            raise serializers.ValidationError("A reason is required.")
        # Read in the audit trail as one line of what it says: no characters that reorder it.
        validate_one_line(value)
        return value


class RerouteSerializer(StrictSerializer):
    """No fields: the rules and the rotation run again on the lead as it is."""


class CloseSerializer(StrictSerializer):
    outcome = serializers.ChoiceField(choices=Lead.Outcome.choices)


class LeadPatchSerializer(StrictSerializer):
    """The contact fields and the facts rules read (country, region, source, product, score,
    company size, attributes), validated as intake validates them. Editing them never moves
    the lead: a reroute does, explicitly. Anything else (status, owner, group, external id)
    is a 400."""

    email = serializers.EmailField(max_length=254, required=False)
    first_name = OptionalTextField(max_length=100)
    last_name = OptionalTextField(max_length=100)
    company = OptionalTextField(max_length=200)
    phone = OptionalTextField(max_length=40)
    # Intake's own fields (fresh copies: a field is bound to one serializer).
    country, region, source, product, score, company_size = (  # type: ignore[assignment]
        copy.deepcopy(LeadInSerializer._declared_fields[name])
        for name in ("country", "region", "source", "product", "score", "company_size")
    )
    attributes = AttributesField(required=False, help_text="Replaces the lead's attributes as a whole.")

    # The lead's other fields (as read, as posted): "read-only" here, not "unknown".
    fixed_fields = frozenset(LeadSerializer.Meta.fields) | frozenset(LeadInSerializer._declared_fields)

    validate_country = LeadInSerializer.validate_country

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # `{}` is a merge patch that changes nothing: the lead as it is, as for every resource.
        for name, value in attrs.items():
            if isinstance(value, str) and "\x00" in value:
                raise serializers.ValidationError({name: ["NUL characters are not allowed."]})
        return attrs

    def validate_email(self, value: str) -> str:
        # A field's check, not validate()'s: a 400 names it with every other bad field.
        ProhibitNullCharactersValidator()(value)
        return ascii_email(value)
