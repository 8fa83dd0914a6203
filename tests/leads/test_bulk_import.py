"""Bulk import: streamed CSV, validated like the API, idempotent by external_id, routed in
batches under one rotation lock per group per batch, with intake's audit explanation."""

import io
import logging
import re
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from rest_framework import serializers

from audit.models import AuditEvent
from leads.bulk import ImportFormatError, csv_text, leads_import, scan
from leads.models import Assignment, Lead
from notifications.models import OutboxMessage
from rotation import services
from rotation.models import Membership, RotationState, RoutingRule
from routing_project.logging import RequestIdFilter, request_id_var
from tests.factories import GroupFactory, RepFactory

pytestmark = pytest.mark.django_db

HEADER = "external_id,email,first_name,company,country,score,group,attributes.campaign\n"


def csv_of(*rows: str, header: str = HEADER) -> io.StringIO:
    return io.StringIO(header + "".join(r + "\n" for r in rows))


def run(text: io.StringIO, **kwargs):
    return leads_import(lines=text, actor="import:test", **kwargs)


def good_rows(n: int, group: str = "emea", prefix: str = "x") -> list[str]:
    return [f"{prefix}-{i},{prefix}{i}@customer.example,Jane,Acme,fr,{i % 100},{group},spring" for i in range(n)]


def test_bad_rows_are_reported_by_line_and_the_rest_imported(make_group):
    make_group(2, slug="emea")
    report = run(
        csv_of(
            "a-1,ok1@customer.example,Jane,Acme,FR,10,emea,",
            "a-2,not-an-email,Jane,Acme,FR,10,emea,",
            "a-3,ok3@customer.example,Jane,Acme,XX,101,emea,",
            "a-4,ok4@customer.example,Jane,Acme,FR,10,nowhere,",
            '"a-5","ok5@customer.example","Jane","Acme\nWest",FR,10,emea,',  # a cell over two lines
            "a-6,,Jane,Acme,FR,10,emea,",
            "a-7,ok7@customer.example,Jane,Acme,FR,10,emea,x,extra",
        )
    )
    assert (report.rows, report.imported, report.invalid) == (7, 2, 5)
    by_line = {e.line: e.errors for e in report.errors}
    assert set(by_line) == {3, 4, 5, 8, 9}
    assert "email" in by_line[3]
    assert set(by_line[4]) == {"country", "score"}
    assert by_line[5] == {"group": ["No group with slug 'nowhere'."]}
    assert by_line[8] == {"email": ["This field is required."]}
    assert "row" in by_line[9]
    assert "line 4: country:" in str(report.errors[1])
    assert Lead.objects.get(external_id="a-5").company == "Acme\nWest"
    assert Lead.objects.get(external_id="a-1").attributes == {}
    assert Lead.objects.get(external_id="a-1").country == "FR"


def test_header_problems_stop_the_import_before_anything_is_written(make_group):
    make_group(1, slug="emea")
    with pytest.raises(ImportFormatError, match="unknown columns: 'colour'"):
        run(csv_of("1,a@b.example,red", header="external_id,email,colour\n"))
    with pytest.raises(ImportFormatError, match="'email' is missing"):
        run(csv_of("1", header="external_id\n"))
    with pytest.raises(ImportFormatError, match="empty"):
        run(io.StringIO(""))
    with pytest.raises(ImportFormatError, match="Bad header: text after a closing quote"):
        run(csv_of("a@b.example,emea", header='"email"x,group\n'))
    with pytest.raises(ImportFormatError, match=r"Bad header: a quoted cell is not closed .* \(lines 2-4\)"):
        run(csv_of("a@b.example,emea", header='\nemail,"group\n\n'))
    assert not Lead.objects.exists()


def test_a_very_wide_header_is_checked_in_linear_time():
    # 100,000 columns: counting each name's repeats with list.count took minutes (quadratic),
    # on one upload of a few megabytes; counted once it takes a fraction of a second.
    import time

    from leads.bulk import _check_header

    header = ["email", *(f"attributes.k{i}" for i in range(100_000))]
    started = time.perf_counter()
    assert len(_check_header(header)) == 100_001
    assert time.perf_counter() - started < 10
    with pytest.raises(ImportFormatError, match="repeated columns: attributes.k7, email"):
        _check_header([*header, "Email", "attributes.k7"])


@pytest.mark.parametrize("quoted", [False, True], ids=["bare", "quoted"])
@pytest.mark.parametrize("separator", [";", "\t"], ids=["semicolons", "tabs"])
def test_a_file_separated_by_semicolons_or_tabs_is_read_with_them(make_group, separator, quoted):
    # Excel in France or Germany writes `;` in its "CSV" files, "CSV UTF-8" included: such a
    # file was refused, and the advice to save it comma-separated could not be followed there.
    # Tools that quote every cell ("email";"country") had theirs refused as a bad header.
    make_group(1, slug="emea")
    names = ["External_ID", "Email", "first_name", "group"]
    header = "\n" + separator.join(f'"{n}"' if quoted else n for n in names) + "\n"  # a blank line first
    rows = [
        separator.join(["1", "a@customer.example", '"Dupont; Fils"', "emea"]),
        separator.join(["2", "not-an-email", "Jane", "emea"]),
        separator.join(["3", "c@customer.example", "Jane, Jr", "emea"]),
    ]
    report = run(csv_of(*rows, header=header))
    assert (report.rows, report.imported, report.invalid) == (3, 2, 1)
    assert [e.line for e in report.errors] == [4]  # the file's own line numbers
    names = dict(Lead.objects.values_list("external_id", "first_name"))
    assert names == {"1": "Dupont; Fils", "3": "Jane, Jr"}


def test_blank_lines_above_the_header_and_unnamed_trailing_columns_are_read_as_spreadsheets_write_them(make_group):
    make_group(1, slug="emea")
    text = io.StringIO(
        "\n \n"
        "external_id,email,group,\n"  # a trailing delimiter: a column without a name
        "b-1,one@customer.example,emea,\n"
        "b-2,two@customer.example,emea,stray\n"
    )
    report = run(text)
    assert (report.rows, report.imported, report.invalid) == (2, 1, 1)
    assert [(e.line, e.errors) for e in report.errors] == [
        (5, {"row": ["A value in column 4, which has no name in the header."]})
    ]
    assert list(Lead.objects.values_list("external_id", flat=True)) == ["b-1"]


def test_blank_cells_past_the_header_are_ignored_and_a_value_there_is_a_bad_row(make_group):
    """Trailing delimiters on a row (a spreadsheet or a script padding its rows) carry nothing:
    the row is read as if they were not there. A value past the header's columns is a bad row,
    as is one in a column without a name."""
    make_group(1, slug="emea")
    text = io.StringIO(
        "external_id,email,group\n"
        "p-1,one@customer.example,emea,,\n"
        "p-2,two@customer.example,emea, ,\n"
        "p-3,three@customer.example,emea,,Acme\n"
    )
    report = run(text)
    assert (report.rows, report.imported, report.invalid) == (3, 2, 1)
    assert [(e.line, e.errors) for e in report.errors] == [(4, {"row": ["5 cells for 3 columns."]})]
    assert sorted(Lead.objects.values_list("external_id", flat=True)) == ["p-1", "p-2"]


def test_a_row_cut_short_is_a_bad_row(make_group):
    """Fewer cells than the header's columns: a truncated file or a line broken in two. It
    was imported with its missing cells empty, routed on facts it had lost."""
    make_group(1, slug="emea")
    text = io.StringIO(
        "external_id,email,group,country\n"
        "s-1,one@customer.example,emea,FR\n"
        "s-2,two@customer.example\n"
        "s-3,three@customer.example,emea,\n"
    )
    report = run(text)
    assert (report.rows, report.imported, report.invalid) == (3, 2, 1)
    assert [(e.line, e.errors) for e in report.errors] == [
        (3, {"row": ["2 cells for 4 columns: the row is cut short."]})
    ]
    assert sorted(Lead.objects.values_list("external_id", flat=True)) == ["s-1", "s-3"]


