import itertools
from contextlib import suppress
from typing import Any
from zoneinfo import ZoneInfo

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.validators import DomainNameValidator, MinValueValidator
from django.db import transaction
from django.db.models import Count, Max, Min, QuerySet
from django.forms import BaseInlineFormSet
from django.http import HttpRequest
from django.template.defaultfilters import pluralize
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import mark_safe
from rest_framework import serializers

from routing_project.admin_forms import STRICT_JSON, CheckedAutocompleteMixin, EditedFieldsForm, RowsGoneAdminMixin
from routing_project.api import ascii_email

from . import services
from .domains import domain_unicode
from .eligibility import reason_in_words
from .models import Absence, Account, Group, Membership, Rep, RoutingRule, is_timezone
from .rules import LEAD_FIELDS
from .services import MAX_POSITION, MAX_PRIORITY, POSITION_TOO_HIGH, given_position_refused


def admin_actor(request: HttpRequest) -> str:
    return f"admin:{request.user.get_username()}"


_PLACEHOLDER_POSITIONS = itertools.count(1_000_000_000)


class AuditedDeleteMixin:
    """ "Delete selected" goes through `delete_model` (the services) one object at a time, so
    a bulk delete leaves the same audit events as deleting each from its page."""

    def delete_queryset(self, request: HttpRequest, queryset: Any) -> None:
        for obj in queryset:
            self.delete_model(request, obj)  # type: ignore[attr-defined]

    def response_action(self, request: HttpRequest, queryset: Any) -> Any:
        # One transaction, as Django's delete page has: a bulk delete that cannot finish (a
        # group's rotation row held past the lock timeout) deletes nothing, writes no audit
        # event and no admin log entry, as the busy page then says.
        with transaction.atomic():
            return super().response_action(request, queryset)  # type: ignore[misc]

    def get_deleted_objects(self, objs: Any, request: HttpRequest) -> Any:
        # What keeps an object (a group's or rep's leads) is said in a line per object, from one
        # EXISTS per kind of row: Django's own list loads and prints every protected row, a
        # year of a busy group's leads (minutes, megabytes) for a page that only says no.
        kept = [f"{obj}: kept by its {', '.join(what)}" for obj in objs if (what := services.kept_by(obj))]
        if kept:
            return [], {}, set(), kept
        deleted, model_count, perms_needed, protected = super().get_deleted_objects(objs, request)  # type: ignore[misc]
        if protected:
            # A rep or group with leads is kept by them (PROTECT), for everyone: said as that,
            # not as "your account doesn't have permission to delete leads" (no one has).
            perms_needed = set()
        return deleted, model_count, perms_needed, protected


def _lowest(field: Any, lowest: int) -> None:
    """The model refuses values below `lowest`; the form field of its PositiveIntegerField says
    0, so -1 was told "at least 0" and then 0 "at least 1". Told the real lowest at once."""
    field.min_value = lowest
    field.validators = [v for v in field.validators if not isinstance(v, MinValueValidator)]
    field.validators.append(MinValueValidator(lowest))
    field.widget.attrs["min"] = lowest


