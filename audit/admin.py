import json
import re
from typing import Any

from django.apps import apps
from django.contrib import admin
from django.db.models import Q
from django.http import HttpRequest
from django.urls import reverse
from django.utils import formats, timezone
from django.utils.html import escape, format_html
from django.utils.safestring import mark_safe

from routing_project.admin_lists import DateRangeFilter, EstimatedCountPaginator, distinct_indexed_values

from .models import QUEUE_ENTRY, AuditEvent
from .summary import event_summary, rep_ids


def _rep_names(ids: set[int]) -> dict[int, str]:
    # By app registry: the audit app imports nothing from the apps it records.
    rep_model = apps.get_model("rotation", "Rep")
    return dict(rep_model.objects.filter(pk__in=ids).values_list("pk", "name")) if ids else {}


def _group_ids(slugs: set[str]) -> dict[str, int]:
    group_model = apps.get_model("rotation", "Group")
    return dict(group_model.objects.filter(slug__in=slugs).values_list("slug", "pk")) if slugs else {}


_NAME_MARK = re.compile("\ue000(\\d+)\ue001")  # AuditEventAdmin.summary
_IMPORT_ID = re.compile(r"import-[0-9a-f]{12}")  # leads.bulk.new_import_id


def _an_id(value: str) -> bool:
    """A lead's or rep's id as typed in the address or the search box ("²" is a digit, no number)."""
    return value.isascii() and value.isdigit() and int(value) < 2**63


class GroupFilter(admin.SimpleListFilter):
    """By group slug, deleted groups included. The choices are read through audit_group_id_idx,
    one probe per group, not by a `SELECT DISTINCT "group"` over the whole trail."""

    title = "group"
    parameter_name = "group__exact"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        table = AuditEvent._meta.db_table
        return [(slug, slug) for slug in distinct_indexed_values(table, "group") if slug]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(group=self.value()) if self.value() is not None else queryset


class QueueEntryFilter(admin.SimpleListFilter):
    """The events by which leads entered the fallback queue, whichever way: queued at intake or
    import (`lead.queued`), escalated to no rep (`lead.escalated`) or rerouted to none
    (`lead.rerouted`). Each action writes its own type, so the "type" filter's `lead.queued`
    alone misses the leads an SLA or a reroute queued."""

    title = "fallback queue"
    parameter_name = "queue"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("entered", "Leads entering it (queued, or escalated or rerouted to no rep)")]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset.filter(QUEUE_ENTRY) if self.value() == "entered" else queryset


