"""Managers' lead actions in the admin: assign queued leads to a rep (bulk, with an
intermediate form), accept for the owner, route again, close, and reassign or close one lead
from its page. Everything goes through `leads/actions.py`, audited as `admin:<username>`."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, cast

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.core.exceptions import PermissionDenied
from django.db.models import Count, QuerySet
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.defaultfilters import pluralize
from django.template.response import TemplateResponse
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.html import format_html

from audit.models import AuditEvent
from rotation.eligibility import eligibility, reason_in_words
from rotation.models import Group, Rep, validate_one_line

from . import actions, routing
from .models import Lead, LeadStatus, QueuedLead
from .routing import RoutingBusy


def admin_actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


class CloseForm(forms.Form):
    outcome = forms.ChoiceField(choices=Lead.Outcome.choices, widget=forms.RadioSelect, label="Outcome")


class RepChoiceField(forms.ModelChoiceField):
    shared_names: frozenset[str] = frozenset()

    def label_from_instance(self, obj: Rep) -> str:
        # Two reps may share a name: theirs carry the e-mail, or the manager cannot tell them apart.
        return f"{obj.name} <{obj.email}>" if obj.name in self.shared_names else obj.name


class AssignForm(forms.Form):
    rep = RepChoiceField(queryset=Rep.objects.filter(active=True).order_by("name", "id"), label="Assign to")
    # One line of what it says in the audit trail: no characters that reorder or hide text.
    reason = forms.CharField(max_length=500, help_text="Why, for the audit trail.", validators=[validate_one_line])

    def __init__(self, *args: Any, group: Group | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        field = cast(RepChoiceField, self.fields["rep"])
        shared = Rep.objects.filter(active=True).values("name").annotate(n=Count("id")).filter(n__gt=1)
        field.shared_names = frozenset(shared.values_list("name", flat=True))
        if group is not None:
            # The leads' group's members first: among every rep of the company, alphabetical,
            # the manager could not tell who works the group (a rep outside it is still offered).
            # Each member the rotation would step over now says why (paused, out of office,
            # off hours, at a cap), as the rotation view does: the manager sees it before
            # choosing, not in a warning after the assignment.
            now = timezone.now()
            notes: dict[int, str] = {}  # every member: why it is stepped over ("" if it is not)
            for f in routing.member_facts(group, now):
                eligible, reason = eligibility(f, now)
                if eligible:
                    notes[f.rep_id] = ""
                else:
                    notes[f.rep_id] = "paused here" if not f.member_active else reason_in_words(reason, f.rep_timezone)
            reps = [(rep.pk, field.label_from_instance(rep)) for rep in cast(QuerySet[Rep], field.queryset)]
            ours = [(pk, f"{label} ({notes[pk]})" if notes[pk] else label) for pk, label in reps if pk in notes]
            field.choices = [
                ("", field.empty_label),
                (f"Members of {group.slug}", ours),
                ("Other reps", [(pk, label) for pk, label in reps if pk not in notes]),
            ]


def _not_eligible_note(*, lead_id: int, actor: str, rep: Rep) -> tuple[str, bool]:
    """Why the rep just given the lead by hand cannot work it now (out of office, paused, off
    hours, over a cap, not in the lead's group), as the reassign's audit event recorded it;
    and whether the assignment has an SLA that escalates it (no SLA in its group: none)."""
    event = (
        AuditEvent.objects.filter(lead_id=lead_id, type=AuditEvent.Type.LEAD_REASSIGNED, actor=actor)
        .order_by("-id")
        .first()
    )
    e = event.explanation if event is not None else {}
    notes = []
    caps = e.get("caps") or {}
    exceeded = caps.get("exceeded", []) if e.get("over_cap") else []
    why = str(e.get("not_eligible_because") or "")
    # A cap's reason carries the running count ("at max_open cap (3/2)", then "(4/2)"): said as
    # the cap alone, so that the leads given past it share one warning, not one each.
    if why and not (exceeded and why.startswith(("at max_open cap", "at max_per_day cap"))):
        notes.append(reason_in_words(why, rep.timezone))
    notes.extend(f"over its {name} cap of {caps.get(name)}" for name in exceeded)
    if e.get("member_of_group") is False:
        notes.append("not a member of the lead's group")
    return "; ".join(notes), e.get("sla_due_at") is not None


def _warn_not_eligible(
    modeladmin: Any, request: HttpRequest, rep: Rep, notes: dict[tuple[str, bool], list[int]]
) -> None:
    for (note, escalates), ids in notes.items():
        # The first 20, the rest counted, as the actions' other messages say them.
        leads = ", ".join(f"#{pk}" for pk in ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
        # Without an SLA nothing moves the lead on: said, or the manager counts on an escalation.
        it, its = ("it", "its") if len(ids) == 1 else ("them", "their")
        until = f" or {its} SLA escalates." if escalates else f": no SLA escalates {it}."
        modeladmin.message_user(
            request,
            f"{rep.name} is not eligible now ({note}): {leads} will wait with them until they can take {it}{until}",
            messages.WARNING,
        )


# Each lead is its own routing transaction (about 5 ms): "Select all" over a large list held
# the request for minutes, past any proxy's timeout, the manager not knowing what was done.
MAX_LEADS_PER_ACTION = 1000

Action = Callable[[admin.ModelAdmin, HttpRequest, QuerySet[Lead]], HttpResponse | None]


def bounded(action: Action) -> Action:
    """Refuses, before doing anything, an action over more than MAX_LEADS_PER_ACTION leads
    ("Select all N" over a large list), saying how many were selected and what to do."""

    @functools.wraps(action)
    def run(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Lead]) -> HttpResponse | None:
        if request.POST.get("select_across") == "1":
            count = queryset.count()
            if count > MAX_LEADS_PER_ACTION:
                modeladmin.message_user(
                    request,
                    f"{count:,} leads selected: an action takes at most {MAX_LEADS_PER_ACTION:,} at a time. "
                    "Nothing was done. Narrow the list with a filter or the search, then select again.",
                    messages.ERROR,
                )
                return None
        return action(modeladmin, request, queryset)

    return run


def _from_queue(modeladmin: admin.ModelAdmin) -> bool:
    """On the fallback queue page an action applies only to leads still queued."""
    return modeladmin.model is QueuedLead


def _run_each(
    modeladmin: admin.ModelAdmin, request: HttpRequest, leads: Iterable[Lead], run: Callable[[Lead], Any], done: str
) -> None:
    ok, failed = 0, []
    leads = list(leads)
    if _from_queue(modeladmin) and request.POST.get("select_across") != "1":
        # Selected on a page that is now stale: another manager (or a drain) took them meanwhile.
        # Said, rather than silently doing nothing for them.
        present = {lead.pk for lead in leads}
        for pk in sorted(
            {int(v) for v in request.POST.getlist(ACTION_CHECKBOX_NAME) if v.isascii() and v.isdigit()} - present
        ):
            failed.append(f"#{pk}: no longer in the queue (someone else acted on it first).")
    for lead in leads:
        try:
            run(lead)
            ok += 1
        except (actions.LeadConflict, RoutingBusy) as exc:
            failed.append(f"#{lead.pk}: {str(exc) or 'the rotation is busy, retry'}")
        except actions.ActionRejected as exc:
            failed.append(f"#{lead.pk}: {'; '.join(m for ms in exc.errors.values() for m in ms)}")
    if ok:
        modeladmin.message_user(request, f"{ok} lead{pluralize(ok)} {done}.", messages.SUCCESS)
    if failed:
        # Every refusal counted, the first 20 said: a manager must not read 20 as all of them.
        more = f" and {len(failed) - 20} more." if len(failed) > 20 else ""
        modeladmin.message_user(
            request,
            f"Not done for {len(failed)} lead{pluralize(len(failed))}: " + " ".join(failed[:20]) + more,
            messages.ERROR,
        )


@admin.action(description="Assign selected leads to a rep…", permissions=["change"])
@bounded
def assign_to_rep(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Lead]) -> HttpResponse | None:
    """An intermediate page: pick the rep and give a reason, then assign every selected lead."""
    # Leads of one group (the queue filtered by it, most often): its members are offered first.
    groups = list(queryset.order_by().values_list("group_id", flat=True).distinct()[:2])
    group = Group.objects.filter(pk=groups[0]).first() if len(groups) == 1 and groups[0] is not None else None
    form = AssignForm(request.POST if "apply" in request.POST else None, group=group)
    if form.is_bound and form.is_valid():
        rep, reason, actor = form.cleaned_data["rep"], form.cleaned_data["reason"], admin_actor(request)
        notes: dict[tuple[str, bool], list[int]] = {}

        def assign(lead: Lead) -> None:
            actions.lead_reassign(
                lead_id=lead.pk, rep_id=rep.pk, reason=reason, actor=actor, only_queued=_from_queue(modeladmin)
            )
            note, escalates = _not_eligible_note(lead_id=lead.pk, actor=actor, rep=rep)
            if note:
                notes.setdefault((note, escalates), []).append(lead.pk)

        _run_each(modeladmin, request, queryset.order_by("id"), assign, f"assigned to {rep.name}")
        _warn_not_eligible(modeladmin, request, rep, notes)
        return None
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": "Assign leads to a rep",
        "form": form,
        "leads": queryset.order_by("id")[:200],
        "count": queryset.count(),
        "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
        # "Select all N": posted back, or the confirmation would act on the ticked page only.
        "select_across": request.POST.get("select_across") == "1",
        "action": "assign_to_rep",
        "opts": modeladmin.model._meta,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
    }
    return TemplateResponse(request, "admin/leads/assign_to_rep.html", context)


def _confirm_page(
    modeladmin: admin.ModelAdmin,
    request: HttpRequest,
    queryset: QuerySet[Lead],
    *,
    template: str,
    title: str,
    action: str,
    listed: QuerySet[Lead] | None = None,
    **extra: Any,
) -> TemplateResponse:
    """An action's confirmation page: the selected leads listed (the first 200; `listed`: those
    of them it acts on), the selection posted back with the answer (`_selected_leads.html`)."""
    listed = queryset if listed is None else listed
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "leads": listed.select_related("group", "owner").order_by("id")[:200],
        "count": listed.count(),
        "selected": request.POST.getlist(ACTION_CHECKBOX_NAME),
        "select_across": request.POST.get("select_across") == "1",
        "action": action,
        "opts": modeladmin.model._meta,
        "action_checkbox_name": ACTION_CHECKBOX_NAME,
        **extra,
    }
    return TemplateResponse(request, template, context)


@admin.action(description="Route selected leads again (rules and rotation)", permissions=["change"])
@bounded
def reroute(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Lead]) -> HttpResponse | None:
    held = queryset.filter(status__in=(LeadStatus.ASSIGNED, LeadStatus.ACCEPTED))
    if "apply" not in request.POST and held.exists():
        # Routed again, a lead leaves the rep who holds it, an accepted one too (its rep is
        # working it): not undone by routing it back. Confirmed on a page that names them;
        # queued leads alone (the queue's daily work) go at once.
        return _confirm_page(
            modeladmin,
            request,
            queryset,
            template="admin/leads/reroute_confirm.html",
            title="Route leads again",
            action="reroute",
            held=held.count(),
            accepted=held.filter(status=LeadStatus.ACCEPTED).count(),
        )
    actor = admin_actor(request)
    queued: dict[str, list[int]] = {}
    taken: dict[str, list[str]] = {}
    placed: list[str] = []

    def route(lead: Lead) -> None:
        routed = actions.lead_reroute(lead_id=lead.pk, actor=actor, only_queued=_from_queue(modeladmin))
        if routed.status == LeadStatus.QUEUED and lead.owner is not None:
            # It had a rep, who no longer has it: said, not passed off as "still no rep".
            taken.setdefault(routed.queue_reason, []).append(f"#{routed.pk} taken from {lead.owner.name}")
        elif routed.status == LeadStatus.QUEUED:
            queued.setdefault(routed.queue_reason, []).append(routed.pk)
        elif routed.owner is not None:
            where = f" in {routed.group.slug}" if routed.group is not None else ""
            stayed = " (stays with its rep)" if routed.owner_id == lead.owner_id else ""
            placed.append(f"#{routed.pk} to {routed.owner.name}{where}{stayed}")

    _run_each(modeladmin, request, queryset.order_by("id"), route, "routed again")
    if placed:
        # Where each went, as the audit trail says it: the first 20, the rest counted.
        more = f"; and {len(placed) - 20} more" if len(placed) > 20 else ""
        modeladmin.message_user(request, "Now: " + "; ".join(placed[:20]) + more + ".", messages.INFO)
    # Routed again into the queue is no assignment: said, rather than "routed" alone.
    for reason, ids in queued.items():
        leads = ", ".join(f"#{pk}" for pk in ids[:20]) + (f" and {len(ids) - 20} more" if len(ids) > 20 else "")
        modeladmin.message_user(
            request, f"Still no rep for {leads}, back in the fallback queue: {reason}.", messages.WARNING
        )
    for reason, moved in taken.items():
        more = f"; and {len(moved) - 20} more" if len(moved) > 20 else ""
        modeladmin.message_user(
            request, f"{'; '.join(moved[:20])}{more} into the fallback queue: {reason}.", messages.WARNING
        )
    return None


@admin.action(description="Mark selected leads accepted by their owner", permissions=["change"])
@bounded
def accept_for_owner(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Lead]) -> None:
    """A rep who took the lead by phone or e-mail: the manager records it for the rep who owns
    the lead, and its SLA clock stops, as with `POST /api/v1/leads/{id}/accept/`. A lead that
    moved to another rep since the page was read is refused (that rep did not accept it)."""
    actor = admin_actor(request)

    def accept(lead: Lead) -> None:
        if lead.owner_id is None:
            raise actions.LeadConflict(f"no rep holds it (it is {lead.status}).")
        if lead.status == LeadStatus.ACCEPTED:  # accepting again changes nothing: not counted as done
            raise actions.LeadConflict("already accepted by its owner.")
        actions.lead_accept(lead_id=lead.pk, rep_id=lead.owner_id, actor=actor)

    _run_each(modeladmin, request, queryset.order_by("id"), accept, "marked accepted by their owner")


def _close_action(outcome: str) -> Action:
    def close(modeladmin: admin.ModelAdmin, request: HttpRequest, queryset: QuerySet[Lead]) -> HttpResponse | None:
        if "apply" not in request.POST:
            # A closed lead is never routed again: the manager confirms on a page listing them,
            # as the lead page's own "Close…" asks for the outcome first. It lists the leads it
            # will close; those closed already are counted apart (listed among them, they read
            # as leads about to be closed again, with another outcome).
            return _confirm_page(
                modeladmin,
                request,
                queryset,
                listed=queryset.exclude(status=LeadStatus.CLOSED),
                template="admin/leads/close_confirm.html",
                title=f"Close leads as {outcome}",
                action=f"close_{outcome}",
                outcome=outcome,
                closed_already=queryset.filter(status=LeadStatus.CLOSED).count(),
            )
        actor = admin_actor(request)
        _run_each(
            modeladmin,
            request,
            queryset.order_by("id"),
            lambda lead: actions.lead_close(
                lead_id=lead.pk, outcome=outcome, actor=actor, only_queued=_from_queue(modeladmin)
            ),
            f"closed as {outcome}",
        )
        return None

    close.__name__ = f"close_{outcome}"
    return admin.action(description=f"Close selected leads as {outcome}", permissions=["change"])(bounded(close))


close_disqualified = _close_action("disqualified")
close_won = _close_action("won")
close_lost = _close_action("lost")


def _assign_verb(lead: Lead) -> str:
    """A queued lead has no rep to take it from: it is assigned, as the queue's action says."""
    return "Assign" if lead.status == LeadStatus.QUEUED else "Reassign"