class MembershipForm(EditedFieldsForm):
    position = forms.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_POSITION,  # given: up to MAX_GIVEN_POSITION (clean_position), as the API
        help_text="Leave empty to append at the end of the rotation.",
        error_messages={"max_value": POSITION_TOO_HIGH},  # one bound said, whatever was typed
    )

    class Meta:
        model = Membership
        fields = ("rep", "position", "weight", "active", "max_open", "max_per_day")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "weight" in self.fields:  # not for those who may only read the page
            _lowest(self.fields["weight"], 1)
        if self.instance.pk is not None:
            # A member row is one rep's place in the rotation: another rep is a removal and a
            # joiner (both audited), not an edit that would hand over its position and counts.
            self.fields["rep"].disabled = True
            # Nor a "+" beside it: a rep added there could not be picked in the fixed box.
            # (The pencil and the eye still open the rep's page.)
            self.fields["rep"].widget.can_add_related = False
            # Shown from the row read with the member (MembershipInline.get_queryset).
            self.fields["rep"].widget.widget.chosen = self.instance.rep

    def clean_position(self) -> int | None:
        position: int | None = self.cleaned_data.get("position")
        if refused := given_position_refused(position, self.instance.position):
            raise forms.ValidationError(refused)
        return position

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        # Left empty: a new member is appended, an existing one moves to the end.
        self.auto_position = cleaned.get("position") is None
        group_id = self.instance.group_id
        if self.auto_position and group_id is not None:
            others = Membership.objects.filter(group_id=group_id).exclude(pk=self.instance.pk)
            top = others.aggregate(m=Max("position"))["m"]
            if top is not None and top >= MAX_POSITION:
                self.add_error("position", f"The last position is {MAX_POSITION:,}, the highest: give a free one.")
        if self.auto_position:
            # A distinct placeholder for validation; the service allocates the real one under the lock.
            cleaned["position"] = next(_PLACEHOLDER_POSITIONS)
        reason = (cleaned.get("paused_reason") or "").strip()
        if reason and cleaned.get("active", True):
            self.add_error("paused_reason", "Only a paused member has a reason: untick Active.")
        cleaned["paused_reason"] = reason
        return cleaned


class MembershipFormSet(BaseInlineFormSet):
    def clean(self) -> None:
        super().clean()
        if self.instance.pk is None or any(form.errors for form in self.forms):
            return
        # The page holds the members as they were when it was read. One who joined (or moved)
        # since is not on it: a row placed on that member's position would fail the unique
        # position at commit (a server error). Rows of the page are checked among themselves
        # (a swap is fine); this checks them against the members the page does not hold.
        on_page = {form.instance.pk for form in self.forms if form.instance.pk is not None}
        others = dict(
            Membership.objects.filter(group=self.instance).exclude(pk__in=on_page).values_list("position", "rep__name")
        )
        for form in self.forms:
            if form in self.deleted_forms or not form.has_changed() or getattr(form, "auto_position", False):
                continue
            position = form.cleaned_data.get("position")
            if position in others:
                form.add_error(
                    "position",
                    f"Position {position} is taken in this group (by {others[position]}, who joined or moved "
                    "since this page was read): give a free one, or leave it empty to append.",
                )


class MembershipInline(CheckedAutocompleteMixin, admin.TabularInline):
    model = Membership
    form = MembershipForm
    formset = MembershipFormSet
    extra = 0
    fields = ("rep", "position", "weight", "active", "max_open", "max_per_day", "paused_reason")
    autocomplete_fields = ("rep",)
    ordering = ("position",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Membership]:
        # The row's title names its rep and group.
        return super().get_queryset(request).select_related("rep", "group")


class GroupForm(EditedFieldsForm):
    class Meta:
        model = Group
        fields = (
            "slug",
            "name",
            "strategy",
            "active",
            "is_default",
            "timezone",
            "sla_minutes",
            "max_attempts",
            "auto_pause_after_misses",
            "dedup_days",
            "owner_match_fallback_to_rotation",
        )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if "max_attempts" in self.fields:  # not for those who may only read the page
            _lowest(self.fields["max_attempts"], 1)

    def _get_validation_exclusions(self) -> Any:
        # "One default group" is the service's to keep: ticking the flag here moves it from the
        # old default (group_save, under a lock, both audited). Checked on the form, against the
        # old default still holding it, the constraint would refuse every move.
        exclude = super()._get_validation_exclusions()  # type: ignore[misc]  # Django API missing from the stubs
        exclude.add("is_default")
        return exclude