def test_the_validation_memo_keeps_short_values_only():
    # Repeated values (countries, sources) are validated once; a long cell is not kept, or a
    # file of distinct 100 KB cells made memory grow with the file (240 MB for 150 MB).
    from leads.bulk import _RowValidator

    validator = _RowValidator({})
    for i in range(3):
        with pytest.raises(serializers.ValidationError):
            validator({"email": "one@customer.example", "region": f"{i}" + "r" * 100_000})
        validator({"email": "one@customer.example", "region": "Bretagne", "source": "web"})
    assert list(validator.memo["region"]) == ["Bretagne"]
    assert list(validator.memo["source"]) == ["web"]


def test_values_in_many_unnamed_columns_are_one_message_for_the_row(make_group):
    make_group(1, slug="emea")
    width = 3000
    text = io.StringIO("email,group" + "," * width + "\n" + "one@customer.example,emea" + ",x" * width + "\n")
    report = run(text)
    assert report.invalid == 1
    assert report.errors[0].errors == {
        "row": [f"Values in columns 3, 4, 5, 6, 7 and {width - 5} more, which have no name in the header."]
    }


def test_rotation_across_batches_is_exact_and_explained_like_intake(make_group, post_lead):
    group, reps = make_group(3, slug="emea")
    report = run(csv_of(*good_rows(7)), batch_size=2)
    assert (report.imported, report.assigned, report.batches) == (7, 7, 4)
    leads = list(Lead.objects.order_by("id"))
    ids = [r.id for r in reps]
    assert [lead.owner_id for lead in leads] == ids + ids + ids[:1]
    assert all(lead.status == "assigned" and lead.group_id == group.id for lead in leads)
    assert Assignment.objects.filter(reason="rotation", attempt=1).count() == 7
    state = RotationState.objects.get(group=group)
    assert (state.pointer, state.turns) == (1, 7)

    # Each lead: lead.received then lead.assigned, pointers chained across batches.
    pointers = []
    for lead in leads:
        events = list(AuditEvent.objects.filter(lead_id=lead.id).order_by("id"))
        assert [e.type for e in events] == ["lead.received", "lead.assigned"]
        assert events[1].rep_id == lead.owner_id and events[1].group == "emea"
        assert events[0].explanation["external_id"] == lead.external_id
        assert events[0].request_id == report.import_id and events[0].actor == "import:test"
        ex = events[1].explanation
        pointers.append((ex["pointer_before"], ex["pointer_after"]))
    assert pointers[0] == (0, 1)
    assert all(pointers[i][0] == pointers[i - 1][1] for i in range(1, 7))  # no gap between batches

    # The same explanation keys and values as a lead posted over the API.
    api_lead = post_lead(group="emea", country="FR").json()
    api_ex = AuditEvent.objects.get(lead_id=api_lead["id"], type="lead.assigned").explanation
    bulk_ex = AuditEvent.objects.get(lead_id=leads[0].id, type="lead.assigned").explanation
    assert set(api_ex) | {"import", "line"} == set(bulk_ex)
    assert (bulk_ex["import"], bulk_ex["line"]) == (report.import_id, 2)  # the first row, below the header
    assert {k: bulk_ex[k] for k in ("group", "strategy", "group_source", "rule", "reason", "attempt")} == {
        k: api_ex[k] for k in ("group", "strategy", "group_source", "rule", "reason", "attempt")
    }
    assert [c["rep"] for c in bulk_ex["candidates"]] == ids
    # The intake that followed took the next turn: one rotation, whoever advanced it.
    assert api_lead["owner"]["id"] == ids[1]


def test_a_rule_match_is_explained_by_its_conditions_as_intake_explains_it(make_group, post_lead, api):
    emea, _ = make_group(2, slug="emea")
    RoutingRule.objects.create(
        name="France", priority=1, conditions=[{"field": "country", "op": "in", "value": ["FR"]}], group=emea
    )
    run(csv_of("r-1,imported@customer.example,Jane,Acme,fr,40,,spring"))
    posted = post_lead(country="FR", score=40).json()
    imported = Lead.objects.get(external_id="r-1")
    bulk_ex = AuditEvent.objects.get(lead_id=imported.id, type="lead.assigned").explanation
    api_ex = AuditEvent.objects.get(lead_id=posted["id"], type="lead.assigned").explanation
    assert bulk_ex["rule"] == api_ex["rule"] == "France"
    assert (
        bulk_ex["matched_on"]
        == api_ex["matched_on"]
        == [{"field": "country", "op": "in", "value": ["FR"], "lead": "FR"}]
    )
    simulated = api.post("/api/v1/routing/simulate/", {"email": "s@customer.example", "country": "FR"}, format="json")
    assert simulated.status_code == 200 and simulated.json()["matched_on"] == api_ex["matched_on"]


def test_rerun_imports_nothing_new(make_group):
    make_group(2, slug="emea")
    first = run(csv_of(*good_rows(5)), batch_size=2, parallel=True)
    events = AuditEvent.objects.count()
    second = run(csv_of(*good_rows(5)), batch_size=2)
    assert (first.imported, second.imported, second.already_imported) == (5, 0, 5)
    assert Lead.objects.count() == 5 and AuditEvent.objects.count() == events


def test_an_external_id_posted_over_the_api_or_repeated_in_the_file_is_imported_once(make_group, post_lead):
    # Idempotency by external_id whoever took the lead in: a lead posted with the id is not
    # imported again, and a second row with an id the file already gave (other data or not)
    # is skipped, not a second lead.
    make_group(2, slug="emea")
    posted = post_lead(group="emea", external_id="crm-1").json()
    report = run(
        csv_of(
            "crm-1,someone@customer.example,Jane,Acme,FR,1,emea,",
            "crm-2,first@customer.example,Jane,Acme,FR,1,emea,",
            "crm-2,second@customer.example,John,Other,DE,2,emea,",
        ),
        batch_size=10,
    )
    assert (report.imported, report.already_imported, report.duplicates) == (1, 2, 0)
    assert list(Lead.objects.filter(external_id="crm-1").values_list("id", flat=True)) == [posted["id"]]
    assert list(Lead.objects.filter(external_id="crm-2").values_list("email", flat=True)) == ["first@customer.example"]
    # The repeat names the line it repeats; the id posted over the API repeats no line.
    assert report.repeated == 1
    assert [str(r) for r in report.repeats] == ["line 4: external_id 'crm-2' duplicates line 3"]
    # The row whose id was posted differs from the posted lead: named, with the fields.
    assert [(c.line, c.lead_id, c.fields) for c in report.changes] == [
        (2, posted["id"], ["email", "first_name", "company", "country", "score"])
    ]
    assert "2 already imported (1 repeating an earlier line of the file, 1 differing from" in report.summary()


@pytest.mark.parametrize("parallel", [False, True], ids=["thread", "process"])
def test_a_row_repeating_an_external_id_of_an_earlier_batch_names_that_line(make_group, parallel):
    """The earlier row may be in a batch committed before: its line is read back from its
    audit event (a lead's lead.received, or a duplicate's lead.duplicate), not kept in memory."""
    make_group(2, slug="emea")
    report = run(
        csv_of(
            "g-1,one@customer.example,Jane,Acme,FR,1,emea,",  # line 2
            "g-2,ONE@customer.example,Jane,Acme,FR,1,emea,",  # line 3: taken in as a duplicate of g-1
            "g-3,three@customer.example,Jane,Acme,FR,1,emea,",  # line 4
            "g-1,other@customer.example,John,Other,DE,2,emea,",  # line 5: g-1 again, a later batch
            "g-2,two@customer.example,John,Other,DE,2,emea,",  # line 6: g-2 again
            "g-3,three@customer.example,Jane,Acme,FR,1,emea,",  # line 7: g-3 again, the same batch
        ),
        batch_size=2,
        parallel=parallel,
    )
    assert (report.imported, report.duplicates, report.already_imported, report.repeated) == (2, 1, 3, 3)
    assert [str(r) for r in report.repeats] == [
        "line 5: external_id 'g-1' duplicates line 2",
        "line 6: external_id 'g-2' duplicates line 3",
        "line 7: external_id 'g-3' duplicates line 4",
    ]
    assert sorted(Lead.objects.values_list("external_id", flat=True)) == ["g-1", "g-3"]


