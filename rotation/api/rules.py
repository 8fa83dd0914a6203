"""Routing rules and out-of-office windows over the API (manage scope); writes go through the
audited services in rotation/services.py."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.request import Request
from rest_framework.response import Response

from rotation import services
from rotation.models import Absence, Group, Rep, RoutingRule, validate_one_line
from rotation.rules import LEAD_FIELDS, MAX_ATTRIBUTE_KEY, MAX_CONDITIONS, OPERATORS, RuleError, validate_conditions
from routing_project.api import CREATED_LOCATION, CreatedLocationMixin, RejectUnknownFieldsMixin
from routing_project.filters import SlugFilter, StrictFilterSet, TrueFalseFilter

from .views import ERRORS, actor_of

# A condition by its operator: the value each takes (what validate_conditions accepts), so
# that a rule the schema allows is one the server saves, and the docs say how to write one.
_FIELD = {
    "type": "string",
    "pattern": rf"^({'|'.join(LEAD_FIELDS)}|attributes\.[^\x00]{{1,{MAX_ATTRIBUTE_KEY}}})$",
    "description": f"{', '.join(LEAD_FIELDS)} or attributes.<key>",
}
_NUMBER = {"type": "number"}
# An empty string never matches (an empty field is an absent one): refused.
_SCALAR = {"oneOf": [{"type": "string", "minLength": 1}, {"type": "number"}, {"type": "boolean"}]}
_VALUES_BY_OPERATOR: list[tuple[list[str], dict[str, Any] | None]] = [
    (["equals"], _SCALAR),
    (["in", "not_in"], {"type": "array", "minItems": 1, "items": _SCALAR}),
    (["contains"], {"type": "string", "minLength": 1}),
    (["gte", "lte"], _NUMBER),
    (["exists"], None),  # true (the default, null too) or false
]
assert sorted(op for ops, _ in _VALUES_BY_OPERATOR for op in ops) == sorted(OPERATORS)


def _condition(ops: list[str], value: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "field": _FIELD,
            "op": {"type": "string", "enum": ops},
            "value": value if value is not None else {"type": "boolean", "default": True, "nullable": True},
        },
        "required": ["field", "op"] if value is None else ["field", "op", "value"],
        "additionalProperties": False,
    }


CONDITIONS_SCHEMA = {
    "type": "array",
    "minItems": 1,
    "maxItems": MAX_CONDITIONS,
    "items": {"oneOf": [_condition(ops, value) for ops, value in _VALUES_BY_OPERATOR]},
    "description": "All must hold.",
}


SLUG = re.compile(r"[-a-zA-Z0-9_]{1,64}")


@extend_schema_field(CONDITIONS_SCHEMA)
class ConditionsField(serializers.JSONField):
    def to_representation(self, value: Any) -> Any:
        # Each condition as `field`, `op`, `value`, however it is stored (PostgreSQL's jsonb
        # keeps keys by length: `op` first), so a rule reads the same when saved and read.
        if isinstance(value, list):
            value = [
                {**{k: c[k] for k in ("field", "op", "value") if k in c}, **c} if isinstance(c, dict) else c
                for c in value
            ]
        return super().to_representation(value)


class GroupSlugField(serializers.SlugRelatedField):
    """A group by its slug; text that cannot be a slug (a NUL, which PostgreSQL refuses to
    compare) names no group, without a query. Worded as intake's unknown group is."""

    default_error_messages = {"does_not_exist": "No group with slug '{value}'."}

    def to_internal_value(self, data: Any) -> Any:
        if not isinstance(data, str) or not SLUG.fullmatch(data):
            self.fail("does_not_exist", slug_name=self.slug_field, value=str(data)[:100])
        return super().to_internal_value(data)


class RuleSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    group = GroupSlugField(slug_field="slug", queryset=Group.objects.all())
    priority = serializers.IntegerField(min_value=0, max_value=services.MAX_PRIORITY, required=False)
    conditions = ConditionsField()

    class Meta:
        model = RoutingRule
        fields = ["id", "name", "priority", "conditions", "group", "active"]

    def validate_conditions(self, value: Any) -> list[dict[str, Any]]:
        """A rule that cannot be evaluated cannot be saved: every problem is named."""
        if value == []:
            # Refused by the model too ("cannot be blank"), but only once the service saves,
            # after every field is valid: here, a 400 names it with the other bad fields.
            raise serializers.ValidationError("A rule needs at least one condition.")
        try:
            return validate_conditions(value)
        except RuleError as exc:
            raise serializers.ValidationError(exc.messages) from None


class RuleFilter(StrictFilterSet):
    group = SlugFilter(field_name="group__slug", max_length=64)
    active = TrueFalseFilter()

    class Meta:
        model = RoutingRule
        fields = ["group", "active"]