@admin.register(Group)
class GroupAdmin(RowsGoneAdminMixin, AuditedDeleteMixin, admin.ModelAdmin):
    form = GroupForm
    # Who is in it and whether it takes leads before its SLA settings: on a laptop, beside the
    # menu and the filters, the last columns are scrolled to.
    list_display = ("slug", "name", "strategy", "member_count", "active", "is_default", "sla_minutes", "max_attempts")
    list_filter = ("strategy", "active", "is_default")
    search_fields = ("slug", "name")
    prepopulated_fields = {"slug": ("name",)}
    inlines = [MembershipInline]
    readonly_fields = ("rotation_view",)
    fieldsets = (
        (None, {"fields": ("slug", "name", "strategy", "active", "is_default", "timezone")}),
        ("SLA and escalation", {"fields": ("sla_minutes", "max_attempts", "auto_pause_after_misses")}),
        ("Intake", {"fields": ("dedup_days", "owner_match_fallback_to_rotation")}),
        ("Rotation now", {"fields": ("rotation_view",)}),
    )

    def get_queryset(self, request: HttpRequest) -> QuerySet[Group]:
        return super().get_queryset(request).annotate(_members=Count("memberships"))

    def get_readonly_fields(self, request: HttpRequest, obj: Group | None = None) -> Any:
        # As over the API: the slug names the group in URLs, in the forms and integrations
        # that post leads to it, and in its audit trail; renamed, the trail would split.
        readonly = tuple(super().get_readonly_fields(request, obj))
        return readonly if obj is None else ("slug", *readonly)

    def get_prepopulated_fields(self, request: HttpRequest, obj: Group | None = None) -> dict[str, Any]:
        return {} if obj is not None else super().get_prepopulated_fields(request, obj)

    @admin.display(description="Members", ordering="_members")
    def member_count(self, obj: Group) -> int:
        return getattr(obj, "_members", 0)

    @admin.display(description="Rotation")
    def rotation_view(self, obj: Group) -> str:
        if obj.pk is None:
            return "Saved groups show their rotation here."
        from leads.selectors import ahead_limit, rotation_view

        # As saved: on a form with errors `obj` holds the refused values (a bad time zone).
        stored = Group.objects.filter(pk=obj.pk).first()
        if stored is None:
            return "—"
        view = rotation_view(group=stored)
        zones = dict(Rep.objects.filter(pk__in=[m["rep"]["id"] for m in view["members"]]).values_list("pk", "timezone"))
        for m in view["members"]:
            if m["reason"]:
                m["reason"] = reason_in_words(m["reason"], zones.get(m["rep"]["id"], "UTC"))
        # The pointer is where the next turn's walk starts; past the last member it wraps to the
        # first (rotation/strategies.py), so "pointer at position 4" of three members said the
        # stored number, not where the walk starts.
        positions = sorted(m["position"] for m in view["members"])
        start = next((p for p in positions if p >= view["pointer"]), positions[0] if positions else None)
        wrapped = bool(positions) and view["pointer"] > positions[-1]
        # The strategy as the form names it ("Round robin"), not its code.
        context = {
            "view": view,
            "strategy": stored.get_strategy_display(),
            "start": start,
            "wrapped": wrapped,
            "ahead_limit": ahead_limit(len(view["members"])),
        }
        return render_to_string("admin/rotation/rotation_view.html", context)

    def save_model(self, request: HttpRequest, obj: Group, form: Any, change: bool) -> None:
        # The default it takes over from (the flag moves): said, or it changed without a word.
        replaced = None
        if obj.is_default and "is_default" in form.changed_data:
            replaced = Group.objects.filter(is_default=True).exclude(pk=obj.pk).values_list("slug", flat=True).first()
        services.group_save(group=obj, actor=admin_actor(request), changed=form.changed_data)
        if replaced:
            self.message_user(
                request,
                f"The default group is now {obj.slug}, in place of {replaced}: the leads no rule matches go here.",
                messages.INFO,
            )
        if change and not obj.active and {"active", "is_default"} & set(form.changed_data):
            _warn_inactive_group_gets_leads(self, request, obj)
        if change and "is_default" in form.changed_data and not Group.objects.filter(is_default=True).exists():
            self.message_user(
                request,
                f"No group is the default now ({obj.slug} no longer is): the leads no rule matches, and that name "
                "no group, wait in the fallback queue (“no rule matched and there is no default group”) until a "
                "group is made the default, which then takes them.",
                messages.WARNING,
            )

    def delete_model(self, request: HttpRequest, obj: Group) -> None:
        with suppress(Group.DoesNotExist):  # deleted by another request meanwhile: gone either way
            services.group_delete(group=obj, actor=admin_actor(request))

    def save_formset(self, request: HttpRequest, form: Any, formset: BaseInlineFormSet, change: bool) -> None:
        actor = admin_actor(request)
        if formset.model is not Membership:
            return super().save_formset(request, form, formset, change)
        formset.save(commit=False)
        for obj in formset.deleted_objects:
            with suppress(Membership.DoesNotExist):  # removed by another request meanwhile
                services.membership_remove(membership=obj, actor=actor)
        # Rows left to append (or to move to the end) go last, after every row given its place,
        # so that they append after those places (appended first, one could take a position
        # another row names).
        forms = sorted(formset.forms, key=lambda f: getattr(f, "auto_position", False))
        for member_form in forms:
            obj = member_form.instance
            if member_form in formset.deleted_forms or not member_form.has_changed():
                continue
            if obj.pk is None:
                fields = {f: getattr(obj, f) for f in ("weight", "active", "max_open", "max_per_day")}
                position = None if getattr(member_form, "auto_position", False) else obj.position
                services.membership_add(group=form.instance, rep=obj.rep, actor=actor, position=position, **fields)
            else:
                try:
                    services.membership_update(
                        membership=obj,
                        actor=actor,
                        changed=member_form.changed_data,
                        to_end=getattr(member_form, "auto_position", False),
                    )
                except Membership.DoesNotExist:
                    self.message_user(
                        request,
                        f"{obj.rep} was removed from the group meanwhile: that row's changes were not saved.",
                        messages.WARNING,
                    )


