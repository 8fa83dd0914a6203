"""POST /api/v1/hooks/{source}/: a signed web form posts a lead (SPEC 7)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.views import APIView

from leads import services as lead_services
from leads.api.serializers import LeadInSerializer
from leads.models import Lead, LeadStatus
from leads.routing import RoutingBusy
from routing_project.api import CREATED_LOCATION
from routing_project.exceptions import ServiceUnavailable
from security.ratelimit import rate_limit_count, rate_limit_hit

from . import services
from .models import IntakeSource

logger = logging.getLogger(__name__)

ERROR = inline_serializer("HookError", fields={"detail": serializers.CharField()})
ACCEPTED = inline_serializer(
    "HookAccepted",
    fields={
        "id": serializers.IntegerField(),
        "status": serializers.ChoiceField(choices=LeadStatus.choices),
        "group": serializers.CharField(allow_null=True),
        "queue_reason": serializers.CharField(allow_null=True),
        "duplicate_of": serializers.IntegerField(allow_null=True),
    },
)


class UnsupportedMediaType(exceptions.APIException):
    status_code = 415
    default_detail = "Send application/json or application/x-www-form-urlencoded."
    default_code = "unsupported_media_type"


def render_hook_result(lead: Lead, duplicate_of: int | None) -> bytes:
    """A form service needs the outcome, not the rep's contact details."""
    body = {
        "id": lead.id,
        "status": lead.status,
        "group": lead.group.slug if lead.group else None,
        "queue_reason": (lead.queue_reason or None) if lead.status == "queued" else None,
        "duplicate_of": duplicate_of,
    }
    return json.dumps(body).encode()


class AnswerInJSON(BaseContentNegotiation):
    """A hook answers JSON whatever the sender's Accept header asks for: refusing the lead
    (406) over the format of its receipt would lose a visitor's form for nothing. The body is
    read raw (`hook_parse`), so no parser is chosen here."""

    def select_parser(self, request: Request, parsers: Iterable[BaseParser]) -> None:
        return None

    def select_renderer(
        self, request: Request, renderers: Iterable[BaseRenderer], format_suffix: str | None = None
    ) -> tuple[BaseRenderer, str]:
        renderer = next(iter(renderers))
        return renderer, renderer.media_type


