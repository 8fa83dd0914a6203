"""Admin pages that are not a model's: the managers' dashboard and the CSV lead import."""

from __future__ import annotations

import logging
from collections.abc import Generator, Iterator
from datetime import timedelta
from typing import Any

from django import forms
from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, StreamingHttpResponse
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.utils import timezone

from rotation.models import Group

from . import dashboard
from .bulk import (
    ENCODINGS,
    FileScan,
    ImportFormatError,
    ImportReport,
    csv_text,
    encoding_problem,
    leads_import_steps,
    scan_in,
)

logger = logging.getLogger(__name__)

PERIODS = {
    "1": ("Last 24 hours", timedelta(days=1)),
    "7": ("Last 7 days", timedelta(days=7)),
    "30": ("Last 30 days", timedelta(days=30)),
}


def dashboard_page(request: HttpRequest) -> HttpResponse:
    """Per group: each rep's share of assignments against its fair share, median time to
    accept, SLA breaches, and the queue depth over the period."""
    if not request.user.has_perm("leads.view_lead"):
        raise PermissionDenied
    days = request.GET.get("days") or "7"
    problem = ""
    if days not in PERIODS:
        # Said on the page: a bookmarked ?days=90 must not pass 7 days off as 90.
        problem = f"No period “{days}”: showing the last 7 days (periods: {', '.join(PERIODS)} days)."
        days = "7"
    until = timezone.now()
    since = until - PERIODS[days][1]
    group = request.GET.get("group") or None
    panels = dashboard.dashboard_view(since=since, until=until, group_slug=group)
    # On the all-groups page: queued leads that no group's panel counts.
    no_group = 0 if group else dashboard.queued_without_group()
    context = {
        **admin.site.each_context(request),
        "title": "Routing dashboard",
        "panels": [{"panel": p, "share": dashboard.share_chart(p), "queue": dashboard.queue_chart(p)} for p in panels],
        "periods": [(key, label) for key, (label, _) in PERIODS.items()],
        "days": days,
        "since": since,
        "until": until,
        "group": group,
        # The picker: with many groups, the all-groups page is a long scroll to the one wanted.
        "groups": sorted(
            Group.objects.values_list("slug", "name", "active"),
            key=lambda g: (dashboard.natural_key(g[1]), dashboard.natural_key(g[0])),
        ),
        "problem": problem,
        "no_group": no_group,
    }
    return TemplateResponse(request, "admin/leads/dashboard.html", context)


class ImportForm(forms.Form):
    file = forms.FileField(label="CSV file", help_text="A header row naming the columns.")
    encoding = forms.ChoiceField(
        choices=list(ENCODINGS.items()),
        initial="utf-8",
        required=False,  # UTF-8 when a post leaves it out
        help_text="How the file's text is written: Excel's \"CSV UTF-8\" is UTF-8.",
    )
    notify = forms.BooleanField(
        required=False, initial=True, label="Notify the reps (webhooks and e-mails) for the leads assigned"
    )


# Where the page is cut while an upload is imported: the progress bar, then the report.
_PROGRESS_MARK = "<!-- import progress -->"


def import_page(request: HttpRequest) -> HttpResponse | StreamingHttpResponse:
    """Upload a CSV of leads: validated, imported and routed like `manage.py import_leads`,
    the page showing a progress bar as the batches are committed."""
    if not request.user.has_perm("leads.add_lead"):
        raise PermissionDenied
    report = None
    error = ""
    form = ImportForm(request.POST or None, request.FILES or None)
    context: dict[str, Any] = {
        **admin.site.each_context(request),
        "title": "Import leads",
        "form": form,
        "columns": ", ".join(c for c in _columns()),
    }
    if request.method == "POST" and form.is_valid():
        upload = form.cleaned_data["file"]
        actor = f"admin:{request.user.get_username()}:{upload.name}"[:200]
        encoding = form.cleaned_data["encoding"] or "utf-8"
        # Streamed: Django spools a large upload to a temporary file; it is read in chunks.
        scanned = scan_in(upload.file)
        error = _encoding_refused(scanned, encoding)
        if not error:
            steps = leads_import_steps(
                lines=csv_text(upload.file, encoding),
                actor=actor,
                notify_reps=form.cleaned_data["notify"],
                encoding=encoding,
            )
            try:
                first = next(steps)  # the header is checked here: a bad file is answered at once
            except ImportFormatError as exc:
                error = str(exc)
            except StopIteration as done:  # a header and no rows
                report = done.value
            else:
                page = render_to_string("admin/leads/import.html", {**context, "total": scanned.rows}, request)
                return StreamingHttpResponse(_import_streamed(page, steps, first, scanned.rows, upload))
    context.update({"report": report, **_report_rows(report), "error": error})
    return TemplateResponse(request, "admin/leads/import.html", context)


def _import_streamed(
    page: str, steps: Generator[int, None, ImportReport], first: int, total: int, upload: Any
) -> Iterator[str]:
    """The page up to its progress bar, then one line of script per batch committed, then the
    report and the rest of the page. A browser shows each part as it arrives."""
    head, tail = page.split(_PROGRESS_MARK, 1)
    yield head
    done, report = first, None
    try:
        while True:
            yield f"<script>leadImportProgress({done})</script>\n"
            try:
                done += next(steps)
            except StopIteration as finished:
                report = finished.value
                break
    except GeneratorExit:
        # The page closed (the tab, the connection) mid-import: the import stops with it, the
        # batch in progress rolled back. Nobody reads the page now: the log says how far it got.
        logger.warning(
            "lead import stopped: the page was closed after %s rows (their batches are committed); "
            "uploading the file again imports the rest",
            done,
        )
        raise
    except Exception as exc:  # noqa: BLE001 - the page has started: said there, and logged
        logger.exception("lead import stopped")
        stopped = (
            f"The import stopped ({type(exc).__name__}) after {done} rows: the batches before it are "
            "imported; upload the file again to import the rest (what is imported is skipped)."
        )
        yield render_to_string("admin/leads/import_report.html", {"error": stopped})
    else:
        yield "<script>leadImportProgress(null)</script>\n"  # done: the bar full
        yield render_to_string("admin/leads/import_report.html", {"report": report, **_report_rows(report)})
    finally:
        steps.close()
        upload.close()
    yield tail


def _encoding_refused(scanned: FileScan, encoding: str) -> str:
    """`encoding_problem`, and how to choose another encoding on this page; "" when none."""
    problem = encoding_problem(scanned, encoding)
    if problem is None:
        return ""
    if problem.instead == "utf-8":
        return f"{problem.message} Choose UTF-8 under Encoding."
    if problem.choices:
        return f'{problem.message} Choose the one that reads right under Encoding, or save it as "CSV UTF-8".'
    return problem.message


def _report_rows(report: ImportReport | None) -> dict[str, list[Any]]:
    """The first 200 bad rows, rows repeating an earlier row's external_id, and rows differing
    from the lead their external_id names."""
    if report is None:
        return {"errors": [], "repeats": [], "changes": []}
    return {"errors": report.errors[:200], "repeats": report.repeats[:200], "changes": report.changes[:200]}


def _columns() -> tuple[str, ...]:
    from .bulk import COLUMNS

    return (*COLUMNS, "attributes.<key>")