def _warn_inactive_group_gets_leads(modeladmin: admin.ModelAdmin, request: HttpRequest, group: Group) -> None:
    """An inactive group still gets the leads its active rules match (and, as the default
    group, those no rule matches), and queues them: said when it is made inactive, or sales
    ops learn it from the queue."""
    rules = list(RoutingRule.objects.filter(group=group, active=True).order_by("priority", "id"))
    sent: list[str] = []
    if rules:
        sent.append(
            format_html(
                'the leads its active rules match (<a href="{}?group__id__exact={}&amp;active__exact=1">{}</a>)',
                reverse("admin:rotation_routingrule_changelist"),
                group.pk,
                ", ".join(rule.name for rule in rules),
            )
        )
    if group.is_default:
        sent.append("the leads no rule matches (it is the default group)")
    if sent:
        modeladmin.message_user(
            request,
            format_html(
                "The group {} is inactive: {} wait in the fallback queue until it is active again.",
                group.slug,
                mark_safe(" and ".join(sent)),  # noqa: S308 - each part escaped by format_html
            ),
            messages.WARNING,
        )


class AbsenceInline(admin.TabularInline):
    """A rep's absences, entered and shown in the rep's time zone (RepAdmin.changeform_view),
    as the rep's working hours are."""

    model = Absence
    extra = 0
    fields = ("starts_at", "ends_at", "reason")

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        formset = super().get_formset(request, obj, **kwargs)
        # A new rep's: the time zone it is created with (RepAdmin.changeform_view).
        where = f"In the rep's time zone ({obj.timezone})." if obj is not None else "In the rep's time zone."
        if obj is not None and timezone.get_current_timezone_name() != obj.timezone:
            where = f"In UTC: an absence of this rep has no time in its time zone ({obj.timezone})."
        # The zone in the column headers too: a tabular inline shows help text only on hover,
        # and a time typed as the browser's clock reads (another zone) saved without a hint.
        zone = f" ({timezone.get_current_timezone_name()})" if obj is not None else " (the rep's time zone)"
        for name, label in (("starts_at", "Starts at"), ("ends_at", "Ends at")):
            formset.form.base_fields[name].help_text = where
            formset.form.base_fields[name].label = label + zone
        return formset


class JSONOrEmptyField(forms.JSONField):
    """No value shown as an empty box, as the help text says ("Empty: always"), not as the
    word null; an empty box saves as no value."""

    def prepare_value(self, value: Any) -> Any:
        return "" if value is None else super().prepare_value(value)

    def to_python(self, value: Any) -> Any:
        if isinstance(value, str) and not value.strip():  # blank lines are an empty box
            return None
        return super().to_python(value)