class HookView(APIView):
    """Takes a lead from a signed web form and routes it like `POST /api/v1/leads/`."""

    authentication_classes: list = []
    permission_classes: list = []
    throttle_classes: list = []  # limited per source, after the signature is verified
    renderer_classes = [JSONRenderer]
    content_negotiation_class = AnswerInJSON

    @extend_schema(
        operation_id="hooks_create",
        request={
            "application/json": OpenApiTypes.OBJECT,
            "application/x-www-form-urlencoded": OpenApiTypes.OBJECT,
        },
        parameters=[
            OpenApiParameter(
                "X-Signature",
                str,
                OpenApiParameter.HEADER,
                required=True,
                description='`t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>" under the source\'s '
                "secret>`; at most 5 minutes old, each signature accepted once.",
            ),
            CREATED_LOCATION,
        ],
        responses={
            201: ACCEPTED,
            200: OpenApiResponse(ACCEPTED, description="A duplicate of an open lead (`duplicate_of`)."),
            400: OpenApiResponse(OpenApiTypes.OBJECT, description="Validation error naming every bad field."),
            401: OpenApiResponse(ERROR, description="Missing, malformed, stale, wrong or replayed signature."),
            404: OpenApiResponse(ERROR, description="No active source with this slug."),
            413: ERROR,
            415: ERROR,
            429: OpenApiResponse(ERROR, description="Over the source's rate limit; see `Retry-After`."),
            503: ERROR,
        },
        examples=[
            OpenApiExample("form", value={"your-email": "jane@acme.example", "company": "Acme"}, request_only=True)
        ],
        auth=[],
    )
    def post(self, request: Request, source: str) -> HttpResponse:
        intake_source = IntakeSource.objects.filter(slug=source, active=True).first()
        if intake_source is None:
            raise exceptions.NotFound("No active intake source with this slug.")
        body = request.body
        # An address sending bad signatures is cut off for the rest of the minute (429), so
        # guessing a secret gets no answer; a good signature is taken whatever its address
        # sent before (the client's address: behind proxies, read through TRUSTED_PROXY_COUNT).
        failures_key = f"hookfail:{request.META.get('REMOTE_ADDR') or '-'}"
        limit = settings.HOOK_SIGNATURE_FAILURES_PER_ADDRESS
        try:
            signature = services.hook_verify(
                source=intake_source, header=request.headers.get("X-Signature", ""), body=body
            )
        except services.SignatureError as exc:
            if rate_limit_count(key=failures_key, held_when_down=True) >= limit:
                raise exceptions.Throttled(
                    wait=60 - int(time.time()) % 60, detail="Too many requests with a bad signature from this address."
                ) from None
            logger.warning("hook rejected: source=%s reason=%s", intake_source.slug, exc)
            rate_limit_hit(key=failures_key, limit=limit, held_when_down=True)
            raise exceptions.AuthenticationFailed(str(exc)) from None
        if services.hook_replayed(source=intake_source, signature=signature):
            # A genuine signature seen before: a replay, refused before the source's limit
            # counts it, or replaying one captured request would use up the source's budget.
            logger.warning("hook rejected: source=%s reason=replay", intake_source.slug)
            raise exceptions.AuthenticationFailed("This signature was used already (replay).")
        # created_at in the key: a re-created database never inherits an old source's counter.
        key = f"source:{intake_source.pk}:{intake_source.created_at.timestamp():.6f}"
        verdict = rate_limit_hit(key=key, limit=intake_source.rate_limit_per_minute)
        if not verdict.allowed:
            raise exceptions.Throttled(wait=verdict.retry_after)
        # Claimed before the body is read: a refused body (400, 415) keeps its signature used,
        # or replaying it would spend the source's budget again and again. A request that
        # fails for want of the service (503) releases it for the retry.
        try:
            delivery = services.hook_claim(source=intake_source, signature=signature)
        except services.SignatureError as exc:
            logger.warning("hook rejected: source=%s reason=%s", intake_source.slug, exc)
            raise exceptions.AuthenticationFailed(str(exc)) from None
        try:
            # The whole header: its charset too (request.content_type is the media type alone).
            data, payload = self._lead_data(intake_source, body, request.META.get("CONTENT_TYPE") or "")
        except (UnsupportedMediaType, exceptions.ParseError, exceptions.ValidationError):
            raise  # the client's: the signature stays used
        except BaseException:
            services.hook_release(delivery=delivery)
            raise
        requested = data.pop("group", None)
        try:
            result = lead_services.lead_intake(
                data=data,
                raw=payload,
                requested=requested,
                client=None,
                actor=f"hook:{intake_source.slug}",
                render=render_hook_result,
            )
        except RoutingBusy:
            services.hook_release(delivery=delivery)
            raise ServiceUnavailable("The group's rotation is busy; retry shortly.", retry_after=1) from None
        except BaseException:
            services.hook_release(delivery=delivery)
            raise
        services.source_touch(source=intake_source)
        logger.info(
            "hook accepted: source=%s lead=%s status=%s", intake_source.slug, result.lead.id, result.lead.status
        )
        response = HttpResponse(result.body, status=result.status_code, content_type="application/json")
        response["Location"] = f"/api/v1/leads/{result.lead.id}/"
        return response

    @staticmethod
    def _lead_data(source: IntakeSource, body: bytes, content_type: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The lead's validated fields and the payload as posted."""
        try:
            payload = services.hook_parse(body=body, content_type=content_type)
        except services.UnsupportedBody as exc:
            raise UnsupportedMediaType(str(exc)) from None
        except services.BadBody as exc:
            raise exceptions.ParseError(str(exc)) from None
        # Form fields arrive as text ("50" for a score), form-encoded or as JSON: coerced, not refused.
        incoming = LeadInSerializer(
            data=services.hook_map(source=source, payload=payload), context={"lenient_types": True}
        )
        if not incoming.is_valid():
            raise exceptions.ValidationError(
                services.hook_errors_named(source=source, payload=payload, errors=dict(incoming.errors))
            )
        return dict(incoming.validated_data), payload

    def get_authenticate_header(self, request: Request) -> str:
        return 'HMAC-SHA256 header="X-Signature"'
