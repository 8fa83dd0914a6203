"""Simulate (what routing would do now) and replay (what a configuration would have done):
both read only."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connection
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from leads.replay import ReplayError, replay_config, routing_replay
from leads.simulate import routing_simulate
from rotation.models import Group, Strategy

from .serializers import LeadInSerializer, RepBriefSerializer, StrictSerializer
from .views import COMMON_ERRORS, VALIDATION_ERROR

# One request's worth. Measured on 200,000 leads: 20,000 decisions in a group of 60 members
# took 7 s, 49,000 in a group of 3 took 47 s and grew the web process by 600 MB (every
# decision's explanation is read). 10,000 stays within a few seconds and well inside
# gunicorn's 30 s timeout and a load balancer's. Larger windows: manage.py replay_routing.
MAX_REPLAY_TURNS = 10_000


@contextmanager
def one_replay_at_a_time() -> Iterator[None]:
    """A replay holds a web process's CPU for seconds: eight at once held intake's answers at
    half a second to nearly two (SPEC 9's p99 is 60 ms). One runs at a time across the web
    processes (a PostgreSQL session lock, let go with the connection if the process dies); another
    asked meanwhile is a 429 to retry. The embedded default (SQLite) is one machine's demo."""
    if connection.vendor != "postgresql":
        yield
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(hashtextextended('leads.replay', 0))")
        (held,) = cursor.fetchone()
    if not held:
        raise Throttled(wait=5, detail="Another replay is running (one at a time); retry when it ends.")
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(hashtextextended('leads.replay', 0))")


class SimulateCandidateSerializer(serializers.Serializer):
    rep = RepBriefSerializer()
    eligible = serializers.BooleanField()
    reason = serializers.CharField()


class RuleConditionMatchSerializer(serializers.Serializer):
    field = serializers.CharField()
    op = serializers.CharField()
    value = serializers.JSONField(allow_null=True)
    lead = serializers.JSONField(allow_null=True, help_text="The lead's value of the field.")


class SimulateSerializer(serializers.Serializer):
    rule = serializers.CharField(allow_null=True)
    rules_tried = serializers.ListField(child=serializers.CharField())
    matched_on = RuleConditionMatchSerializer(
        many=True,
        allow_null=True,
        help_text="The matched rule's conditions, each with the lead's value it held for; null when no rule matched.",
    )
    group_source = serializers.CharField()
    group = serializers.CharField(allow_null=True)
    strategy = serializers.ChoiceField(choices=Strategy.choices, allow_null=True)
    rep = RepBriefSerializer(allow_null=True)
    reason = serializers.CharField(allow_null=True, help_text="rotation or owner_match")
    queue_reason = serializers.CharField(allow_null=True)
    duplicate_of = serializers.IntegerField(allow_null=True)
    account = serializers.CharField(allow_null=True)
    pointer_before = serializers.IntegerField(allow_null=True)
    pointer_after = serializers.IntegerField(allow_null=True)
    candidates = SimulateCandidateSerializer(many=True)


class SimulateView(APIView):
    """Routes a lead on paper: the rule, group, strategy and rep it would get now, and why each
    member would or would not. Writes nothing (no lead, assignment, audit event or rotation
    change)."""

    required_scope = "intake"

    @extend_schema(
        request=LeadInSerializer, responses={200: SimulateSerializer, 400: VALIDATION_ERROR, **COMMON_ERRORS}
    )
    def post(self, request: Request) -> Response:
        incoming = LeadInSerializer(data=request.data)
        incoming.is_valid(raise_exception=True)
        data = dict(incoming.validated_data)
        requested: Group | None = data.pop("group", None)
        return Response(routing_simulate(data=data, requested=requested))


class ReplayInSerializer(StrictSerializer):
    since = serializers.DateTimeField()
    until = serializers.DateTimeField()
    group = serializers.SlugField(max_length=64, required=False, allow_null=True)
    config = serializers.JSONField(
        required=False,
        allow_null=True,
        help_text='Proposed configuration, e.g. {"strategy": "weighted", "members": {"12": {"weight": 3}}} '
        'for `group`; or {"groups": {slug: {...}}}; "rules": [{name, priority, conditions, group, active}] '
        "(as GET /api/v1/rules/ lists them; `id` is ignored, inactive ones are left out) replaces the active "
        "rules. Members take weight, active, max_open, max_per_day.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if attrs["until"] <= attrs["since"]:
            raise serializers.ValidationError({"until": ["Must be after since."]})
        return attrs


class ReplayCountsSerializer(serializers.Serializer):
    actual = serializers.IntegerField()
    proposed = serializers.IntegerField()


class ReplayRepSerializer(serializers.Serializer):
    rep = RepBriefSerializer()
    weight = serializers.IntegerField(allow_null=True, help_text="Its weight in the group now (null: not a member).")
    proposed_weight = serializers.IntegerField(allow_null=True, help_text="Its weight in the proposal.")
    actual = serializers.IntegerField(help_text="Leads routing gave it in the window.")
    proposed = serializers.IntegerField(help_text="Leads the replay gave it.")
    difference = serializers.IntegerField(help_text="proposed - actual")


class ReplayGroupSerializer(serializers.Serializer):
    group = serializers.CharField(allow_null=True, help_text="null: the leads no group took.")
    strategy = serializers.ChoiceField(choices=Strategy.choices, allow_null=True)
    proposed_strategy = serializers.ChoiceField(choices=Strategy.choices, allow_null=True)
    actual_total = serializers.IntegerField()
    proposed_total = serializers.IntegerField()
    queued = ReplayCountsSerializer(help_text="Decisions that ended in the fallback queue.")
    proposed_queued_because = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Why the replay queued the decisions it queued here: reason -> count.",
    )
    moved_to = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Decisions routing took here that the replay routes to another group (none: no group): slug, count.",
    )
    moved_from = serializers.DictField(
        child=serializers.IntegerField(),
        help_text="Decisions routing took elsewhere that the replay routes here: slug -> count.",
    )
    reps = ReplayRepSerializer(many=True)