class DateFilter(DateRangeFilter):
    """Titled "By date": the field's own name made it "By at"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.title = "date"


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """The audit trail, read-only for everyone: no add, no change, no delete."""

    # The sentence first after the type: on a laptop beside the menu and the filters, the
    # columns past it are the ones scrolled to.
    list_display = ("id", "when", "type", "summary", "lead", "group_link", "rep", "actor")
    # Dates by range rather than a date hierarchy, whose drill-down reads every event's date.
    list_filter = ("type", QueueEntryFilter, GroupFilter, ("at", DateFilter))
    search_fields = ("actor", "request_id")  # and ids, imports and rep names (get_search_results)
    search_help_text = (
        "A lead's or a rep's id (20 or #20: the events of either), an import id (import-…), a rep's name, "
        "an actor (admin:…, api:…, system:…) or a request id."
    )
    paginator = EstimatedCountPaginator
    # "Show counts" would count each filter choice over the whole trail, in one full scan.
    show_facets = admin.ShowFacets.NEVER
    # Newest first, as a trail is read (the model's order, oldest first, serves the API's
    # per-lead history); through the primary key, so no sort of the whole table.
    ordering = ("-id",)
    readonly_fields = (
        "id",
        "type",
        "when",
        "actor",
        "lead",
        "group_link",
        "rep",
        "summary",
        "request_id",
        "pretty_explanation",
    )
    # The raw rep_id stays off the page: "rep" names the rep and its id. The explanation as
    # recorded (JSON) is folded away under the sentence that says it in words.
    fieldsets = (
        (None, {"fields": readonly_fields[:-1]}),
        ("Explanation as recorded (JSON)", {"classes": ("collapse",), "fields": ("pretty_explanation",)}),
    )
    list_per_page = 100
    show_full_result_count = False

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> tuple[Any, bool]:
        """A number is a lead or a rep id, looked up through their indexes: Django's "=lead_id"
        search compares the ids as text, which reads the whole trail (seconds on a large one)."""
        term = search_term.strip()
        number = term.removeprefix("#")  # as the queue and the leads list take "#41"
        if _an_id(number):
            return queryset.filter(Q(lead_id=int(number)) | Q(rep_id=int(number))), False
        if _IMPORT_ID.fullmatch(term):
            # The id an import report gives: in the explanation of each event the import wrote
            # (its request id too when run from the command line, not from the admin's upload).
            return queryset.filter(Q(explanation__import=term) | Q(request_id=term)), False
        found, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        if term:
            # A rep's name: the events of the reps it names (their ids, read from the rep table).
            rep_model = apps.get_model("rotation", "Rep")
            reps = rep_model.objects.filter(name__icontains=term).values_list("pk", flat=True)[:100]
            found = found | queryset.filter(rep_id__in=list(reps))
        return found, may_have_duplicates

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        """The trail of one lead or one rep (the links from their pages) says whose it is, and
        links back: the page said "Select audit event to view" over three unnamed rows."""
        extra: dict[str, Any] = {}
        lead_id, rep_id = request.GET.get("lead_id", ""), request.GET.get("rep_id", "")
        if _an_id(lead_id):
            extra["title"] = f"Audit trail of lead #{lead_id}"
            url = reverse("admin:leads_lead_change", args=[int(lead_id)])
            extra["trail_of"] = format_html('<a href="{}">Lead #{}: its page</a>', url, lead_id)
        elif _an_id(rep_id):
            name = _rep_names({int(rep_id)}).get(int(rep_id))
            extra["title"] = f"Audit trail of {name} (rep #{rep_id})" if name else f"Audit trail of rep #{rep_id}"
            if name:
                url = reverse("admin:rotation_rep_change", args=[int(rep_id)])
                extra["trail_of"] = format_html('<a href="{}">Rep {}: its page</a>', url, name)
        return super().changelist_view(request, {**extra, **(extra_context or {})})

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """The reps and groups the page's events name, read in one query each for the whole page."""
        changelist = super().get_changelist_instance(request)
        events = list(changelist.result_list)
        names = _rep_names(set().union(*(rep_ids(e.explanation, e.rep_id) for e in events)))
        groups = _group_ids({e.group for e in events if e.group})
        for event in events:
            self._annotate(request, event, names, groups)
        changelist.result_list = events
        return changelist

    def get_object(self, request: HttpRequest, object_id: str, from_field: str | None = None) -> Any:
        event = super().get_object(request, object_id, from_field)
        if event is not None:  # the event's own page
            names = _rep_names(rep_ids(event.explanation, event.rep_id))
            self._annotate(request, event, names, _group_ids({event.group} if event.group else set()))
        return event

    @staticmethod
    def _annotate(request: HttpRequest, event: AuditEvent, names: dict[int, str], groups: dict[str, int]) -> None:
        """The names and the pages to link, decided once for the request: the rep and the group
        link to their pages for a user who may view them (a deleted one stays text)."""
        user = request.user
        event._rep_names = names  # type: ignore[attr-defined]
        event._group_ids = groups if user.has_perm("rotation.view_group") else {}  # type: ignore[attr-defined]
        event._link_reps = user.has_perm("rotation.view_rep")  # type: ignore[attr-defined]

    def _names(self, obj: AuditEvent) -> dict[int, str]:
        names = getattr(obj, "_rep_names", None)
        if names is None:
            names = obj._rep_names = _rep_names(rep_ids(obj.explanation, obj.rep_id))  # type: ignore[attr-defined]
        return names

    @admin.display(description="When", ordering="at")
    def when(self, obj: AuditEvent) -> str:
        # Formatted here: on the event's page Django prints a method's datetime raw (ISO).
        return formats.localize(timezone.localtime(obj.at))

    @admin.display(description="Lead", ordering="lead_id")
    def lead(self, obj: AuditEvent) -> str:
        """A link to the lead's page: the trail is where a manager reads why, the lead's page
        where they act on it."""
        if obj.lead_id is None:
            return "-"
        return format_html('<a href="{}">#{}</a>', reverse("admin:leads_lead_change", args=[obj.lead_id]), obj.lead_id)

    @admin.display(description="Group", ordering="group")
    def group_link(self, obj: AuditEvent) -> str:
        """The group's page, where its rotation and members are: from an event, the next
        question is usually "who else is in this group?"."""
        if not obj.group:
            return "-"
        pk = getattr(obj, "_group_ids", {}).get(obj.group)
        if pk is None:  # deleted since, or not the user's to view
            return obj.group
        return format_html('<a href="{}">{}</a>', reverse("admin:rotation_group_change", args=[pk]), obj.group)

    @admin.display(description="Rep", ordering="rep_id")
    def rep(self, obj: AuditEvent) -> str:
        if obj.rep_id is None:
            return "-"
        name = self._names(obj).get(obj.rep_id)
        if not name:
            return f"#{obj.rep_id}"
        # <bdi>: a right-to-left name keeps its id after it, in the page's direction.
        if not getattr(obj, "_link_reps", False):
            return format_html("<bdi>{}</bdi> (#{})", name, obj.rep_id)
        url = reverse("admin:rotation_rep_change", args=[obj.rep_id])
        return format_html('<a href="{}"><bdi>{}</bdi></a> (#{})', url, name, obj.rep_id)

    @admin.display(description="What happened")
    def summary(self, obj: AuditEvent) -> str:
        # Each rep's name isolated (<bdi>): a right-to-left name took the id after it into its
        # own direction, and "محمد (#10)" read "(10#) محمد". The sentence is made with marks
        # (private-use characters) where the names go, escaped, then the names put in.
        names = self._names(obj)
        marked = {rep: f"\ue000{rep}\ue001" for rep in names}
        text = event_summary(type=obj.type, explanation=obj.explanation, rep_id=obj.rep_id, names=marked)
        return mark_safe(  # noqa: S308 - escaped above, each name escaped by format_html
            _NAME_MARK.sub(lambda m: format_html("<bdi>{}</bdi>", names[int(m.group(1))]), escape(text))
        )

    @admin.display(description="Explanation")
    def pretty_explanation(self, obj: AuditEvent) -> str:
        return format_html(
            "<pre style='white-space:pre-wrap'>{}</pre>", json.dumps(obj.explanation, indent=2, ensure_ascii=False)
        )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: AuditEvent | None = None) -> bool:
        return False