def test_a_rerun_names_no_line_for_the_rows_an_earlier_run_took(make_group):
    """On a re-run every row is already imported by the earlier run: none repeats a line of
    this one (and the leads of the earlier run are not looked up in the audit trail)."""
    make_group(2, slug="emea")
    rows = ("h-1,one@customer.example,Jane,Acme,FR,1,emea,", "h-2,two@customer.example,Jane,Acme,FR,1,emea,")
    first = run(csv_of(*rows, rows[0]), batch_size=1)
    assert [str(r) for r in first.repeats] == ["line 4: external_id 'h-1' duplicates line 2"]
    second = run(csv_of(*rows, rows[0]), batch_size=1)
    assert (second.already_imported, second.repeated, second.repeats) == (3, 0, [])
    assert "3 already imported," in second.summary()


def test_a_rerun_names_the_rows_whose_values_differ_from_their_lead_and_changes_no_lead(make_group, post_lead):
    # A file corrected and uploaded again was once counted "already imported" in silence, as
    # if the corrections had gone in.
    make_group(2, slug="emea")
    header = "external_id,email,first_name,company,country,score,group,attributes.campaign,attributes.seats\n"
    rows = (
        "r-1,one@customer.example,Jane,Acme,FR,10,emea,spring,25",
        "r-2,two@customer.example,Jim,Acme,FR,10,emea,spring,",
        "r-3,three@customer.example,Ann,Acme,FR,10,emea,,",
    )
    run(csv_of(*rows, header=header))
    post_lead(external_id="api-1", email="api@customer.example", company="Initech")
    again = (
        "r-1,ONE@Customer.Example,Jane,Acme,fr,10,emea,spring,25",  # the same, written otherwise
        "r-2,two@customer.example,Jim,Acme Corp,FR,11,emea,autumn,",  # corrected
        "r-3,three@customer.example,,,,,emea,,",  # empty cells give nothing to compare
        "api-1,api@customer.example,,Initrode,,,emea,,",  # posted over the API
    )
    report = run(csv_of(*again, header=header))
    assert (report.already_imported, report.repeated, report.changed) == (4, 0, 2)
    leads = dict(Lead.objects.values_list("external_id", "id"))
    assert [str(c) for c in report.changes] == [
        f"line 3: external_id 'r-2' is lead {leads['r-2']}, taken in before, whose company, score, "
        "attributes.campaign differ from the row (the lead is left as it is)",
        f"line 5: external_id 'api-1' is lead {leads['api-1']}, taken in before, whose company differs from "
        "the row (the lead is left as it is)",
    ]
    assert "4 already imported (2 differing from the lead taken in before)" in report.summary()
    assert Lead.objects.get(external_id="r-2").company == "Acme"


def test_the_rows_named_as_repeats_are_bounded(make_group, monkeypatch):
    from leads import bulk

    monkeypatch.setattr(bulk, "MAX_ERRORS_KEPT", 3)
    make_group(2, slug="emea")
    report = run(csv_of("k-1,one@customer.example,Jane,Acme,FR,1,emea,", *["k-1,x@customer.example,,,,,emea,"] * 7))
    assert (report.already_imported, report.repeated, len(report.repeats)) == (7, 7, 3)
    assert [r.line for r in report.repeats] == [3, 4, 5]


def test_dedup_as_intake_in_the_database_and_in_the_file(make_group, post_lead):
    make_group(2, slug="emea")
    existing = post_lead(group="emea", email="Dup@Customer.example").json()
    report = run(
        csv_of(
            "d-1, dup@customer.example ,Jane,Acme,FR,1,emea,",
            "d-2,twice@customer.example,Jane,Acme,FR,1,emea,",
            "d-3,TWICE@customer.example,Jane,Acme,FR,1,emea,",
        ),
        batch_size=10,
    )
    assert (report.imported, report.duplicates) == (1, 2)
    first = Lead.objects.get(external_id="d-2")
    dups = list(AuditEvent.objects.filter(type="lead.duplicate").order_by("id"))
    assert [(e.lead_id, e.explanation["duplicate_of"]) for e in dups] == [
        (existing["id"], existing["id"]),
        (first.id, first.id),
    ]
    assert dups[0].explanation["external_id"] == "d-1" and dups[1].explanation["line"] == 4
    assert all(e.explanation["dedup_group"] == "emea" and e.explanation["rule"] is None for e in dups)
    assert not Lead.objects.filter(external_id__in=["d-1", "d-3"]).exists()


def test_a_group_with_no_dedup_window_takes_the_same_email_twice_in_one_file_as_intake_does(make_group, post_lead):
    # dedup_days 0: no window, so intake takes every lead of an address; an import of the same
    # address twice in one batch called the second a duplicate (and not so in two batches).
    make_group(2, slug="emea", dedup_days=0)
    assert [post_lead(group="emea", email="twice@customer.example").status_code for _ in range(2)] == [201, 201]
    rows = ("n-1,again@customer.example,Jane,Acme,FR,1,emea,", "n-2,AGAIN@customer.example,Jane,Acme,FR,1,emea,")
    report = run(csv_of(*rows), batch_size=10)
    assert (report.imported, report.duplicates) == (2, 0)
    assert Lead.objects.filter(email_normalized="again@customer.example", status="assigned").count() == 2


def test_a_rerun_skips_the_rows_taken_in_as_duplicates(make_group):
    # A duplicate row leaves no lead with its external_id, only its lead.duplicate event: a
    # re-run (an upload cut short, uploaded again) once audited it as a duplicate again and,
    # once the lead it duplicated was closed, imported it as a new lead with a rotation turn.
    from leads import actions

    make_group(2, slug="emea")
    rows = ("e-1,same@customer.example,Jane,Acme,FR,1,emea,", "e-2,SAME@customer.example,Jane,Acme,FR,1,emea,")
    first = run(csv_of(*rows))
    assert (first.imported, first.duplicates) == (1, 1)
    events = AuditEvent.objects.count()
    second = run(csv_of(*rows))
    assert (second.imported, second.duplicates, second.already_imported) == (0, 0, 2)
    assert AuditEvent.objects.count() == events
    actions.lead_close(lead_id=Lead.objects.get(external_id="e-1").id, outcome="lost", actor="test")
    third = run(csv_of(*rows))
    assert (third.imported, third.already_imported) == (0, 2)
    assert not Lead.objects.filter(external_id="e-2").exists()


def test_an_external_id_taken_in_as_a_duplicate_is_not_imported_again_in_a_later_batch(make_group):
    make_group(2, slug="emea")
    rows = (
        "f-1,same@customer.example,Jane,Acme,FR,1,emea,",
        "f-2,SAME@customer.example,Jane,Acme,FR,1,emea,",  # a duplicate of f-1
        "f-2,other@customer.example,Jane,Acme,FR,1,emea,",  # f-2 again, in the next batch
    )
    report = run(csv_of(*rows), batch_size=1)
    assert (report.imported, report.duplicates, report.already_imported) == (1, 1, 1)
    assert not Lead.objects.filter(external_id="f-2").exists()