REPLAY_RESPONSE = inline_serializer(
    "Replay",
    fields={
        "since": serializers.DateTimeField(),
        "until": serializers.DateTimeField(),
        "group": serializers.CharField(allow_null=True),
        "config": serializers.JSONField(),
        "turns": serializers.IntegerField(),
        "changed": serializers.IntegerField(),
        "groups": ReplayGroupSerializer(many=True),
    },
)


def _with_configuration_errors(errors: dict[str, Any], body: Any) -> dict[str, Any]:
    """The serializer's errors and those of the group and configuration checks (replay_config),
    which need no valid window: a 400 names every bad field, not only the first ones found."""
    if "non_field_errors" in errors or "group" in errors or "config" in errors or not isinstance(body, dict):
        return errors
    try:
        replay_config(config=body.get("config"), group=body.get("group"))
    except ReplayError as exc:
        return {**errors, **exc.errors}
    return errors


class ReplayView(APIView):
    """What-if: routes the decisions of a past window again, in memory, through the current or
    a proposed configuration, and returns per-rep counts actual vs proposed. Writes nothing."""

    required_scope = "manage"

    @extend_schema(
        request=ReplayInSerializer,
        responses={200: REPLAY_RESPONSE, 400: VALIDATION_ERROR, **COMMON_ERRORS},
    )
    def post(self, request: Request) -> Response:
        incoming = ReplayInSerializer(data=request.data)
        if not incoming.is_valid():
            raise serializers.ValidationError(_with_configuration_errors(dict(incoming.errors), request.data))
        data = incoming.validated_data
        try:
            with one_replay_at_a_time():
                result = routing_replay(
                    since=data["since"],
                    until=data["until"],
                    group=data.get("group"),
                    config=data.get("config"),
                    max_turns=MAX_REPLAY_TURNS,
                )
        except ReplayError as exc:
            raise serializers.ValidationError(exc.errors) from None
        return Response(result)
