from __future__ import annotations

from decimal import Decimal
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from rotation.eligibility import DAYS, validate_working_hours
from rotation.models import (
    Group,
    Membership,
    Rep,
    group_slug_taken_in_another_case,
    rep_email_taken,
    validate_one_line,
)
from rotation.services import MAX_POSITION, POSITION_TOO_HIGH, given_position_refused
from routing_project.api import DecimalField, RejectUnknownFieldsMixin, ascii_email


class GroupSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    sla_minutes = DecimalField(
        max_digits=8, decimal_places=2, min_value=Decimal("0.01"), required=False, allow_null=True
    )

    class Meta:
        model = Group
        fields = [
            "slug",
            "name",
            "strategy",
            "sla_minutes",
            "max_attempts",
            "timezone",
            "dedup_days",
            "is_default",
            "active",
            "owner_match_fallback_to_rotation",
            "auto_pause_after_misses",
        ]
        extra_kwargs = {
            "max_attempts": {"min_value": 1, "max_value": 100},
            "dedup_days": {"max_value": 3650},
            # One default group is enforced by the service (it moves the flag).
            "is_default": {"validators": []},
        }

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        if self.instance is not None:
            fields["slug"].read_only = True  # the slug names the group in URLs and in the audit
        return fields

    def validate_slug(self, value: str) -> str:
        # Here as well as in the model's clean(): a field's check, so that a 400 names it
        # together with every other bad field (the service's full_clean runs only after them).
        problem = group_slug_taken_in_another_case(value)
        if problem:
            raise serializers.ValidationError(problem)
        return value


class GroupUpdateSerializer(GroupSerializer):
    """The body of a PATCH, for the schema: the slug stays (GroupSerializer makes it read-only
    once the group exists)."""

    class Meta(GroupSerializer.Meta):
        read_only_fields = ["slug"]


_SPANS = {
    "type": "array",
    "items": {
        "type": "array",
        "items": {"type": "string", "pattern": "^(([01]?[0-9]|2[0-3]):[0-5][0-9]|24:00)$"},
        "minItems": 2,
        "maxItems": 2,
    },
    "description": '[start, end] pairs, "HH:MM" in the rep\'s timezone, each ending after it starts; '
    '"24:00" is midnight at the end of the day.',
}


@extend_schema_field(
    {
        "type": "object",
        "nullable": True,
        "properties": dict.fromkeys(DAYS, _SPANS),
        "additionalProperties": False,
        "minProperties": 1,
        "description": "null: always available. Otherwise the hours of the days listed, "
        'e.g. {"mon": [["09:00", "17:30"]]}; a day left out (or with no spans) is off.',
    }
)
class WorkingHoursField(serializers.JSONField):
    """A rep's weekly hours, as `validate_working_hours` takes them (null: always)."""


class RepSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    working_hours = WorkingHoursField(required=False, allow_null=True)

    class Meta:
        model = Rep
        fields = ["id", "name", "email", "timezone", "active", "working_hours"]

    def validate_email(self, value: str) -> str:
        value = ascii_email(value)
        # Also the model's clean(); here, a 400 names it with every other bad field.
        problem = rep_email_taken(value, rep_id=self.instance.pk if isinstance(self.instance, Rep) else None)
        if problem:
            raise serializers.ValidationError(problem)
        return value

    def validate_working_hours(self, value: Any) -> Any:
        try:
            return validate_working_hours(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class MembershipSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    # Worded as the lead actions' unknown rep is.
    rep = serializers.PrimaryKeyRelatedField(
        queryset=Rep.objects.all(), error_messages={"does_not_exist": "No rep with id {pk_value}."}
    )
    name = serializers.CharField(source="rep.name", read_only=True)
    # Left out or null: appended (the admin's empty position too).
    # Up to MAX_GIVEN_POSITION when given (services.given_position_refused).
    # Past MAX_POSITION too (the field's bound, for an appended member's own sent back), the
    # message says the bound a given position has: one value, whatever was sent.
    position = serializers.IntegerField(
        min_value=0,
        max_value=MAX_POSITION,
        required=False,
        allow_null=True,
        error_messages={"max_value": POSITION_TOO_HIGH},
    )
    weight = serializers.IntegerField(min_value=1, max_value=1000, required=False)
    max_open = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False, allow_null=True)
    max_per_day = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False, allow_null=True)
    paused_reason = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        validators=[validate_one_line],
        help_text=(
            'Why the member is paused (`active` false: "parental leave"), as the rotation view, '
            "simulate and the dashboard say it; an auto-pause writes its own. Cleared when the "
            "member is active again."
        ),
    )

    class Meta:
        model = Membership
        fields = [
            "rep",
            "name",
            "position",
            "weight",
            "active",
            "max_open",
            "max_per_day",
            "paused_reason",
            "joined_at",
        ]
        read_only_fields = ["joined_at"]

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        if self.instance is not None:
            fields["rep"].read_only = True
        return fields

    # Checks of one field each (validate_<field>), not in validate(): DRF runs those of every
    # field, so a 400 names a rep already in the group or a taken position together with any
    # other bad field; validate() runs only once every field is valid.

    def validate_rep(self, rep: Rep) -> Rep:
        group: Group = self.context["group"]
        if self.instance is None and Membership.objects.filter(group=group, rep=rep).exists():
            raise serializers.ValidationError("This rep is already a member of the group.")
        return rep

    def validate_position(self, position: int | None) -> int | None:
        if position is None:
            return None  # appended; a member's moves to the end (validate)
        if refused := given_position_refused(position, self.instance.position if self.instance else None):
            raise serializers.ValidationError(refused)
        taken = Membership.objects.filter(group=self.context["group"], position=position)
        if self.instance is not None:
            taken = taken.exclude(pk=self.instance.pk)
        if taken.exists():
            raise serializers.ValidationError(f"Position {position} is taken in this group.")
        return position

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        active = attrs.get("active", self.instance.active if self.instance is not None else True)
        if attrs.get("paused_reason", "").strip() and active:
            raise serializers.ValidationError(
                {"paused_reason": ['Only a paused member has a reason: give it with "active": false.']}
            )
        if "paused_reason" in attrs:
            attrs["paused_reason"] = attrs["paused_reason"].strip()
        if "position" in attrs and attrs["position"] is None:
            del attrs["position"]  # left out or null: appended
            if self.instance is not None:
                # A member's position emptied: to the end of the rotation, placed as a joiner
                # is (as the admin's position left empty).
                attrs[TO_END] = True
        return attrs


# In a PATCH's validated data: the member moves to the end (its position given as null).
TO_END = "to_end"


class MembershipUpdateSerializer(MembershipSerializer):
    """The body of a PATCH, for the schema: the member stays (the URL names it); a position
    of null moves it to the end of the rotation."""

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["rep"].read_only = True
        return fields