@extend_schema_view(
    list=extend_schema(responses={200: RuleSerializer(many=True), **ERRORS}),
    create=extend_schema(parameters=[CREATED_LOCATION], responses={201: RuleSerializer, **ERRORS}),
    retrieve=extend_schema(responses={200: RuleSerializer, **ERRORS}),
    partial_update=extend_schema(responses={200: RuleSerializer, **ERRORS}),
    destroy=extend_schema(responses={204: None, **ERRORS}),
)
class RuleViewSet(CreatedLocationMixin, viewsets.ModelViewSet):
    # SPEC's contract updates with PATCH; a PUT would have to resend fields it cannot change.
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    """Routing rules, tried by ascending priority; the first whose conditions all hold wins."""

    serializer_class = RuleSerializer
    required_scope = "manage"
    lookup_value_regex = r"[0-9]+"
    queryset = RoutingRule.objects.select_related("group").order_by("priority", "id")
    filterset_class = RuleFilter

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = services.rule_save(
            rule=RoutingRule(**serializer.validated_data), actor=actor_of(self.request)
        )

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        rule = serializer.instance
        assert isinstance(rule, RoutingRule)
        for name, value in serializer.validated_data.items():
            setattr(rule, name, value)
        services.rule_save(rule=rule, actor=actor_of(self.request), changed=list(serializer.validated_data))

    def perform_destroy(self, instance: RoutingRule) -> None:
        # Deleted by another request meanwhile: a 404 (routing_project/exceptions.py).
        services.rule_delete(rule=instance, actor=actor_of(self.request))


class RepLocalDateTimeField(serializers.DateTimeField):
    """A time with an offset is that instant; a time without one is read in the rep's time
    zone (the serializer's context `rep`), as the admin enters a rep's absences: "out from
    9:00 on Monday" means the rep's Monday. Answers give the instant in UTC. A local time the
    clocks skip or go through twice (a daylight-saving change) is refused, naming the zone."""

    default_error_messages = {
        "local_time_changes": "{value} is not one time in {zone}: its clocks change then. Give an offset.",
    }

    def enforce_timezone(self, value: datetime) -> datetime:
        rep = self.context.get("rep")
        if timezone.is_naive(value) and isinstance(rep, Rep):
            local = value.replace(tzinfo=ZoneInfo(rep.timezone))
            # Skipped or repeated, a local time's offset depends on which side of the change
            # it is read (fold). DRF's valid_datetime lets both through: compared across zones, such
            # a time equals no instant, so it passes for neither skipped nor repeated.
            if local.utcoffset() != local.replace(fold=1).utcoffset():
                self.fail("local_time_changes", value=value.isoformat(), zone=rep.timezone)
            value = local
        return super().enforce_timezone(value)  # in UTC; out of the calendar there: "overflow"


_IN_REP_ZONE = "An offset (Z, +02:00) gives the instant; without one, the time is the rep's local time."


class AbsenceSerializer(RejectUnknownFieldsMixin, serializers.ModelSerializer):
    starts_at = RepLocalDateTimeField(help_text=_IN_REP_ZONE)
    ends_at = RepLocalDateTimeField(help_text=_IN_REP_ZONE)
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True, validators=[validate_one_line])

    class Meta:
        model = Absence
        fields = ["id", "starts_at", "ends_at", "reason"]

    def validate_ends_at(self, value: datetime) -> datetime:
        # A check of the field, not of validate(), which DRF runs only once every field is valid:
        # so a 400 names an end before the start together with a bad reason. An invalid start
        # is named by its own field.
        raw = self.initial_data.get("starts_at") if isinstance(self.initial_data, dict) else None
        try:
            starts_at = self.fields["starts_at"].run_validation(raw)
        except serializers.ValidationError:
            return value
        if value <= starts_at:
            raise serializers.ValidationError("The end must be after the start (starts_at).")
        return value


@extend_schema_view(
    list=extend_schema(responses={200: AbsenceSerializer(many=True), **ERRORS}),
    create=extend_schema(parameters=[CREATED_LOCATION], responses={201: AbsenceSerializer, **ERRORS}),
    retrieve=extend_schema(responses={200: AbsenceSerializer, **ERRORS}),
    destroy=extend_schema(responses={204: None, **ERRORS}),
)
class AbsenceViewSet(
    CreatedLocationMixin,
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,  # the Location a POST answers with can be read back
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """A rep's out-of-office windows: the rep is not eligible anywhere while one lasts."""

    serializer_class = AbsenceSerializer
    required_scope = "manage"
    pagination_class = None
    lookup_value_regex = r"[0-9]+"

    def get_rep(self) -> Rep:
        if not hasattr(self, "_rep"):
            self._rep = get_object_or_404(Rep, pk=self.kwargs["rep_id"])
        return self._rep

    def get_queryset(self) -> QuerySet[Absence]:
        if getattr(self, "swagger_fake_view", False):
            return Absence.objects.none()
        return Absence.objects.filter(rep=self.get_rep()).order_by("starts_at", "id")

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if "rep_id" in self.kwargs:
            context["rep"] = self.get_rep()
        return context

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = services.absence_add(
            absence=Absence(rep=self.get_rep(), **serializer.validated_data), actor=actor_of(self.request)
        )

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        # Deleted by another request meanwhile: a 404 (routing_project/exceptions.py).
        services.absence_remove(absence=self.get_object(), actor=actor_of(request))
        return Response(status=status.HTTP_204_NO_CONTENT)