def test_caps_and_eligibility_move_on_within_a_batch(make_group):
    group, reps = make_group(3, slug="emea")
    Membership.objects.filter(group=group, rep=reps[0]).update(max_per_day=1)
    Membership.objects.filter(group=group, rep=reps[2]).update(active=False)
    run(csv_of(*good_rows(6)), batch_size=100)
    owners = list(Lead.objects.order_by("id").values_list("owner_id", flat=True))
    assert owners == [reps[0].id] + [reps[1].id] * 5
    ex = AuditEvent.objects.filter(type="lead.assigned").order_by("id").last().explanation
    reasons = {c["rep"]: c["reason"] for c in ex["candidates"]}
    assert reasons[reps[1].id] == "chosen"
    assert reasons[reps[0].id] != "chosen" and reasons[reps[2].id] != "chosen"


def test_weighted_groups_keep_their_smooth_order_across_batches(db):
    group = GroupFactory(slug="w", strategy="weighted")
    a, b = RepFactory(), RepFactory()
    services.membership_add(group=group, rep=a, actor="t", weight=2)
    services.membership_add(group=group, rep=b, actor="t", weight=1)
    run(csv_of(*good_rows(6, group="w")), batch_size=4)
    owners = list(Lead.objects.order_by("id").values_list("owner_id", flat=True))
    assert owners == [a.id, b.id, a.id] * 2


def test_no_group_queues_with_the_reason_and_notifies_only_assignments(make_group):
    make_group(1, slug="emea")
    report = run(
        csv_of(
            "q-1,q1@customer.example,Jane,Acme,FR,1,,",
            "q-2,q2@customer.example,Jane,Acme,FR,1,emea,",
        )
    )
    assert (report.assigned, report.queued) == (1, 1)
    queued = Lead.objects.get(external_id="q-1")
    assert queued.status == "queued" and queued.queue_reason == "no rule matched and there is no default group"
    assert AuditEvent.objects.get(lead_id=queued.id, type="lead.queued").explanation["queue_reason"]
    [message] = OutboxMessage.objects.all()
    assigned = Lead.objects.get(external_id="q-2")
    assert (message.lead_id, message.rep_id, message.event) == (assigned.id, assigned.owner_id, "lead.assigned")
    assert message.payload["lead"]["group"] == "emea" and message.payload["lead"]["status"] == "assigned"
    assert message.payload["lead"]["queue_reason"] is None  # intake's payload


def test_no_notify_writes_no_outbox(make_group):
    make_group(1, slug="emea")
    run(csv_of(*good_rows(3)), notify_reps=False)
    assert Lead.objects.count() == 3 and not OutboxMessage.objects.exists()


def test_the_command_reports_and_counts(make_group, tmp_path: Path, capsys):
    make_group(2, slug="emea")
    path = tmp_path / "leads.csv"
    path.write_text(HEADER + "\n".join([*good_rows(3), "bad,nope,,,,,emea,"]) + "\n")
    assert scan(str(path)).rows == 4
    out, err = io.StringIO(), io.StringIO()
    call_command("import_leads", str(path), "--no-progress", stdout=out, stderr=err)
    assert "4 rows: 3 imported (3 assigned, 0 queued)" in out.getvalue()
    assert "1 invalid" in out.getvalue()
    assert "line 5: email:" in err.getvalue()
    with pytest.raises(CommandError, match="No such file"):
        call_command("import_leads", str(tmp_path / "missing.csv"))
    path.write_text("colour\nred\n")
    with pytest.raises(CommandError, match="unknown columns"):
        call_command("import_leads", str(path), "--no-progress")


def test_the_command_names_the_line_a_repeated_external_id_duplicates(make_group, tmp_path: Path):
    make_group(2, slug="emea")
    rows = good_rows(3)
    path = tmp_path / "leads.csv"
    path.write_text(HEADER + "\n".join([*rows, rows[0], rows[2]]) + "\n")
    out, err = io.StringIO(), io.StringIO()
    call_command("import_leads", str(path), "--no-progress", "--batch-size", "2", stdout=out, stderr=err)
    assert "2 already imported (2 repeating an earlier line of the file)" in out.getvalue()
    assert err.getvalue().splitlines() == [
        "line 5: external_id 'x-0' duplicates line 2",
        "line 6: external_id 'x-2' duplicates line 4",
    ]
    err = io.StringIO()
    path.write_text(HEADER + "\n".join([*good_rows(3, prefix="y"), *[good_rows(1, prefix="y")[0]] * 3]) + "\n")
    call_command("import_leads", str(path), "--no-progress", "--show-errors", "1", stdout=io.StringIO(), stderr=err)
    assert err.getvalue().splitlines() == [
        "line 5: external_id 'y-0' duplicates line 2",
        "... and 2 more rows repeating an earlier line",
    ]


@pytest.mark.parametrize("size", ["0", "2001"])
def test_the_command_refuses_a_batch_size_past_what_the_database_lock_table_takes(make_group, tmp_path: Path, size):
    # 20,000 a batch ran PostgreSQL's shared lock table out of memory, intake and the workers
    # failing with it.
    make_group(1, slug="emea")
    path = tmp_path / "leads.csv"
    path.write_text(HEADER + "\n".join(good_rows(2)) + "\n")
    with pytest.raises(CommandError, match="--batch-size must be from 1 to 2,000"):
        call_command("import_leads", str(path), "--no-progress", "--batch-size", size)
    assert not Lead.objects.exists()


def test_the_command_refuses_a_negative_show_errors(make_group, tmp_path: Path):
    # A negative count printed "... and 1 more bad rows" for a file without a bad row.
    make_group(1, slug="emea")
    path = tmp_path / "leads.csv"
    path.write_text(HEADER + "\n".join(good_rows(2)) + "\n")
    with pytest.raises(CommandError, match="--show-errors must be 0 or more"):
        call_command("import_leads", str(path), "--no-progress", "--show-errors", "-1")
    assert not Lead.objects.exists()
    err = io.StringIO()
    call_command("import_leads", str(path), "--no-progress", "--show-errors", "0", stdout=io.StringIO(), stderr=err)
    assert Lead.objects.count() == 2 and "more bad rows" not in err.getvalue()


def test_the_command_refuses_a_directory_or_an_unreadable_file_saying_so(make_group, tmp_path: Path):
    make_group(1, slug="emea")
    with pytest.raises(CommandError, match="Not a file"):
        call_command("import_leads", str(tmp_path), "--no-progress")
    # A file whose reads fail (EIO): named, no traceback, nothing written.
    with pytest.raises(CommandError, match="Cannot read /proc/self/mem: Input/output error"):
        call_command("import_leads", "/proc/self/mem", "--no-progress")
    assert not Lead.objects.exists()


def test_the_command_counts_the_bad_rows_it_does_not_print(make_group, tmp_path: Path):
    from leads.bulk import MAX_ERRORS_KEPT

    make_group(1, slug="emea")
    path = tmp_path / "leads.csv"
    path.write_text("email,group\n" + "".join(f"bad{i},emea\n" for i in range(MAX_ERRORS_KEPT + 5)))
    err = io.StringIO()
    # More asked for than are kept: the ones past the kept are still said to exist.
    call_command("import_leads", str(path), "--no-progress", "--show-errors", "5000", stdout=io.StringIO(), stderr=err)
    lines = err.getvalue().splitlines()
    assert len(lines) == MAX_ERRORS_KEPT + 1 and lines[-1] == "... and 5 more bad rows"
    err = io.StringIO()
    call_command("import_leads", str(path), "--no-progress", "--show-errors", "0", stdout=io.StringIO(), stderr=err)
    assert err.getvalue().splitlines() == [f"... and {MAX_ERRORS_KEPT + 5} more bad rows"]
    with pytest.raises(CommandError, match="--show-errors must be 0 or more"):
        call_command("import_leads", str(path), "--no-progress", "--show-errors", "-1")