class LeadActionsAdminMixin:
    """The lead page: "Reassign" and "Close" pages of its own, and the bulk actions."""

    actions: Any = [assign_to_rep, accept_for_owner, reroute, close_won, close_lost, close_disqualified]

    def get_urls(self) -> list[URLPattern]:
        urls = super().get_urls()  # type: ignore[misc]
        site = self.admin_site  # type: ignore[attr-defined]
        return [
            path("<int:lead_id>/reassign/", site.admin_view(self.reassign_view), name="leads_lead_reassign"),
            path("<int:lead_id>/close/", site.admin_view(self.close_view), name="leads_lead_close"),
            *urls,
        ]

    @admin.display(description="Manage")
    def manage_links(self, obj: Lead) -> str:
        if obj.pk is None:
            return ""
        if obj.status == LeadStatus.CLOSED:  # closed for good: a "Reassign…" or "Close…" could only fail
            return format_html("Closed ({}): not reassigned. {}", obj.get_outcome_display(), self.trail_link(obj))
        return format_html(
            '<a class="button" href="{}">{}…</a> <a class="button" href="{}">Close…</a> {}',
            reverse("admin:leads_lead_reassign", args=[obj.pk]),
            _assign_verb(obj),
            reverse("admin:leads_lead_close", args=[obj.pk]),
            self.trail_link(obj),
        )

    @admin.display(description="Manage")
    def trail_link(self, obj: Lead) -> str:
        """For those who read leads but may not move them (no "Reassign…" leading to a 403)."""
        if obj.pk is None:
            return ""
        return format_html(
            '<a href="{}?lead_id={}">Audit trail: every decision on this lead</a>',
            reverse("admin:audit_auditevent_changelist"),
            obj.pk,
        )

    def get_fieldsets(self, request: HttpRequest, obj: Lead | None = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        if self.has_change_permission(request, obj):  # type: ignore[attr-defined]
            return fieldsets
        return [
            (name, {**opts, "fields": tuple("trail_link" if f == "manage_links" else f for f in opts["fields"])})
            for name, opts in fieldsets
        ]

    def reassign_view(self, request: HttpRequest, lead_id: int) -> HttpResponse:
        lead = get_object_or_404(Lead.objects.select_related("group", "owner"), pk=lead_id)
        if not self.has_change_permission(request, lead):  # type: ignore[attr-defined]
            raise PermissionDenied
        if lead.status == LeadStatus.CLOSED:  # an old link or a second tab: said before a form is filled in
            self.message_user(request, f"Lead #{lead.pk} is closed: it is not reassigned.", messages.WARNING)  # type: ignore[attr-defined]
            return HttpResponseRedirect(reverse("admin:leads_lead_change", args=[lead.pk]))
        verb = _assign_verb(lead)
        form = AssignForm(request.POST or None, group=lead.group)
        if request.method == "POST" and form.is_valid():
            rep = form.cleaned_data["rep"]
            try:
                actions.lead_reassign(
                    lead_id=lead.pk, rep_id=rep.pk, reason=form.cleaned_data["reason"], actor=admin_actor(request)
                )
            except (actions.LeadConflict, RoutingBusy) as exc:
                self.message_user(request, str(exc) or "The rotation is busy; retry.", messages.ERROR)  # type: ignore[attr-defined]
            except actions.ActionRejected as exc:
                form.add_error("rep", "; ".join(m for ms in exc.errors.values() for m in ms))
            else:
                self.message_user(request, f"Lead #{lead.pk} {verb.lower()}ed to {rep.name}.", messages.SUCCESS)  # type: ignore[attr-defined]
                note, escalates = _not_eligible_note(lead_id=lead.pk, actor=admin_actor(request), rep=rep)
                if note:
                    _warn_not_eligible(self, request, rep, {(note, escalates): [lead.pk]})
                return HttpResponseRedirect(reverse("admin:leads_lead_change", args=[lead.pk]))
        return self._lead_form_page(
            request, lead, form, title=f"{verb} lead #{lead.pk}", template="reassign.html", verb=verb
        )

    def close_view(self, request: HttpRequest, lead_id: int) -> HttpResponse:
        """Asks for the outcome, then closes the lead as the API's close and the list's "Close
        selected leads as …" do (`actions.lead_close`): the same lead.closed event, the rep's
        capacity freed and the group's queue drained."""
        lead = get_object_or_404(Lead.objects.select_related("group", "owner"), pk=lead_id)
        if not self.has_change_permission(request, lead):  # type: ignore[attr-defined]
            raise PermissionDenied
        change_page = HttpResponseRedirect(reverse("admin:leads_lead_change", args=[lead.pk]))
        if lead.status == LeadStatus.CLOSED:  # an old link or a second tab: said before an outcome is picked
            self.message_user(  # type: ignore[attr-defined]
                request, f"Lead #{lead.pk} is already closed ({lead.get_outcome_display()}).", messages.WARNING
            )
            return change_page
        form = CloseForm(request.POST if request.method == "POST" else None)
        if form.is_bound and form.is_valid():
            outcome = form.cleaned_data["outcome"]
            try:
                actions.lead_close(lead_id=lead.pk, outcome=outcome, actor=admin_actor(request))
            except actions.LeadConflict as exc:  # closed by someone else since the page was read
                self.message_user(request, str(exc), messages.ERROR)  # type: ignore[attr-defined]
                return change_page
            except RoutingBusy as exc:  # the lead's row held past the lock timeout: nothing written
                busy = str(exc) or f"Lead #{lead.pk} is busy (being changed right now): it was not closed; retry."
                self.message_user(request, busy, messages.ERROR)  # type: ignore[attr-defined]
            else:
                self.message_user(request, f"Lead #{lead.pk} closed as {outcome}.", messages.SUCCESS)  # type: ignore[attr-defined]
                return change_page
        return self._lead_form_page(request, lead, form, title=f"Close lead #{lead.pk}", template="close.html")

    def _lead_form_page(
        self, request: HttpRequest, lead: Lead, form: forms.Form, *, title: str, template: str, **extra: Any
    ) -> TemplateResponse:
        """The page of one lead's action (reassign, close): the lead, what it asks, the admin's frame."""
        context = {
            **self.admin_site.each_context(request),  # type: ignore[attr-defined]
            "title": title,
            "form": form,
            "lead": lead,
            "opts": Lead._meta,
            **extra,
        }
        return TemplateResponse(request, f"admin/leads/{template}", context)


class QueueActionsAdminMixin:
    """The fallback queue page: assign to a rep (intermediate form), route again, close."""

    actions: Any = [assign_to_rep, reroute, close_disqualified]
