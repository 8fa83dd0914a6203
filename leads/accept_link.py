"""A rep accepts a lead from the link in its notification e-mail (SPEC 2: reps accept "from
notifications, the API, or a small page"), without an admin login or an API token.

The link carries the lead and the rep, signed with the project's SECRET_KEY (Django's signing,
a salt of its own) and timestamped: it is refused when tampered with or older than
ACCEPT_LINK_MAX_AGE_S. It is good only while that rep owns the lead: once the lead escalated
or was moved, the page says so and accepts nothing. GET shows the lead; only the POST of its
form (CSRF-protected) accepts, so a link preview or a mail scanner fetching it changes nothing.
The owner sees the contact details they need to follow up; anyone else sees none."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core import signing
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from rotation.models import is_timezone

from . import actions
from .models import Lead, LeadStatus
from .routing import RoutingBusy

_SALT = "leads.accept-link"


def accept_path(*, lead_id: int, rep_id: int) -> str:
    return f"/leads/accept/{signing.dumps({'lead': lead_id, 'rep': rep_id}, salt=_SALT, compress=True)}/"


def accept_url(*, lead_id: int, rep_id: int) -> str:
    return settings.PUBLIC_BASE_URL.rstrip("/") + accept_path(lead_id=lead_id, rep_id=rep_id)


@require_http_methods(["GET", "HEAD", "POST"])
def accept_page(request: HttpRequest, token: str) -> HttpResponse:
    try:
        claim = signing.loads(token, salt=_SALT, max_age=settings.ACCEPT_LINK_MAX_AGE_S)
        lead_id, rep_id = int(claim["lead"]), int(claim["rep"])
    except signing.SignatureExpired:
        return _page(request, 410, "This link has expired. Ask your manager to reassign the lead if it is still open.")
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        return _page(request, 404, "This link is not valid.")
    lead = Lead.objects.select_related("group", "owner").filter(pk=lead_id).first()
    if lead is None:
        return _page(request, 404, "This lead no longer exists.")
    if request.method == "POST":
        try:
            lead = actions.lead_accept(lead_id=lead_id, rep_id=rep_id, actor=f"rep-link:{rep_id}")
        except actions.LeadConflict:
            lead.refresh_from_db()
            return _page(request, 409, "This lead is no longer yours: it escalated, was moved or closed.", lead=lead)
        except RoutingBusy:
            busy = _page(request, 503, "The lead is being changed right now: try again in a moment.", lead=lead)
            busy["Retry-After"] = "1"
            return busy
        return _page(request, 200, "Accepted: the lead is yours, and its SLA clock has stopped.", lead=lead, owner=True)
    if lead.owner_id != rep_id or lead.status not in (LeadStatus.ASSIGNED, LeadStatus.ACCEPTED):
        return _page(request, 409, "This lead is no longer yours: it escalated, was moved or closed.", lead=lead)
    if lead.status == LeadStatus.ACCEPTED:
        return _page(request, 200, "You have accepted this lead.", lead=lead, owner=True)
    return _page(request, 200, "", lead=lead, owner=True, can_accept=True)


def _page(request: HttpRequest, status: int, message: str, **context: Any) -> HttpResponse:
    lead = context.get("lead")
    if context.get("owner") and lead is not None and lead.owner is not None and is_timezone(lead.owner.timezone):
        # The due time on the owner's clock, as their notification e-mail gives it.
        context["zone"] = lead.owner.timezone
    return render(request, "leads/accept.html", {"zone": "UTC", "message": message, **context}, status=status)