def test_the_progress_bar_ends_full_when_a_cell_spans_lines(make_group, tmp_path: Path):
    make_group(1, slug="emea")
    path = tmp_path / "leads.csv"
    path.write_text(HEADER + '1,a@b.example,Jane,"Acme\nEurope",fr,5,emea,\n\n2,c@d.example,,,,,emea,\n')
    out, err = io.StringIO(), io.StringIO()
    call_command("import_leads", str(path), "--no-parallel", stdout=out, stderr=err)
    assert "2 rows: 2 imported" in out.getvalue()
    assert err.getvalue().rstrip().split("\r")[-1].startswith("100%"), err.getvalue()


def test_the_command_interrupted_says_what_is_imported_and_exits_130(make_group, tmp_path: Path, monkeypatch):
    # Ctrl-C mid-file: the batches committed stay; the operator is told how far it got and
    # that a re-run imports the rest, with the status a shell gives an interrupted command.
    from leads.management.commands import import_leads

    make_group(1, slug="emea")
    path = tmp_path / "leads.csv"
    path.write_text(HEADER + "".join(row + "\n" for row in good_rows(5)))

    def interrupted(binary, encoding):
        yield HEADER
        for row in good_rows(5):
            yield row + "\n"
        raise KeyboardInterrupt

    monkeypatch.setattr(import_leads, "csv_text", interrupted)
    with pytest.raises(CommandError, match="first 4 rows are imported") as caught:
        call_command("import_leads", str(path), "--no-progress", "--no-parallel", "--batch-size", "2")
    assert caught.value.returncode == 130
    assert Lead.objects.count() == 4
    # What running the file again does for rows without an external_id: said, not only the skip.
    assert "Rows without an external_id are taken in again" in str(caught.value)
    # The import id its events carry is named, so that its lines and events can be found.
    import_id = re.search(r"import id (import-[0-9a-f]{12})", str(caught.value)).group(1)
    assert AuditEvent.objects.filter(type="lead.received", explanation__import=import_id).count() == 4
    monkeypatch.undo()

    def counting_interrupted(name):
        raise KeyboardInterrupt  # while the file is read through for the progress bar

    monkeypatch.setattr(import_leads, "scan", counting_interrupted)
    with pytest.raises(CommandError, match="Interrupted before anything was imported") as caught:
        call_command("import_leads", str(path), "--no-progress")
    assert caught.value.returncode == 130 and Lead.objects.count() == 4
    monkeypatch.undo()
    out = io.StringIO()
    call_command("import_leads", str(path), "--no-progress", stdout=out)
    assert "1 imported" in out.getvalue() and "4 already imported" in out.getvalue()
    assert Lead.objects.count() == 5


@pytest.mark.parametrize("parallel", [False, True], ids=["thread", "process"])
def test_a_read_error_stops_the_import_after_the_batches_before_it(make_group, parallel):
    make_group(1, slug="emea")

    def lines():
        yield HEADER
        for row in good_rows(5):
            yield row + "\n"
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    with pytest.raises(UnicodeDecodeError):
        run(lines(), batch_size=2, parallel=parallel)
    assert Lead.objects.count() == 4  # two whole batches, committed; a re-run skips them


def test_progress_counts_every_row(make_group):
    make_group(1, slug="emea")
    seen = []
    report = run(csv_of(*good_rows(7), "bad,nope,,,,,emea,"), batch_size=3, progress=seen.append)
    assert sum(seen) == report.rows == 8


def test_account_owners_take_their_leads_without_moving_the_rotation(make_group):
    from rotation.models import Account

    group, reps = make_group(3, slug="emea")
    Account.objects.create(domain="bigco.example", owner=reps[2])
    # An account whose owner is inactive everywhere routes through the rotation.
    Account.objects.create(domain="gone.example", owner=RepFactory(active=False))
    run(
        csv_of(
            "o-1,a@customer.example,Jane,Acme,FR,1,emea,",
            "o-2,b@BigCo.example,Jane,BigCo,FR,1,emea,",
            "o-3,c@customer.example,Jane,Acme,FR,1,emea,",
            "o-4,d@gone.example,Jane,Gone,FR,1,emea,",
        )
    )
    owners = [Lead.objects.get(external_id=f"o-{i}").owner_id for i in (1, 2, 3, 4)]
    assert owners == [reps[0].id, reps[2].id, reps[1].id, reps[2].id]  # the owner match skipped no turn
    assert Assignment.objects.get(lead__external_id="o-2").reason == "owner_match"
    ex = AuditEvent.objects.get(lead_id=Lead.objects.get(external_id="o-2").id, type="lead.assigned").explanation
    assert ex["reason"] == "owner_match" and ex["pointer_before"] == ex["pointer_after"] == 1
    assert RotationState.objects.get(group=group).turns == 3
    # As intake: an inactive rep's account is no owner match to skip; nothing is said of it.
    ex = AuditEvent.objects.get(lead_id=Lead.objects.get(external_id="o-4").id, type="lead.assigned").explanation
    assert "owner_match" not in ex


def rotation_row_held(group) -> AbstractContextManager[threading.Event]:
    """Holds `group`'s rotation row lock from another connection, as a long routing
    transaction would, for the block or until the event it yields is set."""
    return row_held(lambda: RotationState.objects.select_for_update().get(group=group))


@contextmanager
def row_held(lock: Callable[[], object]) -> Iterator[threading.Event]:
    """Runs `lock` (a SELECT ... FOR UPDATE) in a transaction of another connection and holds
    what it locked for the block, or until the event it yields is set."""
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        try:
            with transaction.atomic():
                lock()
                held.set()
                release.wait(30)
        finally:
            connection.close()

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(5)
        yield release
    finally:
        release.set()
        holder.join()


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_batch_retries_after_a_lock_timeout_on_a_held_rotation_row(make_group, settings, caplog):
    settings.ROUTING_LOCK_TIMEOUT_MS = 300
    group, _ = make_group(2, slug="emea")
    with rotation_row_held(group) as release:
        threading.Timer(0.5, release.set).start()  # longer than one lock timeout, shorter than the retries
        report = run(csv_of(*good_rows(3)))
    assert (report.imported, report.assigned, report.batches) == (3, 3, 1)
    assert Lead.objects.count() == 3 and Assignment.objects.count() == 3
    assert RotationState.objects.get(group=group).turns == 3
    assert "import batch retried after 55P03" in caplog.text  # lock_not_available, then success


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_command_stopped_by_a_held_rotation_row_says_what_is_imported(make_group, settings, tmp_path: Path):
    # Past its retries, a batch's error ends the command with what the batches before it did,
    # as the admin upload says it, not a traceback; the same file run again imports the rest.
    settings.ROUTING_LOCK_TIMEOUT_MS = 100
    settings.ROUTING_MAX_RETRIES = 0
    make_group(1, slug="emea")
    other, _ = make_group(1, slug="apac")
    path = tmp_path / "leads.csv"
    path.write_text(HEADER + "".join(row + "\n" for row in [*good_rows(2), *good_rows(2, group="apac", prefix="y")]))
    with (
        rotation_row_held(other),
        pytest.raises(CommandError, match=r"stopped \(OperationalError: .*lock timeout.*first 2 rows are imported"),
    ):
        call_command("import_leads", str(path), "--no-progress", "--no-parallel", "--batch-size", "2")
    assert Lead.objects.count() == 2
    out = io.StringIO()
    call_command("import_leads", str(path), "--no-progress", "--no-parallel", "--batch-size", "2", stdout=out)
    assert "2 imported" in out.getvalue() and "2 already imported" in out.getvalue()


