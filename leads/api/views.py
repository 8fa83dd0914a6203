from __future__ import annotations

import logging
from typing import Any

import django_filters
from django import forms
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import generics, mixins, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import APIException
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.models import AuditEvent
from leads import selectors, services
from leads.models import ApiClient, Lead, LeadStatus
from leads.routing import RoutingBusy
from rotation.models import Group, Strategy
from routing_project import configcache
from routing_project.exceptions import InFlight, ServiceUnavailable, Unprocessable
from routing_project.filters import SlugFilter, StrictFilterSet, UtcDateTimeFilter

from .action_views import ACTION_SCOPES, LeadActionsMixin
from .auth import actor_of
from .serializers import AuditEventSerializer, LeadInSerializer, LeadSerializer, lead_document

ERROR = inline_serializer("Error", fields={"detail": serializers.CharField()})
VALIDATION_ERROR = OpenApiResponse(
    OpenApiTypes.OBJECT, description="Validation error: `{field: [messages]}` naming every bad field."
)
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[\\x20-\\x7e]+$"},
    OpenApiParameter.HEADER,
    required=False,
    description="1-255 printable characters; a retry with the same key and body replays the first response.",
)
REPLAYED = OpenApiParameter(
    "Idempotent-Replayed",
    str,
    OpenApiParameter.HEADER,
    enum=["true"],
    response=[200],
    description="`true` when the answer replays the first one to this Idempotency-Key (absent on a duplicate).",
)
LOCATION = OpenApiParameter(
    "Location", str, OpenApiParameter.HEADER, required=True, response=[201], description="The lead's URL."
)
COMMON_ERRORS = {401: ERROR, 403: ERROR}

logger = logging.getLogger(__name__)


def _printable_key(key: str) -> bool:
    return 1 <= len(key) <= 255 and all(0x20 <= ord(ch) < 0x7F for ch in key)


class IdField(forms.IntegerField):
    """ASCII digits only: int() also reads "1.0" (Django's field drops the ".0"), "+1", "1_0"
    (ten) and "١" (Arabic-Indic one), none of which is how the API writes an id."""

    def to_python(self, value: Any) -> int | None:
        if isinstance(value, str) and value.strip():
            digits = value.strip().removeprefix("-")  # a negative id: out of range, said so
            if not (digits.isascii() and digits.isdigit()):
                raise forms.ValidationError(self.error_messages["invalid"], code="invalid")
        return super().to_python(value)


@extend_schema_field({"type": "integer", "minimum": 1, "maximum": 2**63 - 1})
class IdFilter(django_filters.NumberFilter):
    """A row id: a whole number in ASCII digits (a decimal one, `?owner=3.9`, is a 400, never
    rep 3), within the range of the id column (the filters give it as `max_value`)."""

    field_class = IdField


class LeadFilter(StrictFilterSet):
    status = django_filters.ChoiceFilter(choices=LeadStatus.choices)
    group = SlugFilter(field_name="group__slug", max_length=64)
    owner = IdFilter(field_name="owner_id", min_value=1, max_value=2**63 - 1)
    # Strictly after: a lead's own `created_at` given back lists the leads that came in after it.
    created_after = UtcDateTimeFilter(field_name="created_at", lookup_expr="gt")

    class Meta:
        model = Lead
        fields = ["status", "group", "owner", "created_after"]


def _body_read(request: HttpRequest) -> bool:
    """Reads the body into memory, so that a request answered again parses it again; False if
    it cannot be (too large, unreadable): the request is then answered once, as any other."""
    try:
        request.body  # noqa: B018 - read for its side effect
    except Exception:  # noqa: BLE001 - the normal path reports it
        return False
    return True


def _body_errors(request: Request) -> dict[str, Any]:
    """The body's bad fields, for a 400 that names every bad field also when the request is
    refused for its Idempotency-Key; none when the body cannot be read as JSON (the key's 400
    is answered then, as before)."""
    try:
        incoming = LeadInSerializer(data=request.data)
        return {} if incoming.is_valid() else dict(incoming.errors)
    except APIException:  # a body that is not JSON, too large: its own answer once the key is right
        return {}


def render_lead(lead: Lead, duplicate_of: int | None) -> bytes:
    return JSONRenderer().render(lead_document(lead, duplicate_of))


# A duplicate is answered with the open lead another request sent in: to a token that may not
# read leads (an intake-only one, a web form's), without what that sender said about the
# contact, which GET /api/v1/leads/{id}/ would refuse it. The email stays: the sender's own
# address, normalised alike (its spelling is the open lead's).
_UNREADABLE: dict[str, Any] = {
    **dict.fromkeys(("first_name", "last_name", "company", "phone", "country", "region"), ""),
    **dict.fromkeys(("source", "product", "external_id"), ""),
    "score": None,
    "company_size": None,
    "attributes": {},
}