class RepForm(EditedFieldsForm):
    # By username: a raw id's lookup opened the user list, which only superusers may read
    # (sales ops were shown a 403 in the popup), and left a bare number in the box.
    user = forms.ModelChoiceField(
        queryset=get_user_model().objects.all(),
        to_field_name=get_user_model().USERNAME_FIELD,
        required=False,
        widget=forms.TextInput,
        label="Admin login",
        help_text="Optional: the username the rep signs in to this admin with.",
        error_messages={"invalid_choice": "No user with that username."},
    )

    class Meta:
        model = Rep
        fields = ("name", "email", "user", "timezone", "active", "working_hours")
        field_classes = {"working_hours": JSONOrEmptyField}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.user_id is not None and "user" in self.fields:
            self.initial["user"] = self.instance.user.get_username()

    def clean_email(self) -> str:
        # As the API stores it: the domain in ASCII (IDNA), so that one mailbox is one rep
        # however its domain was typed, and every answer holding the address is an `email`.
        try:
            return ascii_email(self.cleaned_data["email"])
        except serializers.ValidationError as exc:
            raise forms.ValidationError(exc.detail) from None


def _absences_have_times_in(zone: ZoneInfo, *, rep_id: int) -> bool:
    bounds = Absence.objects.filter(rep_id=rep_id).aggregate(first=Min("starts_at"), last=Max("ends_at"))
    try:
        for value in bounds.values():
            if value is not None:
                value.astimezone(zone)
    except OverflowError:
        return False
    return True


def _open_leads(rep: Rep) -> tuple[int, str]:
    """How many open leads the rep holds, and the leads list filtered to them."""
    from leads.models import OPEN_STATUSES  # as rotation_view: the admin reads leads, rotation does not

    held = rep.leads.filter(status__in=OPEN_STATUSES).count()  # through lead_owner_status_idx
    query = urlencode({"owner__id__exact": str(rep.pk), "status__in": ",".join(map(str, OPEN_STATUSES))})
    return held, f"{reverse('admin:leads_lead_changelist')}?{query}"


