"""The lead actions of SPEC 6 (accept, reassign, reroute, close, PATCH), mixed into
`LeadViewSet`. Each view validates, calls one service of `leads/actions.py`, and returns the
lead. Scope `manage` (see `LeadViewSet.required_scopes`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.http import Http404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from leads import actions
from leads.models import Lead
from leads.routing import RoutingBusy
from routing_project.exceptions import Conflict, ServiceUnavailable

from .action_serializers import (
    AcceptSerializer,
    CloseSerializer,
    LeadPatchSerializer,
    ReassignSerializer,
    RerouteSerializer,
)
from .auth import actor_of
from .serializers import LeadSerializer

ERROR = inline_serializer("ActionError", fields={"detail": serializers.CharField()})
BAD_REQUEST = OpenApiResponse(OpenApiTypes.OBJECT, description="Validation error naming every bad field.")
ACTION_RESPONSES = {200: LeadSerializer, 400: BAD_REQUEST, 401: ERROR, 403: ERROR, 404: ERROR, 409: ERROR, 503: ERROR}
ACTION_SCOPES = {
    "accept": "manage",
    "reassign": "manage",
    "reroute": "manage",
    "close": "manage",
    "partial_update": "manage",
}


def _lead_id(pk: str | None) -> int:
    try:
        value = int(pk or "")
    except ValueError:
        raise Http404("No such lead.") from None
    if value < 1 or value > 2**63 - 1:
        raise Http404("No such lead.")
    return value


class LeadActionsMixin:
    """Adds the action endpoints to the lead viewset."""

    @staticmethod
    def _existing(pk: str | None) -> int:
        """The lead's id, or 404: checked before the body, so an unknown lead is a 404 whatever
        was sent, as for any other resource."""
        lead_id = _lead_id(pk)
        if not Lead.objects.filter(pk=lead_id).exists():
            raise Http404("No such lead.")
        return lead_id

    def _act(self, request: Request, lead_id: int, run: Callable[[int], Lead]) -> Response:
        try:
            lead = run(lead_id)
        except Lead.DoesNotExist:
            raise Http404("No such lead.") from None
        except actions.LeadConflict as exc:
            raise Conflict(str(exc)) from None
        except actions.ActionRejected as exc:
            raise serializers.ValidationError(exc.errors) from None
        except RoutingBusy:
            raise ServiceUnavailable("The group's rotation is busy; retry shortly.", retry_after=1) from None
        fresh = Lead.objects.select_related("group", "owner").get(pk=lead.pk)
        return Response(LeadSerializer(fresh).data)

    @staticmethod
    def _valid(serializer_class: type[serializers.Serializer], request: Request) -> dict[str, Any]:
        # No body at all parses as {}; a JSON `null` is a body that is not an object (a 400, as
        # `[]` or a string is), never taken for an empty one.
        incoming = serializer_class(data=request.data)
        incoming.is_valid(raise_exception=True)
        return dict(incoming.validated_data)

    @extend_schema(request=AcceptSerializer, responses=ACTION_RESPONSES)
    @action(detail=True, methods=["post"], filterset_class=None, pagination_class=None)
    def accept(self, request: Request, pk: str | None = None) -> Response:
        """The owner accepts the lead: escalation stops. 409 when the rep is not the owner."""
        lead_id = self._existing(pk)
        data = self._valid(AcceptSerializer, request)
        actor = actor_of(request)
        return self._act(request, lead_id, lambda i: actions.lead_accept(lead_id=i, rep_id=data["rep"], actor=actor))

    @extend_schema(request=ReassignSerializer, responses=ACTION_RESPONSES)
    @action(detail=True, methods=["post"], filterset_class=None, pagination_class=None)
    def reassign(self, request: Request, pk: str | None = None) -> Response:
        """Gives the lead to a rep by hand (reason required). The rotation pointer does not
        move; a cap may be exceeded and the audit event says so."""
        lead_id = self._existing(pk)
        data = self._valid(ReassignSerializer, request)
        actor = actor_of(request)
        return self._act(
            request,
            lead_id,
            lambda i: actions.lead_reassign(lead_id=i, rep_id=data["rep"], reason=data["reason"], actor=actor),
        )

    @extend_schema(request=RerouteSerializer, responses=ACTION_RESPONSES)
    @action(detail=True, methods=["post"], filterset_class=None, pagination_class=None)
    def reroute(self, request: Request, pk: str | None = None) -> Response:
        """Runs the routing rules and the rotation again."""
        lead_id = self._existing(pk)
        self._valid(RerouteSerializer, request)
        actor = actor_of(request)
        return self._act(request, lead_id, lambda i: actions.lead_reroute(lead_id=i, actor=actor))

    @extend_schema(request=CloseSerializer, responses=ACTION_RESPONSES)
    @action(detail=True, methods=["post"], filterset_class=None, pagination_class=None)
    def close(self, request: Request, pk: str | None = None) -> Response:
        """Closes the lead with an outcome; the rep's capacity frees up."""
        lead_id = self._existing(pk)
        data = self._valid(CloseSerializer, request)
        actor = actor_of(request)
        return self._act(
            request, lead_id, lambda i: actions.lead_close(lead_id=i, outcome=data["outcome"], actor=actor)
        )

    @extend_schema(request=LeadPatchSerializer, responses=ACTION_RESPONSES)
    def partial_update(self, request: Request, pk: str | None = None) -> Response:
        """Edits contact fields and routing facts. Never moves the lead (reroute does)."""
        lead_id = self._existing(pk)
        data = self._valid(LeadPatchSerializer, request)
        actor = actor_of(request)
        return self._act(request, lead_id, lambda i: actions.lead_update(lead_id=i, changes=data, actor=actor))