def render_lead_for_intake(lead: Lead, duplicate_of: int | None) -> bytes:
    doc = lead_document(lead, duplicate_of)
    if duplicate_of is not None:
        doc.update(_UNREADABLE)
    return JSONRenderer().render(doc)


class LeadViewSet(LeadActionsMixin, mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = LeadSerializer
    filterset_class = LeadFilter
    lookup_value_regex = r"[0-9]+"  # /leads/abc/ is a 404, never a ValueError
    required_scopes = {
        "create": "intake",
        "list": "read",
        "retrieve": "read",
        "events": "read",
        "metadata": "read",  # OPTIONS
        **ACTION_SCOPES,
    }

    def get_queryset(self) -> QuerySet[Lead]:
        return Lead.objects.select_related("group", "owner").order_by("-id")

    def get_serializer_class(self) -> type[serializers.BaseSerializer]:
        # OPTIONS describes what a POST takes (its `actions.POST`), not the lead it answers.
        if self.action == "metadata" and self.request.method == "POST":
            return LeadInSerializer
        return super().get_serializer_class()

    def dispatch(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        """Intake starts on the process's last known configuration, without reading its version
        first: the routing transaction checks it before writing, and any other answer is
        checked before it leaves. When the configuration moved, the request is answered again
        from the start (authentication included) under the new one
        (routing_project/configcache.py)."""
        action = self.action_map.get((request.method or "").lower())
        if action != "create" or not _body_read(request) or not configcache.defer():
            return super().dispatch(request, *args, **kwargs)
        try:
            response = super().dispatch(request, *args, **kwargs)
            if configcache.settle():
                return response
        except configcache.StaleConfiguration:
            configcache.refresh()
        logger.info("the configuration changed during an intake: answered again under the new one")
        return super().dispatch(request, *args, **kwargs)

    @extend_schema(
        request=LeadInSerializer,
        parameters=[IDEMPOTENCY_KEY, REPLAYED, LOCATION],
        responses={
            201: LeadSerializer,
            200: OpenApiResponse(LeadSerializer, description="Idempotent replay, or a duplicate (`duplicate_of`)."),
            400: VALIDATION_ERROR,
            409: ERROR,
            413: ERROR,
            415: ERROR,
            422: ERROR,
            503: ERROR,
            **COMMON_ERRORS,
        },
    )
    def create(self, request: Request) -> HttpResponse:
        """Takes a lead in and routes it, in one locked transaction."""
        key = request.headers.get("Idempotency-Key")
        if key is not None and not _printable_key(key):
            raise serializers.ValidationError(
                {**_body_errors(request), "Idempotency-Key": ["Must be 1-255 printable ASCII characters."]}
            )
        client = request.auth
        assert isinstance(client, ApiClient)  # HasScope let the request through
        claim = None
        # The key first: a retry of a lead already taken in is replayed even where the body
        # would no longer validate (its group deleted since); a refused body frees the key.
        if key is not None:
            try:
                claimed = services.idempotency_claim(
                    client=client, key=key, fingerprint=services.request_fingerprint(request.data)
                )
            except services.IdempotencyConflict:
                raise InFlight("A request with this Idempotency-Key is still in flight.") from None
            except services.IdempotencyMismatch:
                raise Unprocessable("This Idempotency-Key was used with a different request body.") from None
            if isinstance(claimed, services.Replay):
                response = HttpResponse(claimed.body, status=200, content_type="application/json")
                response["Idempotent-Replayed"] = "true"
                if claimed.lead_id is not None:  # as the first answer had
                    response["Location"] = f"/api/v1/leads/{claimed.lead_id}/"
                return response
            claim = claimed
        try:
            incoming = LeadInSerializer(data=request.data)
            incoming.is_valid(raise_exception=True)
            data = dict(incoming.validated_data)
            requested: Group | None = data.pop("group", None)
            result = services.lead_intake(
                data=data,
                raw=request.data,
                requested=requested,
                client=client,
                actor=actor_of(request),
                render=render_lead if client.has_scope("read") else render_lead_for_intake,
                idempotency=claim,
            )
        except RoutingBusy:
            if claim is not None:
                services.idempotency_release(claim)
            raise ServiceUnavailable("The group's rotation is busy; retry shortly.", retry_after=1) from None
        except services.IdempotencyConflict:
            # This request outlived its claim and a retry took the key over: nothing was written.
            raise InFlight("A request with this Idempotency-Key is still in flight.") from None
        except BaseException:
            if claim is not None:
                services.idempotency_release(claim)
            raise
        response = HttpResponse(result.body, status=result.status_code, content_type="application/json")
        response["Location"] = f"/api/v1/leads/{result.lead.id}/"
        return response

    @extend_schema(
        parameters=[OpenApiParameter("created_after", OpenApiTypes.DATETIME)],
        responses={200: LeadSerializer(many=True), 400: VALIDATION_ERROR, **COMMON_ERRORS},
    )
    def list(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """The leads, newest first, paginated: filter by `status`, `group` (slug), `owner` (rep
        id) and `created_after`."""
        return super().list(request, *args, **kwargs)

    @extend_schema(responses={200: LeadSerializer, 404: ERROR, **COMMON_ERRORS})
    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        """One lead: its status, group, owner, times, escalations and contact fields."""
        return super().retrieve(request, *args, **kwargs)

    @extend_schema(responses={200: AuditEventSerializer(many=True), 404: ERROR, **COMMON_ERRORS}, filters=False)
    @action(detail=True, methods=["get"], pagination_class=None, filterset_class=None)
    def events(self, request: Request, pk: str | None = None) -> Response:
        """The lead's audit events, oldest first."""
        lead = get_object_or_404(Lead.objects.only("id"), pk=pk)
        events = AuditEvent.objects.filter(lead_id=lead.id).order_by("id")
        return Response(AuditEventSerializer(events, many=True).data)


class QueueView(generics.ListAPIView):
    """The fallback queue: queued leads in arrival order, each with its reason."""

    serializer_class = LeadSerializer
    required_scope = "read"
    filterset_class = LeadFilter

    def get_queryset(self) -> QuerySet[Lead]:
        return Lead.objects.filter(status=LeadStatus.QUEUED).select_related("group", "owner").order_by("id")

    @extend_schema(responses={200: LeadSerializer(many=True), 400: VALIDATION_ERROR, **COMMON_ERRORS})
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class RotationMemberSerializer(serializers.Serializer):
    rep = inline_serializer(
        "RotationRep",
        fields={"id": serializers.IntegerField(), "name": serializers.CharField(), "email": serializers.EmailField()},
    )
    position = serializers.IntegerField()
    weight = serializers.IntegerField()
    active = serializers.BooleanField()
    eligible = serializers.BooleanField()
    reason = serializers.CharField(allow_null=True)
    current_weight = serializers.IntegerField(
        allow_null=True,
        help_text="Weighted groups: the member's distance to its next turn on the rotation's clock; among "
        "the eligible, the lowest goes next (ties by position). A member away keeps its distance and earns "
        "nothing meanwhile. Null for the other strategies, and for a member with no turn placed yet.",
    )
    leads_ahead = serializers.IntegerField(
        allow_null=True,
        help_text="Which lead from now the member gets next (1: the next lead), played out by the rotation "
        "if nothing changes meanwhile but the leads themselves (nobody paused or back, no lead closed; each "
        "lead counts against its rep's caps). Null for a member not eligible now, in an inactive group, or "
        "not reached within the leads played out (500; in a group of more than 20 members, 10,000 divided by "
        "its members, at least 50).",
    )
    open = serializers.IntegerField()
    assigned_today = serializers.IntegerField()
    assigned_week = serializers.IntegerField()
    escalated_to_week = serializers.IntegerField(
        help_text="Of assigned_week, the leads the member got by escalation: another rep let their SLA run out. "
        "An escalation is a rotation turn: a member after one who lets leads sit gets these in the place of new "
        "leads.",
    )
    sla_missed_week = serializers.IntegerField(
        help_text="Of assigned_week, the leads whose SLA the member let run out (escalated away from it).",
    )
    share = serializers.FloatField(
        help_text="The member's fair share of turns among the active members: its weight's share in a "
        "weighted group, an equal share in the others (their rotation gives weights no say); 0 while inactive.",
    )
    share_week = serializers.FloatField(
        allow_null=True, help_text="Its share of the group's assignments this week; null when there were none."
    )


class RotationViewSerializer(serializers.Serializer):
    group = serializers.CharField()
    strategy = serializers.ChoiceField(choices=Strategy.choices)
    active = serializers.BooleanField()
    pointer = serializers.IntegerField()
    turns = serializers.IntegerField()
    next = inline_serializer(
        "RotationNext",
        fields={"id": serializers.IntegerField(), "name": serializers.CharField(), "email": serializers.EmailField()},
        allow_null=True,
    )
    members = RotationMemberSerializer(many=True)


class RotationView(APIView):
    """The rotation, never hidden: pointer, who is next, each member's eligibility now."""

    required_scope = "read"

    @extend_schema(responses={200: RotationViewSerializer, 404: ERROR, **COMMON_ERRORS})
    def get(self, request: Request, slug: str) -> Response:
        group = get_object_or_404(Group, slug=slug)
        return Response(selectors.rotation_view(group=group))