@admin.register(Rep)
class RepAdmin(RowsGoneAdminMixin, AuditedDeleteMixin, admin.ModelAdmin):
    form = RepForm
    list_display = ("name", "email", "timezone", "active", "user")
    list_filter = ("active",)
    search_fields = ("name", "email")
    list_select_related = ("user",)
    inlines = [AbsenceInline]
    formfield_overrides = STRICT_JSON
    readonly_fields = ("groups", "leads_and_trail")

    @admin.display(description="Groups")
    def groups(self, obj: Rep) -> str:
        """Where the rep takes leads, each group linked: without it, which groups a rep is in
        (or paused in) was found only by opening every group's page."""
        if obj.pk is None:
            return "A rep joins a group on the group's page (its members)."
        members = Membership.objects.filter(rep=obj).select_related("group").order_by("group__slug")
        if not members:
            return "In no group: takes no leads from the rotation. A rep joins a group on the group's page."
        return format_html_join(
            mark_safe("<br>"),  # noqa: S308 - a constant
            '<a href="{}">{}</a>: position {}, weight {}{}',
            (
                (
                    reverse("admin:rotation_group_change", args=[m.group_id]),
                    m.group.slug,
                    m.position,
                    m.weight,
                    "" if m.active else f", paused ({m.paused_reason})" if m.paused_reason else ", paused",
                )
                for m in members
            ),
        )

    @admin.display(description="Leads")
    def leads_and_trail(self, obj: Rep) -> str:
        """The rep's open leads and its audit trail, a click away."""
        if obj.pk is None:
            return "-"
        held, url = _open_leads(obj)
        return format_html(
            '<a href="{}">{} open lead{}</a> · <a href="{}?rep_id={}">Audit trail of this rep</a>',
            url,
            held,
            pluralize(held),
            reverse("admin:audit_auditevent_changelist"),
            obj.pk,
        )

    def autocomplete_label(self, obj: Rep) -> str:
        """Where a rep is picked (a group's members, an account's owner): reps may share a name."""
        return f"{obj.name} <{obj.email}>" + ("" if obj.active else " (inactive)")

    def save_model(self, request: HttpRequest, obj: Rep, form: Any, change: bool) -> None:
        services.rep_save(rep=obj, actor=admin_actor(request), changed=form.changed_data)
        if change and not obj.active and "active" in form.changed_data:
            self._warn_open_leads_kept(request, obj)

    def _warn_open_leads_kept(self, request: HttpRequest, rep: Rep) -> None:
        """A rep made inactive takes no new leads but keeps the open ones it holds (until a
        manager moves them): said, with a link to them, or they look handled."""
        held, url = _open_leads(rep)
        if not held:
            return
        self.message_user(
            request,
            format_html(
                "{} still holds {} open lead{}: they stay with this rep until a manager reassigns them or "
                'routes them again. <a href="{}">See them</a>.',
                rep.name,
                held,
                pluralize(held),
                url,
            ),
            messages.WARNING,
        )

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> Any:
        # The page's dates and times (its absences) are read and shown in the rep's time zone
        # (as stored: a change of it applies from the next page), rendered inside it.
        zone = "UTC"
        if object_id is not None and object_id.isascii() and object_id.isdigit():
            zone = Rep.objects.filter(pk=int(object_id)).values_list("timezone", flat=True).first() or "UTC"
            if not _absences_have_times_in(ZoneInfo(zone), rep_id=int(object_id)):
                # An absence set over the API (in UTC) near the year 9999 or 1 has no time in
                # the rep's zone: the page is shown, and read, in UTC rather than failing.
                zone = "UTC"
        elif object_id is None and request.method == "POST" and is_timezone(request.POST.get("timezone", "")):
            # A new rep: its absences are entered in the time zone it is created with.
            zone = request.POST["timezone"]
        with timezone.override(ZoneInfo(zone)):
            response = super().changeform_view(request, object_id, form_url, extra_context)
            if isinstance(response, TemplateResponse):
                response.render()
        return response

    def delete_model(self, request: HttpRequest, obj: Rep) -> None:
        with suppress(Rep.DoesNotExist):  # deleted by another request meanwhile
            services.rep_delete(rep=obj, actor=admin_actor(request))

    def save_formset(self, request: HttpRequest, form: Any, formset: BaseInlineFormSet, change: bool) -> None:
        actor = admin_actor(request)
        formset.save(commit=False)
        for obj in formset.deleted_objects:
            with suppress(Absence.DoesNotExist):  # removed by another request meanwhile
                services.absence_remove(absence=obj, actor=actor)
        for obj, changed in formset.changed_objects:
            services.absence_update(absence=obj, actor=actor, changed=changed)
        for obj in formset.new_objects:
            services.absence_add(absence=obj, actor=actor)
        # Saved as typed, but said: an absence already over (its times read in the rep's zone,
        # not the browser's) keeps nobody out of the rotation.
        now = timezone.now()
        for obj in [*formset.new_objects, *(o for o, _ in formset.changed_objects)]:
            if obj.ends_at <= now:
                zone = timezone.get_current_timezone_name()
                messages.warning(
                    request,
                    f"The absence ending {timezone.localtime(obj.ends_at):%Y-%m-%d %H:%M} ({zone}) is already over:"
                    " it keeps the rep out of no rotation. Its times are read in the rep's time zone.",
                )