def bytes_run(data: bytes, **kwargs):
    return leads_import(lines=csv_text(io.BytesIO(data)), actor="import:test", **kwargs)


@pytest.mark.parametrize("ending", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
def test_any_line_ending_and_a_bom_read_alike(make_group, ending):
    make_group(1, slug="emea")
    rows = [HEADER.strip().encode(), *(r.encode() for r in good_rows(3)), b"bad,nope,,,,,emea,"]
    report = bytes_run(b"\xef\xbb\xbf" + ending.join(rows) + ending)
    assert (report.rows, report.imported, report.invalid) == (4, 3, 1)
    assert [e.line for e in report.errors] == [5]


def test_bytes_that_are_not_utf8_refuse_their_row_only_naming_its_line(make_group):
    make_group(1, slug="emea")
    latin1 = "y-1,rene@customer.example,René,Müller SA,FR,10,emea,\n".encode("latin-1")
    first, last = (good_rows(1, prefix=p)[0].encode() for p in "xz")
    report = bytes_run(HEADER.encode() + first + b"\n" + latin1 + last)
    assert (report.rows, report.imported, report.invalid) == (3, 2, 1)
    assert report.errors[0].line == 3 and "Not UTF-8" in str(report.errors[0])
    assert not Lead.objects.filter(external_id="y-1").exists()


@pytest.mark.parametrize(
    "data",
    [
        "email,group,attributes.R\xe9gion\nrene@customer.example,emea,Nord\n".encode("latin-1"),
        "external_id,email,group\nu-1,u1@customer.example,emea\n".encode("utf-16"),
    ],
    ids=["latin1-attribute-column", "utf16"],
)
def test_a_header_that_is_not_utf8_refuses_the_file_saying_so(make_group, data):
    # An attributes.<key> column accepts any key: undecoded bytes in it once reached the
    # database and failed the whole import with a 500 (admin) or a traceback (command).
    make_group(1, slug="emea")
    with pytest.raises(ImportFormatError, match="not UTF-8"):
        bytes_run(data)
    assert not Lead.objects.exists()


CP1252_ROWS = "external_id,email,first_name,company,group\nw-1,ann@customer.example,Ann,Acme,emea\n" + "".join(
    f"w-{i},w{i}@customer.example,{name},Société Générale,emea\n"
    for i, name in ((2, "René"), (3, "Zoë"), (4, "Jürgen"))
)


def test_a_file_in_windows_1252_is_refused_whole_naming_its_encoding_then_imported_in_it(make_group, tmp_path: Path):
    # Excel's "CSV (Comma delimited)": read as UTF-8, its plain-ASCII rows once went in and every
    # row with an accent was refused, leaving the file half imported.
    make_group(1, slug="emea")
    path = tmp_path / "excel.csv"
    path.write_bytes(CP1252_ROWS.replace("\n", "\r\n").encode("cp1252"))
    with pytest.raises(CommandError) as refused:
        call_command("import_leads", str(path), "--no-progress")
    message = str(refused.value)
    assert "line 3 (and 2 other lines) holds bytes that are not UTF-8" in message
    # Which 8-bit encoding it is, its bytes do not say: its first such cell as each reads it.
    assert '"René" as Windows-1252 (cp1252), "René" as Windows-1250 (cp1250), "Renй" as Windows-1251' in message
    assert "--encoding set to the one that reads right (cp1252, cp1250, cp1251, mac_roman" in message
    assert not Lead.objects.exists()
    out = io.StringIO()
    call_command("import_leads", str(path), "--no-progress", "--encoding", "Windows-1252", stdout=out)
    assert "4 rows: 4 imported" in out.getvalue()
    names = dict(Lead.objects.values_list("external_id", "first_name"))
    assert names == {"w-1": "Ann", "w-2": "René", "w-3": "Zoë", "w-4": "Jürgen"}
    assert set(Lead.objects.values_list("company", flat=True)) == {"Acme", "Société Générale"}


def test_a_utf8_file_named_in_another_encoding_is_refused_before_it_is_misread(make_group, tmp_path: Path):
    make_group(1, slug="emea")
    path = tmp_path / "utf8.csv"
    path.write_bytes(CP1252_ROWS.encode())
    with pytest.raises(CommandError, match='line 3 reads "René" as UTF-8 and "RenÃ©" as Windows-1252. Leave out'):
        call_command("import_leads", str(path), "--no-progress", "--encoding", "cp1252")
    path.write_bytes(b"\xef\xbb\xbfemail,group\nplain@customer.example,emea\n")  # ASCII after a BOM
    with pytest.raises(CommandError, match="byte order mark"):
        call_command("import_leads", str(path), "--no-progress", "--encoding", "cp1252")
    assert not Lead.objects.exists()


@pytest.mark.parametrize(
    ("encoding", "message"),
    [
        ("klingon", "Unknown encoding 'klingon'"),
        ("rot13", "'rot13' is not a text encoding"),
        ("utf-16", "'utf-16' does not write plain ASCII as ASCII"),
    ],
)
def test_an_encoding_the_csv_reader_cannot_use_is_refused_by_name(tmp_path: Path, encoding, message):
    path = tmp_path / "leads.csv"
    path.write_text("email\na@customer.example\n")
    with pytest.raises(CommandError, match=f"--encoding: {message}"):
        call_command("import_leads", str(path), "--no-progress", "--encoding", encoding)


def test_a_utf16_file_is_refused_whole_saying_what_it_is(tmp_path: Path):
    path = tmp_path / "unicode.csv"
    path.write_bytes("email\na@customer.example\n".encode("utf-16"))
    for extra in ([], ["--encoding", "cp1252"]):
        with pytest.raises(CommandError, match='UTF-16 text .* save it as "CSV UTF-8"'):
            call_command("import_leads", str(path), "--no-progress", *extra)


@pytest.mark.parametrize(
    ("head", "said"),
    [
        (b"PK\x03\x04\x14\x00\x06\x00", "a zip archive (an Excel .xlsx"),
        (b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1", "an Excel 97-2003 workbook (.xls)"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "a PNG image"),
        (b"%PDF-1.7\n", "a PDF document"),
        (b"email\n\x00\x01\x02", "binary data, not text"),
    ],
)
def test_a_file_that_is_no_text_is_refused_saying_what_it_is(tmp_path: Path, head, said):
    """A PNG chosen by mistake was refused as "not UTF-8 text" with encodings to choose from:
    the user went looking for an encoding that would never read it."""
    path = tmp_path / "leads.csv"
    path.write_bytes(head + bytes(range(256)) * 4)
    for extra in ([], ["--encoding", "cp1252"]):
        with pytest.raises(CommandError, match=f"The file is not CSV text: it is {re.escape(said)}") as raised:
            call_command("import_leads", str(path), "--no-progress", *extra)
        assert "--encoding" not in str(raised.value)
    assert not Lead.objects.exists()


def test_a_utf8_file_damaged_in_places_imports_the_rest_refusing_its_damaged_rows(make_group, tmp_path: Path):
    # Valid UTF-8 past ASCII elsewhere: a damaged UTF-8 file, not one in another encoding.
    make_group(1, slug="emea")
    path = tmp_path / "damaged.csv"
    path.write_bytes(
        b"external_id,email,first_name,group\nd-1,d1@customer.example,Zo\xc3\xab,emea\n"
        b"d-2,d2@customer.example,Ren\xe9,emea\nd-3,d3@customer.example,Ann,emea\n"
    )
    err = io.StringIO()
    call_command("import_leads", str(path), "--no-progress", stdout=io.StringIO(), stderr=err)
    assert "line 3: row: Not UTF-8 text" in err.getvalue()
    assert dict(Lead.objects.values_list("external_id", "first_name")) == {"d-1": "Zoë", "d-3": "Ann"}


def test_the_scan_names_lines_past_its_first_chunk_and_counts_the_lines_not_utf8(tmp_path: Path):
    rows = [f"f-{i},f{i}@customer.example,Zoë,{'Acme ' * 20},emea\r\n".encode() for i in range(10_000)]
    assert sum(map(len, rows)) > 1 << 20  # the scan reads 1 MiB at a time
    path = tmp_path / "big.csv"
    path.write_bytes(b"external_id,email,first_name,company,group\r\n" + b"".join(rows) + b"x,\xe9,\xe8\r\ny,\xff\r\n")
    found = scan(str(path))
    assert (found.rows, found.not_utf8_line, found.not_utf8_lines, found.utf8_line) == (10_002, 10_002, 2, 2)
    assert found.sample == b"\xe9"
    # A \r\n split between two chunks is one line end.
    head = b"email\r\n" + b"a@customer.example,Zo\xc3\xab" + b" " * ((1 << 20) - 31) + b"\r"
    assert len(head) == 1 << 20
    path.write_bytes(head + b"\nb@customer.example,\xe9\r\n")
    assert (scan(str(path)).rows, scan(str(path)).not_utf8_line) == (2, 3)


def test_bytes_the_chosen_encoding_cannot_read_refuse_their_row_naming_it(make_group, tmp_path: Path):
    make_group(1, slug="emea")
    path = tmp_path / "leads.csv"
    path.write_bytes(b"email,first_name,group\na@customer.example,Ren\xe9,emea\nb@customer.example,x\x81,emea\n")
    err = io.StringIO()
    call_command("import_leads", str(path), "--no-progress", "--encoding", "cp1252", stdout=io.StringIO(), stderr=err)
    assert "line 3: row: Not Windows-1252 text" in err.getvalue()
    assert list(Lead.objects.values_list("first_name", flat=True)) == ["René"]


def test_malformed_csv_is_a_bad_row_and_the_reader_goes_on(make_group):
    make_group(1, slug="emea")
    huge = "x" * 140_000
    report = run(
        csv_of(
            good_rows(1, prefix="a")[0],
            f"b-1,b1@customer.example,{huge},Acme,FR,10,emea,",  # past the csv module's field limit
            good_rows(1, prefix="c")[0],
            'd-1,d1@customer.example,"Jane"Doe,Acme,FR,10,emea,',  # text after a closing quote
            good_rows(1, prefix="e")[0],
            'f-1,f1@customer.example,"Jane,Acme,FR,10,emea,',  # never closed: ran on to the end
            good_rows(1, prefix="g")[0],
        )
    )
    by_line = {e.line: str(e) for e in report.errors}
    assert set(by_line) == {3, 5, 7}
    assert "longer than" in by_line[3] and "closing quote" in by_line[5]
    assert "not closed before the end of the file (lines 7-8). Line 8 is read again" in by_line[7]
    # The lines a quote never closed ran on over are not lost with its row.
    assert sorted(Lead.objects.values_list("external_id", flat=True)) == ["a-0", "c-0", "e-0", "g-0"]
    assert (report.rows, report.imported, report.invalid) == (7, 4, 3)


def test_a_quote_never_closed_refuses_its_row_alone_and_the_lines_after_it_keep_their_numbers(make_group):
    # Once, the quote took every line after it into one cell, up to the cell limit: thousands
    # of rows lost as one bad row.
    make_group(1, slug="emea")
    rows = good_rows(2000, prefix="n")
    rows[10] = 'n-10,n10@customer.example,"Jane,Acme,FR,10,emea,'  # line 12: runs on to line 22's quote
    rows[20] = 'n-20,n20@customer.example,Jane "JJ" Doe,Acme,FR,10,emea,'  # a quote inside a cell is text
    rows[30] = '"n-30,n30@customer.example,Jane,Acme,FR,10,emea,'  # line 32: runs on to line 1300's
    rows[1298] = 'n-1298,n1298@customer.example,"Jane, the ""J""",Acme,FR,10,emea,'
    report = run(csv_of(*rows), batch_size=300)
    assert (report.rows, report.imported, report.invalid) == (2000, 1998, 2)
    by_line = {e.line: str(e) for e in report.errors}
    assert sorted(by_line) == [12, 32], by_line
    assert "(lines 12-22). Lines 13-22 are read again as rows of their own." in by_line[12]
    assert "(lines 32-1300). Lines 33-1300 are read again as rows of their own." in by_line[32]
    imported = set(Lead.objects.values_list("external_id", flat=True))
    assert len(imported) == 1998 and not {"n-10", "n-30"} & imported
    assert Lead.objects.get(external_id="n-1298").first_name == 'Jane, the "J"'
    assert Lead.objects.get(external_id="n-20").first_name == 'Jane "JJ" Doe'


@pytest.mark.parametrize(
    ("cell", "message"),
    [('"' + "[" * 100_000 + '"', "nested too deeply"), ('"{""k"": ""\\ud800""}"', "surrogate")],
    ids=["deep", "surrogate"],
)
def test_an_attributes_cell_the_api_refuses_is_a_bad_row(make_group, cell, message):
    make_group(1, slug="emea")
    report = run(csv_of(f"h-1,h1@customer.example,Jane,Acme,FR,10,emea,{cell}", header=HEADER.replace(".campaign", "")))
    assert report.invalid == 1 and message in str(report.errors[0])


def test_a_bad_attributes_cell_does_not_hide_the_other_bad_fields_of_its_row(make_group):
    make_group(1, slug="emea")
    report = run(
        csv_of('a-2,nope,Jane,Acme,XX,101,emea,"[1]"', header=HEADER.replace("attributes.campaign", "attributes"))
    )
    assert report.invalid == 1
    assert set(report.errors[0].errors) == {"attributes", "email", "country", "score"}
    assert not Lead.objects.exists()


def test_attributes_keep_their_case_and_numbers_past_64_bits(make_group):
    make_group(1, slug="emea")
    big = 2**70
    header = "external_id,email,group,attributes.Campaign,attributes\n"
    report = run(csv_of(f'k-1,k1@customer.example,emea,spring,"{{""seats"": {big}}}"', header=header))
    assert report.imported == 1, report.errors
    assert Lead.objects.get(external_id="k-1").attributes == {"Campaign": "spring", "seats": big}


@pytest.mark.parametrize(
    ("condition", "posted", "cell"),
    [
        ({"field": "attributes.seats", "op": "equals", "value": 25}, 25, "25"),
        ({"field": "attributes.seats", "op": "in", "value": [25, 50]}, 25, "25"),
        ({"field": "attributes.vip", "op": "equals", "value": True}, True, "true"),
    ],
    ids=["number-equals", "number-in", "boolean"],
)
def test_a_rule_on_a_typed_attribute_routes_an_imported_lead_as_a_posted_one(api, make_group, condition, posted, cell):
    # An attributes.<key> cell is text: a rule with a number or a boolean once matched the
    # posted lead and missed the imported one, which went to the default group or the queue.
    group, _reps = make_group(1, slug="vip")
    services.rule_save(rule=RoutingRule(name="vip", priority=1, conditions=[condition], group=group), actor="test")
    key = condition["field"].removeprefix("attributes.")
    body = {"email": "p@customer.example", "attributes": {key: posted}}
    assert api.post("/api/v1/leads/", body, format="json").json()["group"] == "vip"
    report = run(io.StringIO(f"email,attributes.{key}\ni@customer.example,{cell}\n"))
    assert report.imported == 1, report.errors
    assert Lead.objects.get(email="i@customer.example").group == group


def test_count_rows_counts_lines_of_any_ending(tmp_path: Path):
    path = tmp_path / "cr.csv"
    path.write_bytes(b"email\ra@x.example\rb@x.example\r")
    assert scan(str(path)).rows == 2


def test_an_imports_log_lines_carry_its_import_id_as_its_events_do(make_group, caplog):
    """Run from the command line (no request), an import's lines carried no id at all: nothing
    tied a warning of the import (a batch retried, the broker down) to the leads it wrote."""
    make_group(2, slug="emea")
    caplog.handler.addFilter(RequestIdFilter())

    def progress(rows: int) -> None:
        logging.getLogger("leads.management").warning("batch of %s rows committed", rows)

    report = run(csv_of(*good_rows(3)), batch_size=2, progress=progress)
    lines = [r for r in caplog.records if r.getMessage().startswith("batch of")]
    assert len(lines) == 2 and {r.request_id for r in lines} == {report.import_id}
    events = AuditEvent.objects.filter(type__startswith="lead.")
    assert events.count() == 6 and set(events.values_list("request_id", flat=True)) == {report.import_id}
    assert request_id_var.get() == "-"  # put back once the import ends


def test_the_report_counts_one_row_and_one_duplicate_in_the_singular():
    """The import page read "7 rows: ..., 1 duplicates, ...": counted as written."""
    from leads.bulk import ImportReport

    one = ImportReport(import_id="import-x", rows=1, duplicates=1).summary()
    assert one.startswith("1 row: ") and "1 duplicate," in one
    many = ImportReport(import_id="import-x", rows=7, duplicates=2).summary()
    assert many.startswith("7 rows: ") and "2 duplicates," in many


@pytest.mark.parametrize(
    ("encoding", "names"),
    [
        ("cp1251", ["ООО «ВЕКТОР»", "КИЇВ", "Иван"]),  # some of its lines pair up as UTF-8 by chance
        ("cp1252", ["CAFÉ™", "«\u00a0CHEZ ANDRÉ\u00a0»", "René"]),
    ],
)
def test_an_8_bit_file_whose_lines_read_as_utf8_by_chance_is_still_refused_whole(
    make_group, tmp_path: Path, encoding, names
):
    make_group(1, slug="emea")
    rows = "".join(f"{i},n{i}@customer.example,{name},emea\r\n" for i, name in enumerate(names))
    path = tmp_path / "legacy.csv"
    path.write_bytes(f"external_id,email,company,group\r\n{rows}".encode(encoding))
    with pytest.raises(CommandError, match="not UTF-8 text"):
        call_command("import_leads", str(path), "--no-progress")
    assert not Lead.objects.exists()
    call_command("import_leads", str(path), "--no-progress", "--encoding", encoding, stdout=io.StringIO())
    assert sorted(Lead.objects.values_list("company", flat=True)) == sorted(names)


def test_a_utf8_file_with_its_byte_order_mark_and_a_damaged_row_imports_the_rest(make_group, tmp_path: Path):
    # Each encoding's refusal pointed at the other: UTF-8 refused it as Windows-1252, and
    # Windows-1252 as UTF-8 (its byte order mark).
    make_group(1, slug="emea")
    path = tmp_path / "bom.csv"
    path.write_bytes(
        b"\xef\xbb\xbfemail,first_name,group\na@customer.example,Ann,emea\nb@customer.example,Ren\xe9,emea\n"
    )
    err = io.StringIO()
    call_command("import_leads", str(path), "--no-progress", stdout=io.StringIO(), stderr=err)
    assert "line 3: row: Not UTF-8 text" in err.getvalue()
    assert list(Lead.objects.values_list("first_name", flat=True)) == ["Ann"]


def test_encoding_names_read_as_people_write_them(make_group, tmp_path: Path):
    from leads.bulk import encoding_codec, encoding_label

    assert encoding_codec("utf-8-sig") == "utf-8" and encoding_label("mac_roman") == "Mac Roman"
    make_group(1, slug="emea")
    path = tmp_path / "mac.csv"
    path.write_bytes(b"email,first_name,group\na@customer.example,x\xff,emea\n")  # 0xFF is a caron in Mac Roman
    call_command("import_leads", str(path), "--no-progress", "--encoding", "mac_roman", stdout=io.StringIO())
    assert Lead.objects.get().first_name == "xˇ"


def test_a_stray_quote_closed_by_a_later_one_refuses_its_row_alone(make_group):
    # The cell ran on to the next quote without a CSV error: the rows between went in as one
    # row refused for its cell count, lost and uncounted.
    make_group(1, slug="emea")
    rows = good_rows(10, prefix="n")
    rows[2] = 'n-2,n2@customer.example,"Jane,Acme,FR,10,emea,spring'
    rows[7] = 'n-7,n7@customer.example,Jane,TV 5",FR,10,emea,spring'
    report = run(csv_of(*rows))
    assert (report.rows, report.imported, report.invalid) == (10, 9, 1), report.errors
    [error] = report.errors
    assert error.line == 4 and "runs on over lines 4-9" in str(error)
    assert "Lines 5-9 are read again as rows of their own" in str(error)
    imported = set(Lead.objects.values_list("external_id", flat=True))
    assert imported == {f"n-{i}" for i in range(10)} - {"n-2"}
    assert Lead.objects.get(external_id="n-7").company == 'TV 5"'  # a quote inside a cell is text


def test_an_attribute_posted_as_a_number_or_a_boolean_is_the_same_as_its_text_in_a_cell(make_group, post_lead):
    make_group(1, slug="emea")
    post_lead(external_id="api-1", group="emea", attributes={"seats": 25, "vip": True, "plan": "Gold"})
    header = "external_id,email,group,attributes.seats,attributes.vip,attributes.plan\n"
    same = run(csv_of("api-1,x@customer.example,emea,25,true,Gold", header=header))
    assert [c.fields for c in same.changes] == [["email"]]
    lead = Lead.objects.get(external_id="api-1")
    changed = run(csv_of(f"api-1,{lead.email},emea,26,false,gold", header=header))
    assert [c.fields for c in changed.changes] == [["attributes.seats", "attributes.vip", "attributes.plan"]]


def test_an_interrupt_between_a_batchs_commit_and_its_count_waits_for_the_count(
    make_group, tmp_path: Path, monkeypatch
):
    # A TERM or Ctrl-C landing right after a batch committed, before it was counted, made the
    # message say one batch fewer than was in.
    from leads import bulk
    from leads.management.commands import import_leads

    make_group(1, slug="emea")
    path = tmp_path / "leads.csv"
    path.write_text(HEADER + "\n".join(good_rows(6)) + "\n")
    original, batches = bulk._route_batch, []

    def committed_then_terminated(*args, **kwargs):
        original(*args, **kwargs)
        batches.append(1)
        if len(batches) == 2:
            bulk.interrupt(import_leads.Terminated())  # as the command's TERM handler does

    monkeypatch.setattr(bulk, "_route_batch", committed_then_terminated)
    with pytest.raises(CommandError, match="the first 4 rows are imported") as caught:
        call_command("import_leads", str(path), "--no-progress", "--no-parallel", "--batch-size", "2")
    assert caught.value.returncode == 143 and Lead.objects.count() == 4
    assert not bulk._InterruptsHeld.held and bulk._InterruptsHeld.pending is None


def test_an_attribute_given_twice_differently_is_a_bad_row(make_group):
    # The attributes column and an attributes.<key> column each gave 'k': the JSON's value was
    # dropped without a word.
    make_group(1, slug="emea")
    header = "external_id,email,group,attributes,attributes.k\n"
    report = run(
        csv_of(
            'd-1,d1@customer.example,emea,"{""k"": ""json""}",col',
            'd-2,d2@customer.example,emea,"{""k"": ""same"", ""j"": 1}",same',  # the same value: one
            header=header,
        )
    )
    assert (report.imported, report.invalid) == (1, 1)
    assert report.errors[0].line == 2
    assert "Given twice, differently: 'k'" in str(report.errors[0])
    assert Lead.objects.get().attributes == {"k": "same", "j": 1}