class RoutingRuleForm(EditedFieldsForm):
    # The API's limit (rotation/api/rules.py): a rule saved past it is answered by the API
    # outside its own schema, and sent back unchanged it would be refused there.
    priority = forms.IntegerField(
        min_value=0,
        max_value=MAX_PRIORITY,
        initial=100,
        help_text="Rules are tried lowest first (1 before 10); the first whose conditions all hold wins.",
    )

    class Meta:
        model = RoutingRule
        fields = ("name", "priority", "conditions", "group", "active")
        # The one field sales ops cannot guess: its shape, its fields and its operators. (A
        # help text is not escaped: no angle brackets in it.)
        help_texts = {
            "conditions": (
                "All must hold. A list in JSON, e.g. "
                '[{"field": "country", "op": "in", "value": ["FR", "BE"]}, '
                '{"field": "company_size", "op": "gte", "value": 500}]. '
                f"Fields: {', '.join(LEAD_FIELDS)}, or a key of the lead's attributes, as attributes.campaign. "
                "Operators: equals, in, not_in, contains, gte and lte (numbers), exists (true or false). "
                "At least one: the leads no rule matches go to the default group."
            ),
        }
        # An empty list is refused (as over the API): said as what it is, not "This field is
        # required." under a box that shows [].
        error_messages = {
            "conditions": {
                "required": "A rule needs at least one condition: the leads no rule matches go to the default group."
            }
        }


@admin.register(RoutingRule)
class RoutingRuleAdmin(AuditedDeleteMixin, admin.ModelAdmin):
    form = RoutingRuleForm
    list_display = ("priority", "name", "target", "active")
    list_display_links = ("name",)
    list_filter = ("active", "group")
    list_select_related = ("group",)
    search_fields = ("name",)
    ordering = ("priority", "id")
    formfield_overrides = STRICT_JSON

    @admin.display(description="Group", ordering="group__slug")
    def target(self, obj: RoutingRule) -> str:
        """An active rule sending leads to an inactive group queues them all: the list says
        so beside the group, where sales ops scanning the rules would otherwise not see it."""
        if obj.group.active:
            return str(obj.group)
        if not obj.active:
            return format_html("{} <strong>(inactive)</strong>", obj.group)
        return format_html("{} <strong>(inactive: this rule's leads wait in the queue)</strong>", obj.group)

    def save_model(self, request: HttpRequest, obj: RoutingRule, form: Any, change: bool) -> None:
        services.rule_save(rule=obj, actor=admin_actor(request), changed=form.changed_data)
        if obj.active and not obj.group.active:
            self.message_user(
                request,
                format_html(
                    'The group <a href="{}">{}</a> is inactive: the leads this rule matches wait in the '
                    "fallback queue until it is active again.",
                    reverse("admin:rotation_group_change", args=[obj.group_id]),
                    obj.group.slug,
                ),
                messages.WARNING,
            )

    def delete_model(self, request: HttpRequest, obj: RoutingRule) -> None:
        with suppress(RoutingRule.DoesNotExist):  # deleted by another request meanwhile
            services.rule_delete(rule=obj, actor=admin_actor(request))


class AccountForm(EditedFieldsForm):
    class Meta:
        model = Account
        fields = ["domain", "name", "owner"]
        # What an account does is not in its three fields' names: said where it is set.
        help_texts = {
            "domain": "The email domain of the account's contacts, like acme.example.",
            "owner": "Leads whose email has this domain go to this rep, skipping the rotation. When the rep "
            "cannot take them (away, paused, inactive), the group's owner match fallback setting decides: "
            "the rotation, or the queue.",
        }

    def clean_domain(self) -> str:
        # As the service stores it, before the form's unique check compares it.
        domain = domain_unicode(self.cleaned_data.get("domain") or "")
        # Compared with the part of a lead's email after the "@": anything else ("@acme.example",
        # a URL, a bare word) would be saved and never match a lead.
        DomainNameValidator(message="Enter the email domain alone, like acme.example (no @, no http://).")(domain)
        return domain


@admin.register(Account)
class AccountAdmin(CheckedAutocompleteMixin, AuditedDeleteMixin, admin.ModelAdmin):
    form = AccountForm
    list_display = ("domain", "name", "owner")
    search_fields = ("domain", "name")
    list_select_related = ("owner",)
    autocomplete_fields = ("owner",)

    def save_model(self, request: HttpRequest, obj: Account, form: Any, change: bool) -> None:
        services.account_save(account=obj, actor=admin_actor(request), changed=form.changed_data)

    def delete_model(self, request: HttpRequest, obj: Account) -> None:
        services.account_delete(account=obj, actor=admin_actor(request))
