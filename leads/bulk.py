"""Bulk import: a CSV file of leads, streamed, validated like the API, routed in batches.

The file is read row by row (the csv module over the open file; it is never loaded whole).
Every row is validated with the API's own rules (`LeadInSerializer`); a bad row is reported
with its line number and the rest are imported. A row whose `external_id` is already
imported is skipped, so a re-run imports nothing new; one whose `external_id` an earlier row
of the same file gave is reported with that row's line.

Valid rows are routed in batches (`batch_size`, 500 by default), one transaction per batch,
with the same locks in the same order as intake: the emails' advisory locks (dedup), then
each group's rotation row once per batch (by group id), and the same steps under them:
eligibility read after the lock (`routing.member_facts`), the pick (`routing.decide`, pure,
called once per lead while the in-memory counts, pointer and weights move on; account
owners first, as intake), then the leads, assignments, audit events and outbox rows written
with one COPY each (one INSERT each on the embedded SQLite default). Each lead
gets the same audit events as intake (`lead.received`, then `lead.assigned` or
`lead.queued`, or `lead.duplicate`) with the same explanation: rule, group and strategy,
candidates and why, the pointer before and after.

Holding a group's lock for a batch lifts the one-transaction-per-lead ceiling of a hot group:
500 leads cost one lock, one eligibility read and a handful of INSERTs.
"""

from __future__ import annotations

import codecs
import contextlib
import csv
import dataclasses
import io
import json
import logging
import multiprocessing
import os
import queue
import re
import signal
import string
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import IO, Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import connection, connections, transaction
from django.utils import timezone
from rest_framework import serializers

from audit.models import AuditEvent
from audit.services import Event, audit_record_bulk
from notifications.services import outbox_add_many
from rotation.eligibility import MemberFacts
from rotation.models import Group, RotationState
from rotation.rules import as_typed, lead_facts, match_rules
from routing_project import metrics
from routing_project.api import json_loads_client
from routing_project.bulkdb import ids_reserve, rows_insert, supports_copy
from routing_project.db import set_lock_timeout
from routing_project.logging import request_id_var

from . import notify, ownership, routing, scheduling
from .api.serializers import LeadInSerializer
from .models import DEDUP_STATUSES, LEAD_DATA_FIELDS, Assignment, Lead, LeadStatus
from .services import CONTACT_FIELDS, Resolution, active_rules, normalize_email

logger = logging.getLogger(__name__)

BATCH_SIZE = 500
# The most `import_leads --batch-size` takes: a batch holds a lock per lead (its email's advisory
# lock) until it commits, in the lock table every session shares (max_locks_per_transaction x
# max_connections: 6,400 slots with PostgreSQL's defaults).
MAX_BATCH_SIZE = 2000
MAX_ERRORS_KEPT = 1000
ATTRIBUTE_PREFIX = "attributes."
COLUMNS = tuple(LeadInSerializer().fields)
MEMO_FIELDS = ("country", "region", "source", "product", "score", "company_size", "group")
MEMO_SIZE = 10_000
MEMO_VALUE_MAX = 200  # characters
_UNDECODED = re.compile("[\udc80-\udcff]")  # bytes the encoding could not read (`csv_text`)


class ImportFormatError(ValueError):
    """The file as a whole cannot be imported (no header, unknown columns)."""


@dataclass
class RowError:
    line: int
    errors: dict[str, list[str]]

    def __str__(self) -> str:
        parts = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in self.errors.items())
        return f"line {self.line}: {parts}"


@dataclass
class RowRepeat:
    """A row skipped because an earlier row of the same file gave its `external_id`."""

    line: int
    external_id: str
    first_line: int

    def __str__(self) -> str:
        return f"line {self.line}: external_id {self.external_id!r} duplicates line {self.first_line}"


@dataclass
class RowChanged:
    """A row skipped as already imported whose values differ from its lead's (imported or
    posted before): the import changes no lead, so it says which fields differ."""

    line: int
    external_id: str
    lead_id: int
    fields: list[str]

    def __str__(self) -> str:
        differ = "differs" if len(self.fields) == 1 else "differ"
        return (
            f"line {self.line}: external_id {self.external_id!r} is lead {self.lead_id}, taken in before, whose "
            f"{', '.join(self.fields)} {differ} from the row (the lead is left as it is)"
        )


@dataclass
class ImportReport:
    import_id: str
    rows: int = 0
    imported: int = 0
    assigned: int = 0
    queued: int = 0
    duplicates: int = 0
    already_imported: int = 0  # repeated included
    repeated: int = 0  # of those, the rows whose external_id an earlier row of this file gave
    changed: int = 0  # of those, the rows whose values differ from the lead taken in before
    invalid: int = 0
    batches: int = 0
    errors: list[RowError] = field(default_factory=list)
    repeats: list[RowRepeat] = field(default_factory=list)  # the first MAX_ERRORS_KEPT of `repeated`
    changes: list[RowChanged] = field(default_factory=list)  # the first MAX_ERRORS_KEPT of `changed`
    # When the import began: a lead created before it was not taken in by it (bulk.py looks up
    # the line that took an external id only for the leads created since).
    started_at: datetime = field(default_factory=timezone.now)

    def summary(self) -> str:
        def counted(n: int, noun: str) -> str:  # "1 row", "2 rows"
            return f"{n} {noun}{'' if n == 1 else 's'}"

        notes = [f"{self.repeated} repeating an earlier line of the file"] if self.repeated else []
        if self.changed:
            notes.append(f"{self.changed} differing from the lead taken in before")
        repeated = f" ({', '.join(notes)})" if notes else ""
        return (
            f"{counted(self.rows, 'row')}: {self.imported} imported ({self.assigned} assigned, {self.queued} queued), "
            f"{counted(self.duplicates, 'duplicate')}, {self.already_imported} already imported{repeated}, "
            f"{self.invalid} invalid"
        )


@dataclass
class _Row:
    """A valid row and its group resolution (plain data: it crosses a process boundary)."""

    line: int
    data: dict[str, Any]
    raw: dict[str, str]
    requested: str  # the row's own group slug, or ""
    group_slug: str | None  # the resolved group
    rule: str | None
    rules_tried: list[str]
    group_source: str  # "rule", "requested", "default" or "none"
    email_normalized: str
    matched_on: list[dict[str, Any]] = field(default_factory=list)

    def explanation(self) -> dict[str, Any]:
        """The same keys as intake's (`services.Resolution.explanation`)."""
        resolution = Resolution(None, self.rule, self.rules_tried, self.group_source, matched_on=self.matched_on)
        return resolution.explanation()


class _RowValidator:
    """The API's validation (`LeadInSerializer`'s own fields and `validate_<field>` hooks),
    without building a serializer per row; the group look-up is cached for the whole file.
    The header was checked already, so every key names a field."""

    def __init__(self, groups: dict[str, Group]) -> None:
        self.serializer = LeadInSerializer()
        self.fields = dict(self.serializer.fields)
        self.hooks = {name: getattr(self.serializer, f"validate_{name}", None) for name in self.fields}
        self.groups = groups
        # Fields with few distinct values are validated once per value (the checks are pure).
        self.memo: dict[str, dict[Any, tuple[bool, Any]]] = {name: {} for name in MEMO_FIELDS}

    def _field(self, name: str, value: Any) -> tuple[bool, Any]:
        try:
            validated = self.fields[name].run_validation(value)
            if name == "group":
                validated = self.groups.get(validated)
                if validated is None:
                    raise serializers.ValidationError(f"No group with slug '{value}'.")
            elif (hook := self.hooks[name]) is not None:
                validated = hook(validated)
            return True, validated
        except serializers.ValidationError as exc:
            return False, exc.detail
        except DjangoValidationError as exc:
            return False, exc.messages

    def __call__(self, data: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        errors: dict[str, Any] = {}
        for name, value in data.items():
            # Short values only: a cell may be 128 KiB, and 10,000 long ones kept would make
            # memory grow with the file (the values repeated are short: countries, sources...).
            memo = self.memo.get(name) if len(value) <= MEMO_VALUE_MAX else None
            if memo is not None and value in memo:
                ok, result = memo[value]
            else:
                ok, result = self._field(name, value)
                if memo is not None:
                    if len(memo) >= MEMO_SIZE:
                        memo.clear()  # bounded: memory stays flat on any file
                    memo[value] = (ok, result)
            if ok:
                out[name] = result
            else:
                errors[name] = result
        if "email" not in data:
            errors["email"] = ["This field is required."]
        if errors:
            raise serializers.ValidationError(errors)
        return out


# The encodings sales ops meet in CSV files, by the names people know them by (the admin's
# choice; `import_leads --encoding` takes any text encoding Python knows).
ENCODINGS = {
    "utf-8": 'UTF-8 (Excel: "CSV UTF-8")',
    "cp1252": 'Windows-1252 (Excel: "CSV (Comma delimited)", Western Europe and the Americas)',
    "cp1250": "Windows-1250 (Central Europe)",
    "cp1251": "Windows-1251 (Cyrillic)",
    "mac_roman": "Mac Roman (older Excel for Mac)",
}
_ASCII = string.printable


def encoding_codec(name: str) -> str:
    """The codec for an encoding a user names (`cp1252`, `Windows-1252`, `latin-1`...).
    ValueError when Python knows no text encoding by that name, or it is not ASCII-compatible
    (UTF-16, UTF-7): the csv module reads commas, quotes and line ends as ASCII."""
    try:
        info = codecs.lookup(name.strip())
        if info.name == "utf-8-sig":  # UTF-8, a byte order mark or not: `csv_text` drops one
            info = codecs.lookup("utf-8")
    except LookupError:
        raise ValueError(f"Unknown encoding {name[:40]!r}: use utf-8, cp1252, cp1250, cp1251, mac_roman...") from None
    if not getattr(info, "_is_text_encoding", True):
        raise ValueError(f"{name[:40]!r} is not a text encoding.")
    try:
        compatible = _ASCII.encode(info.name) == _ASCII.encode()
    except UnicodeError:
        compatible = False
    if not compatible:
        raise ValueError(f"{name[:40]!r} does not write plain ASCII as ASCII: save the file as UTF-8.")
    return info.name


def encoding_label(codec: str) -> str:
    """`ENCODINGS`' short name (`Windows-1252`), else the codec's."""
    name = codecs.lookup(codec).name
    labels = {codecs.lookup(key).name: label.split(" (")[0] for key, label in ENCODINGS.items()}
    return labels.get(name, codec)


@dataclass(frozen=True)
class FileScan:
    """What `scan_in` read of a file before its import: its rows, for the progress bar, and
    whether it is UTF-8 (`encoding_problem`)."""

    rows: int
    not_utf8_line: int | None = None  # the first line holding bytes that are not UTF-8
    not_utf8_lines: int = 0  # how many lines hold such bytes
    utf8_line: int | None = None  # the first line of valid UTF-8 past ASCII (accents...) and no such bytes
    utf8_lines: int = 0  # how many such lines
    sample: bytes = b""  # the cell at the first of those lines that tells: not UTF-8, else UTF-8
    bom: str = ""  # the encoding a byte order mark at its start names: "utf-8", "utf-16" or ""
    binary: str = ""  # what the file is when it is no text at all ("a PNG image"), else ""


_CELL_END = re.compile('[,"\r\n]')
_LINE_END = re.compile("\r\n|\r|\n")  # as the csv module's reader counts lines (newline="")


def _cell_around(text: str, at: int) -> bytes:
    """The cell holding text[at] (at most 40 characters each side), as the file's bytes."""
    left = text[max(at - 40, 0) : at]
    ends = list(_CELL_END.finditer(left))
    start = at - len(left) + (ends[-1].end() if ends else 0)
    after = _CELL_END.search(text, at, at + 40)
    end = after.start() if after else min(at + 40, len(text))
    return text[start:end].encode("utf-8", "surrogateescape")


class _Scan:
    """`scan_in`'s tally, line by line: a line past ASCII is either not UTF-8 (bytes the
    decoder kept as lone surrogates) or UTF-8 (and then a line of another 8-bit encoding whose
    accented letters happen to pair up as UTF-8 would, which a Cyrillic or an upper-case
    French line often does, counts as UTF-8: `encoding_problem` weighs the two counts)."""

    def __init__(self) -> None:
        self.lines = 0
        self.bad = self.good = 0
        self.first_bad: int | None = None
        self.first_good: int | None = None
        self.bad_sample = self.good_sample = b""

    def line(self, text: str) -> None:
        self.lines += 1
        if text.isascii():
            return
        if (found := _UNDECODED.search(text)) is not None:
            self.bad += 1
            if self.first_bad is None:
                self.first_bad, self.bad_sample = self.lines, _cell_around(text, found.start())
        else:
            self.good += 1
            if self.first_good is None:
                at = next(i for i, c in enumerate(text) if not c.isascii())
                self.first_good, self.good_sample = self.lines, _cell_around(text, at)


# What a file chosen by mistake usually is, by its first bytes: said by name, where "not
# UTF-8 text" and an encoding to choose would send the user looking for the wrong fix.
_NOT_TEXT = (
    (
        b"PK\x03\x04",
        'a zip archive (an Excel .xlsx or OpenDocument .ods workbook is one): save the sheet as "CSV UTF-8"',
    ),
    (b"\xd0\xcf\x11\xe0", 'an Excel 97-2003 workbook (.xls): save the sheet as "CSV UTF-8"'),
    (b"%PDF", "a PDF document"),
    (b"\x89PNG", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF8", "a GIF image"),
)


def _not_text(head: bytes, bom: str) -> str:
    """What a file whose first bytes are `head` is, when it is no text (a known kind, or any
    file holding a NUL byte, which no CSV text has: UTF-16, which does, is told by its mark)."""
    kind = next((kind for magic, kind in _NOT_TEXT if head.startswith(magic)), "")
    if not kind and not bom and b"\0" in head:
        kind = "binary data, not text"
    return kind


def scan_in(binary: IO[bytes]) -> FileScan:
    """Reads an open binary file from its start to its end, streamed, and leaves it at its
    start again: its data rows (lines less the header) and which of its lines are not UTF-8.
    Reading it all first also means a file that cannot be read stops before anything is
    written. About 30 ms for 100,000 rows of ASCII, 0.15 s for 100,000 accented ones."""
    decoder = codecs.getincrementaldecoder("utf-8-sig")(errors="surrogateescape")
    tally = _Scan()
    binary.seek(0)
    head = binary.read(8192)  # its marks: a byte order mark, or what it is when no text
    binary.seek(0)
    bom = "utf-8" if head.startswith(codecs.BOM_UTF8) else ""
    bom = "utf-16" if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)) else bom
    if kind := _not_text(head, bom):
        return FileScan(0, binary=kind)
    pending = ""  # the line the chunk ended in, not ended yet
    while True:
        chunk = binary.read(1 << 20)
        text = pending + decoder.decode(chunk, final=not chunk)
        if chunk and text.endswith("\r"):
            text, pending = text[:-1], "\r"  # a \r\n may be split between two chunks
        else:
            pending = ""
        if text.isascii():  # most files: nothing to tell line by line, the line ends counted
            tally.lines += text.count("\n") + text.count("\r") - text.count("\r\n")
            rest = text[max(text.rfind("\n"), text.rfind("\r")) + 1 :]
        else:
            *lines, rest = _LINE_END.split(text)
            for line in lines:
                tally.line(line)
        pending = rest + pending
        if not chunk:
            break
    if pending:
        tally.line(pending)
    binary.seek(0)
    sample = tally.bad_sample if tally.first_bad is not None else tally.good_sample
    return FileScan(max(tally.lines - 1, 0), tally.first_bad, tally.bad, tally.first_good, tally.good, sample, bom)


def scan(path: str) -> FileScan:
    """`scan_in` for a file by its path."""
    with open(path, "rb") as f:
        return scan_in(f)


@dataclass(frozen=True)
class EncodingProblem:
    message: str
    instead: str | None  # the encoding to read the file in, when one will do ("utf-8")
    choices: tuple[str, ...] = ()  # else those to choose from, the one that reads right


# The 8-bit encodings a file that is not UTF-8 is offered in, each with how its first such
# cell reads there: which one it is, the reader tells at a glance ("Иван" or "Èâàí").
_EIGHT_BIT = ("cp1252", "cp1250", "cp1251", "mac_roman")


def encoding_problem(scan: FileScan, codec: str) -> EncodingProblem | None:
    """Why the file cannot be read in `codec`, found before anything is written; None when it
    can. The caller says how to choose `instead` or among `choices` (an option, a field).

    Read as UTF-8, a file with more lines that are not UTF-8 than lines of UTF-8 past ASCII is
    in an 8-bit encoding (Excel's "CSV (Comma delimited)" writes Windows-1252 in Western
    Europe, -1250 in Central Europe, -1251 in Cyrillic; some of its lines may read as UTF-8 by
    chance, "CAFÉ™" does): imported, its plain-ASCII rows would go in and most rows with an
    accent be refused. Which 8-bit encoding it is, its bytes do not say: the message shows its
    first such cell as each reads it. A UTF-8 file damaged in places (mostly valid UTF-8, or
    beginning with UTF-8's byte order mark) is imported, its damaged rows refused by line.
    Read in another encoding, a file that is UTF-8 text past ASCII would import its accents as
    two or three wrong characters each ("RenÃ©"): it is refused, saying so."""
    if scan.binary:
        return EncodingProblem(f"The file is not CSV text: it is {scan.binary}.", None)
    if scan.bom == "utf-16":
        return EncodingProblem('The file is UTF-16 text (Excel\'s "Unicode Text"): save it as "CSV UTF-8".', None)
    if codecs.lookup(codec).name == "utf-8":
        if scan.not_utf8_line is None or scan.bom == "utf-8" or scan.utf8_lines >= scan.not_utf8_lines:
            return None
        others = scan.not_utf8_lines - 1
        more = f" (and {others} other line{'s' if others != 1 else ''})" if others else ""
        readings = ", ".join(
            f'"{scan.sample.decode(c, "replace").strip()}" as {encoding_label(c)} ({c})' for c in _EIGHT_BIT
        )
        message = (
            f"The file is not UTF-8 text: line {scan.not_utf8_line}{more} holds bytes that are not UTF-8 (Excel's "
            f'"CSV (Comma delimited)" writes its region\'s 8-bit encoding). Its first such cell reads {readings}.'
        )
        return EncodingProblem(message, None, _EIGHT_BIT)
    if scan.bom == "utf-8":
        return EncodingProblem("The file is UTF-8 text: it begins with UTF-8's byte order mark.", "utf-8")
    if scan.not_utf8_line is None and scan.utf8_line is not None:
        utf8 = scan.sample.decode("utf-8", "replace").strip()
        misread = scan.sample.decode(codec, "replace").strip()
        message = (
            f'The file is UTF-8 text: line {scan.utf8_line} reads "{utf8}" as UTF-8 and "{misread}" as '
            f"{encoding_label(codec)}."
        )
        return EncodingProblem(message, "utf-8")
    return None


def leads_import(
    *,
    lines: Iterable[str],
    actor: str,
    batch_size: int = BATCH_SIZE,
    notify_reps: bool = True,
    progress: Callable[[int], None] | None = None,
    parallel: bool = False,
    import_id: str | None = None,
    encoding: str = "utf-8",
) -> ImportReport:
    """Imports and routes the leads of a CSV stream (an open text file, newline="").

    `parallel`: validate in a forked process (the command line); else in a thread.
    `progress(rows)` is called after each batch with the rows it read. `import_id`: the
    caller's (which it can name if the import is cut short), else a new one. `encoding`: the
    one `lines` were read in (`csv_text`), named where bytes it cannot read refuse a row.

    Outside a request (the command line), the import id is the request id of every log line
    while it runs, as it is of its audit events: one id finds both, as a task's id does."""
    import_id = import_id or new_import_id()
    token = request_id_var.set(import_id) if request_id_var.get() == "-" else None
    try:
        steps = leads_import_steps(
            lines=lines,
            actor=actor,
            batch_size=batch_size,
            notify_reps=notify_reps,
            parallel=parallel,
            import_id=import_id,
            encoding=encoding,
        )
        while True:
            try:
                read = next(steps)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]
            if progress:
                progress(read)
    finally:
        if token is not None:
            request_id_var.reset(token)


class _InterruptsHeld:
    """Set from the last statement of a batch's transaction until its caller has counted the
    batch (`leads_import_steps` resumes after its `yield`): a Ctrl-C or TERM that comes then
    waits for the count. Raised between the commit and the count, it made an interrupted
    import report one batch fewer than was in."""

    held = False
    pending: BaseException | None = None


def interrupt(exc: BaseException) -> None:
    """For a signal handler (the command's, for Ctrl-C and TERM): raises `exc` now, or, while a
    batch is committed and counted, once it is counted."""
    if _InterruptsHeld.held:
        _InterruptsHeld.pending = exc
        return
    raise exc


def _interrupts_released() -> None:
    _InterruptsHeld.held = False
    pending, _InterruptsHeld.pending = _InterruptsHeld.pending, None
    if pending is not None:
        raise pending


def new_import_id() -> str:
    return f"import-{uuid.uuid4().hex[:12]}"


def leads_import_steps(
    *,
    lines: Iterable[str],
    actor: str,
    batch_size: int = BATCH_SIZE,
    notify_reps: bool = True,
    parallel: bool = False,
    import_id: str | None = None,
    encoding: str = "utf-8",
) -> Generator[int, None, ImportReport]:
    """`leads_import` one batch at a time: yields the rows each batch read once it is routed
    and committed, and returns the report (for a page that shows its progress as it goes).
    A bad header raises ImportFormatError at the first step; stopped early (closed), the
    batches already committed stay, as after an import cut short."""
    report = ImportReport(import_id=import_id or new_import_id())
    source = _LinesReadAgain(lines)
    reader = csv.reader(source, strict=True)
    header: list[str] = []
    start = 1
    uncounted = 0  # lines before the header that the reader in use did not read
    quoted_delimiter: str | None = None
    try:
        while not any(cell.strip() for cell in header):  # blank lines above the header
            start = reader.line_num + 1
            source.row.clear()
            try:
                header = next(reader)
            except csv.Error:
                # Every name quoted and separated by `;` or tabs ("email";"country", as tools
                # that quote every cell write it): read with commas, text after a closing quote.
                quoted_delimiter = _quoted_header_delimiter(source.row)
                if quoted_delimiter is None:
                    raise
                break
        if (delimiter := quoted_delimiter or _delimiter_of(header)) != ",":
            # Excel in France or Germany writes its locale's list separator (`;`) in "CSV"
            # files, and a "Text (Tab delimited)" file tabs: the header row is read again with it.
            uncounted = start - 1
            source.read_again(first=True)
            reader = csv.reader(source, strict=True, delimiter=delimiter)
            header = next(reader)
    except StopIteration:
        raise ImportFormatError("The file is empty: it needs a header row naming the columns.") from None
    except csv.Error as exc:
        # A header the csv module cannot read (a stray quote) stops the file as any bad header.
        raise ImportFormatError(f"Bad header: {_csv_problem(exc, start, reader.line_num + uncounted)}") from None
    label = encoding_label(encoding)
    columns = _check_header(header, label)
    groups = {g.slug: g for g in Group.objects.all()}
    rules = active_rules()
    validator = _RowValidator(groups)

    def validated_batches() -> Iterator[_Parsed]:
        """Parsing and validation, batch by batch; no database, no shared state."""
        parsed = _Parsed([], 0, 0, [])
        local = ImportReport(import_id=report.import_id)  # collects this batch's bad rows
        line = reader.line_num + uncounted
        again = -uncounted  # lines read twice (the reader counts them twice), less those it did not read

        def refused(start: int, end: int, problem: str) -> None:
            """The row of lines start-end is refused; when it ran on over several (a quote not
            closed where its cell ends), the lines after its first are read again as rows of
            their own, not lost with it."""
            nonlocal again
            if end > start:
                again += source.read_again()
                lines_after = f"Line {end} is" if end == start + 1 else f"Lines {start + 1}-{end} are"
                problem += f" {lines_after} read again as rows of their own."
            parsed.read += 1
            local.invalid += 1
            if len(local.errors) < MAX_ERRORS_KEPT:
                local.errors.append(RowError(start, {"row": [problem]}))

        while True:
            source.row.clear()
            try:
                cells = next(reader)
            except StopIteration:
                break
            except csv.Error as exc:
                # Malformed CSV (a quote never closed, a cell past the limit, text after a
                # closing quote): that row is reported and the reader goes on at the next line.
                start, end = line + 1, reader.line_num - again
                refused(start, end, _csv_problem(exc, start, end))
                line = start  # the lines after it, if any, are read again
                continue
            # A quoted cell may span lines: report the first.
            start, line = line + 1, reader.line_num - again
            if line > start and _cells_wrong(cells, columns):
                # A quote closed by another further on ("Jane, ... TV 5",FR): no CSV error, but
                # the cell ran on over the lines between.
                problem = (
                    f"{len(cells)} cells for {len(columns)} columns in a row that runs on over lines {start}-{line}: "
                    'a quoted cell is not closed where it ends (a " inside an unquoted cell?).'
                )
                refused(start, line, problem)
                line = start
                continue
            if not any(c.strip() for c in cells):
                continue
            parsed.read += 1
            row = _validate(start, columns, cells, validator, groups, rules, local, label)
            if row is not None:
                parsed.rows.append(row)
            if len(parsed.rows) >= batch_size:
                parsed.invalid, parsed.errors = local.invalid, local.errors
                yield parsed
                parsed, local = _Parsed([], 0, 0, []), ImportReport(import_id=report.import_id)
        if parsed.rows or parsed.read:
            parsed.invalid, parsed.errors = local.invalid, local.errors
            yield parsed

    # Parsing and validating the next batches (Python) overlaps routing and writing this one
    # (mostly PostgreSQL), at most two batches ahead so memory stays flat: in a forked process
    # (`parallel`, the command line: a second core) or else in a thread.
    ahead = _read_ahead_process if parallel else _read_ahead
    for parsed in ahead(validated_batches(), depth=2):
        report.rows += parsed.read
        report.invalid += parsed.invalid
        report.errors.extend(parsed.errors[: max(MAX_ERRORS_KEPT - len(report.errors), 0)])
        if parsed.rows:
            _route_batch(parsed.rows, groups=groups, actor=actor, report=report, notify_reps=notify_reps)
        try:
            yield parsed.read  # the caller counts it (a progress bar, an interrupted import's message)
        finally:
            _interrupts_released()
    return report


def _cells_wrong(cells: list[str], columns: list[str]) -> bool:
    """Fewer cells than columns, or a value past them (`_validate` refuses both)."""
    return len(cells) < len(columns) or any(c.strip() for c in cells[len(columns) :])


class _LinesReadAgain:
    """The file's lines for the csv module, keeping those of the row being read (`row`, cleared
    by the caller before each): a row the module gave up on after several lines can be refused
    alone, its lines after the first read again. At most the csv module's cell limit is kept
    (128 KiB: past it, the module gives up)."""

    def __init__(self, lines: Iterable[str]) -> None:
        self._lines = iter(lines)
        self._again: list[str] = []  # the lines to read again, the next one last
        self.row: list[str] = []

    def __iter__(self) -> _LinesReadAgain:
        return self

    def __next__(self) -> str:
        line = self._again.pop() if self._again else next(self._lines)
        self.row.append(line)
        return line

    def read_again(self, first: bool = False) -> int:
        """Puts back the lines of the row read but its first (all of them: `first`); returns
        how many."""
        lines = self.row if first else self.row[1:]
        self._again.extend(reversed(lines))
        self.row = []
        return len(lines)


def _csv_problem(exc: csv.Error, start: int, end: int) -> str:
    text = str(exc)
    if "field limit" in text:
        problem = f"a cell is longer than {csv.field_size_limit()} characters"
    elif "end of data" in text:
        problem = "a quoted cell is not closed before the end of the file"
    elif "expected after" in text:
        problem = 'text after a closing quote (quote the whole cell, and double any " inside it)'
    else:
        problem = f"not readable as CSV ({text})"
    return f"{problem}{f' (lines {start}-{end})' if end > start else ''}."


@dataclass
class _Parsed:
    rows: list[_Row]
    read: int
    invalid: int
    errors: list[RowError]


def _read_ahead_process(items: Iterator[Any], *, depth: int) -> Iterator[Any]:
    """Runs an iterator in a forked child process and receives its items through a pipe (the
    pipe's buffer is the read-ahead bound). The child touches no database connection and
    leaves with os._exit, so the parent's connection is never closed under it. For a
    single-threaded process only (the management command): forking a threaded server is
    not safe."""
    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def produce() -> None:
        # The parent gone (killed, not Ctrl-C, which reaches both), this process must end
        # too, and with it what it inherited: its copy of the pipe's read end kept a send
        # blocked for ever (nobody would read, yet a reader was left), and its copy of the
        # parent's database socket kept the parent's session, and the batch's rotation locks,
        # open on the server: intake into those groups answered 503 until it was found and
        # killed by hand. The socket is closed here, not the connection (that would end the
        # parent's session under it).
        # The parent's own TERM handler (the command's: a TERM ends the import as Ctrl-C does)
        # is not this process's: the parent's terminate() must end it, without a traceback.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        receiver.close()
        _forget_inherited_sockets()
        try:
            for item in items:
                sender.send((True, item))
            sender.send((True, _DONE_MARK))
        except BrokenPipeError:
            return  # the parent is gone: nobody to hand anything to
        except BaseException as exc:  # noqa: BLE001 - handed to the parent, raised there
            with contextlib.suppress(OSError):
                sender.send((False, exc))

    child = context.Process(target=produce, name="import-reader", daemon=True)
    child.start()
    sender.close()
    try:
        while True:
            try:
                ok, item = receiver.recv()
            except EOFError:
                raise RuntimeError("the import's reader process died") from None
            if not ok:
                raise item
            if item == _DONE_MARK:
                return
            yield item
    finally:
        receiver.close()
        if child.is_alive():
            child.terminate()
        child.join(timeout=5)


def _forget_inherited_sockets() -> None:
    """In a forked child: closes its copies of the parent's database sockets, so that the
    parent's sessions end with the parent, whatever becomes of the child."""
    for conn in connections.all(initialized_only=True):
        raw = conn.connection
        if raw is None:
            continue
        with contextlib.suppress(Exception):
            os.close(raw.fileno())


_DONE_MARK = "__import_done__"
_DONE = object()


def _read_ahead(items: Iterator[Any], *, depth: int) -> Iterator[Any]:
    """Runs an iterator in a thread, `depth` items ahead of the consumer. An exception in the
    thread is raised in the consumer; a consumer that stops early stops the thread."""
    buffer: queue.Queue[Any] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item: Any) -> bool:
        while not stop.is_set():
            try:
                buffer.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put(item):
                    return
            put(_DONE)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, raised there
            put(exc)

    thread = threading.Thread(target=produce, name="import-reader", daemon=True)
    thread.start()
    try:
        while True:
            item = buffer.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join(timeout=5)


def _column_name(cell: str) -> str:
    name = cell.strip()
    if name.lower().startswith(ATTRIBUTE_PREFIX):
        return ATTRIBUTE_PREFIX + name[len(ATTRIBUTE_PREFIX) :]
    return name.lower()


def _delimiter_of(header: list[str]) -> str:
    """The delimiter the header row is written with: a comma, unless read with commas it is
    one column whose `;` or tabs separate names, `email` among them."""
    if len(header) == 1:
        for separator in (";", "\t"):
            if "email" in (_column_name(name) for name in header[0].split(separator)):
                return separator
    return ","


def _quoted_header_delimiter(lines: list[str]) -> str | None:
    """`;` or a tab, if the header row's lines, read with it, name an `email` column."""
    for separator in (";", "\t"):
        try:
            names = next(csv.reader(io.StringIO("".join(lines)), strict=True, delimiter=separator), [])
        except csv.Error:
            continue
        if "email" in (_column_name(name) for name in names):
            return separator
    return None


def _check_header(header: list[str], encoding: str = "UTF-8") -> list[str]:
    if any(_UNDECODED.search(h) or "\x00" in h for h in header):
        # Bytes `csv_text` could not read (a Latin-1 or UTF-16 file read as UTF-8): refused
        # here, else an `attributes.<key>` column takes them as its key and the database
        # refuses the whole batch.
        raise ImportFormatError(f"The header row is not {encoding} text: save the file as UTF-8 (CSV UTF-8).")
    # Column names in any case; an attribute's key as written (the API keeps its case, and a
    # rule on attributes.<Key> must match imported leads as it matches posted ones).
    columns = [_column_name(h) for h in header]
    for separator, name in ((";", "semicolons"), ("\t", "tabs")):
        if "email" not in columns and any("email" in c.split(separator) for c in columns):
            # A spreadsheet saved with its locale's list separator (Excel in France or Germany
            # writes `;`): the whole header is one column, and its names would be called unknown.
            raise ImportFormatError(
                f"The columns are separated by {name}, not commas: save the file as CSV UTF-8 (comma delimited)."
            )
    # A column without a name (spreadsheets write `email,group,` with a trailing delimiter) is
    # ignored; a value in it is a bad row (`_validate`).
    unknown = [
        c for c in columns if c and c not in COLUMNS and not (c.startswith(ATTRIBUTE_PREFIX) and c != ATTRIBUTE_PREFIX)
    ]
    problems = []
    if unknown:
        problems.append(f"unknown columns: {', '.join(repr(c) for c in unknown[:20])}")
    if "email" not in columns:
        problems.append("the required column 'email' is missing")
    # Counted once (not columns.count per column: quadratic, minutes on a header of 100,000 cells).
    repeated = sorted(c for c, n in Counter(columns).items() if c and n > 1)
    if repeated:
        problems.append(f"repeated columns: {', '.join(repeated)}")
    if problems:
        known = ", ".join(COLUMNS)
        raise ImportFormatError(f"Bad header ({'; '.join(problems)}). Columns are {known} and attributes.<key>.")
    return columns


def _validate(
    line: int,
    columns: list[str],
    cells: list[str],
    validator: _RowValidator,
    groups: dict[str, Group],
    rules: list[Any],
    report: ImportReport,
    encoding: str = "UTF-8",
) -> _Row | None:
    raw: dict[str, str] = {}
    data: dict[str, Any] = {}
    attributes: dict[str, Any] = {}
    errors: dict[str, list[str]] = {}
    if len(cells) > len(columns) and any(c.strip() for c in cells[len(columns) :]):
        # Blank cells past the header (trailing delimiters) carry nothing; a value there has no
        # column to go to.
        errors["row"] = [f"{len(cells)} cells for {len(columns)} columns."]
    elif len(cells) < len(columns):
        # A row cut short (a truncated file, a line broken in two) would be routed on the facts
        # it lost, and its rest, if it had an external_id, skipped as already imported on the
        # next upload. Spreadsheets and CSV writers write every cell, empty ones as ",,".
        errors["row"] = [f"{len(cells)} cells for {len(columns)} columns: the row is cut short."]
    if any(_UNDECODED.search(c) for c in cells):
        # The bytes `csv_text` could not read (kept as lone surrogates, never stored): a file
        # damaged here, or one mixing encodings (a file wholly in another one is refused before
        # it is read: `encoding_problem`).
        errors["row"] = [*errors.get("row", []), f"Not {encoding} text: bytes here are not {encoding}."]
    unnamed: list[int] = []  # the places of values in columns without a name
    in_json: dict[str, Any] = {}  # the attributes column's object
    for place, (name, value) in enumerate(zip(columns, cells, strict=False), start=1):
        value = value.strip()
        if not value:
            continue
        if not name:
            unnamed.append(place)
            continue
        raw[name] = value
        if name.startswith(ATTRIBUTE_PREFIX):
            attributes[name[len(ATTRIBUTE_PREFIX) :]] = value
        elif name == "attributes":
            try:
                parsed = json_loads_client(value)
            except ValueError as exc:
                errors["attributes"] = [f"Must be a JSON object ({exc})."]
                continue
            if isinstance(parsed, dict):
                in_json = parsed
            else:
                errors["attributes"] = ["Must be a JSON object."]
        else:
            data[name] = value
    if twice := sorted(k for k in in_json.keys() & attributes.keys() if in_json[k] != attributes[k]):
        # The attributes column and an attributes.<key> column giving one key two values: one
        # of them was dropped without a word.
        keys = ", ".join(f"'{k}'" for k in twice[:5])
        errors["attributes"] = [f"Given twice, differently: {keys}, in the attributes column and its own column."]
    attributes = {**in_json, **attributes}
    if unnamed:
        # One message for the row, however many such values (not one each: a wide row of them
        # made the report quadratic in time and its kept errors grow without bound).
        if len(unnamed) == 1:
            where = f"A value in column {unnamed[0]}, which has"
        else:
            more = f" and {len(unnamed) - 5} more" if len(unnamed) > 5 else ""
            where = f"Values in columns {', '.join(map(str, unnamed[:5]))}{more}, which have"
        errors["row"] = [*errors.get("row", []), f"{where} no name in the header."]
    if attributes:
        data["attributes"] = attributes
    if "row" not in errors:
        # Every bad field of the row, as the API names every bad field: an attributes cell that
        # is not a JSON object does not hide a bad score beside it.
        try:
            data = validator(data)
        except serializers.ValidationError as exc:
            detail = exc.detail if isinstance(exc.detail, dict) else {"row": exc.detail}
            errors.update({str(k): [str(m) for m in (v if isinstance(v, list) else [v])] for k, v in detail.items()})
    if errors:
        report.invalid += 1
        if len(report.errors) < MAX_ERRORS_KEPT:
            report.errors.append(RowError(line, errors))
        return None
    data = dict(data)
    requested: Group | None = data.pop("group", None)
    # The same resolution as intake: first rule by priority, the row's group, the default group.
    match = match_rules(rules, lead_facts(data))
    requested_slug = requested.slug if requested is not None else ""
    email = normalize_email(data["email"])
    if match.rule is not None:
        slug = match.rule.group_slug if match.rule.group_slug in groups else None
        rule, tried = match.rule.name, match.tried
        return _Row(line, data, raw, requested_slug, slug, rule, tried, "rule", email, match.matched_on)
    if requested is not None:
        return _Row(line, data, raw, requested_slug, requested.slug, None, match.tried, "requested", email)
    default = next((g.slug for g in groups.values() if g.is_default), None)
    return _Row(line, data, raw, "", default, None, match.tried, "default" if default else "none", email)


@dataclass
class _GroupTurn:
    """A group's rotation while a batch is routed: locked once, advanced in memory."""

    state: RotationState
    facts: list[MemberFacts]
    index: dict[int, int]
    assigned: int = 0


def _route_batch(
    rows: list[_Row], *, groups: dict[str, Group], actor: str, report: ImportReport, notify_reps: bool
) -> None:
    """One batch, one transaction; retried like intake after a deadlock, a serialization
    failure or a lock timeout (a rotation row held long by someone else): nothing of a failed
    attempt was written, and the counts are added only once it committed."""
    attempts = settings.ROUTING_MAX_RETRIES + 1
    for attempt in range(attempts):
        counts = ImportReport(import_id=report.import_id, started_at=report.started_at)
        try:
            with transaction.atomic():
                _route_batch_locked(rows, groups=groups, actor=actor, report=counts, notify_reps=notify_reps)
                _InterruptsHeld.held = True  # the commit, then the count (`leads_import_steps`)
        except Exception as exc:
            _interrupts_released()  # the batch failed: an interrupt meanwhile is raised now
            if (routing.is_retryable(exc) or routing.is_lock_timeout(exc)) and attempt + 1 < attempts:
                logger.warning("import batch retried after %s", routing.sqlstate(exc) or type(exc).__name__)
                time.sleep(0.05 * (attempt + 1))
                continue
            raise
        break
    for name in ("imported", "assigned", "queued", "duplicates", "already_imported", "repeated", "changed"):
        setattr(report, name, getattr(report, name) + getattr(counts, name))
    report.repeats.extend(counts.repeats[: max(MAX_ERRORS_KEPT - len(report.repeats), 0)])
    report.changes.extend(counts.changes[: max(MAX_ERRORS_KEPT - len(report.changes), 0)])
    report.batches += 1


def _select_any(columns: str, key: str, values: list[str], order_by: str = "") -> list[tuple[Any, ...]]:
    """Leads whose `key` is one of `values`: one array parameter (an IN list of 500 values
    costs more to build than to run)."""
    if not values:
        return []
    if connection.vendor != "postgresql":
        names = [c.strip() for c in columns.split(",")]
        qs = Lead.objects.filter(**{f"{key}__in": values})
        return list((qs.order_by(order_by) if order_by else qs).values_list(*names))
    sql = f"SELECT {columns} FROM leads_lead WHERE {key} = ANY(%s::text[])"  # noqa: S608 - our own names
    if order_by:
        sql += f" ORDER BY {order_by}"
    with connection.cursor() as cursor:
        cursor.execute(sql, [values])
        return cursor.fetchall()


# A lead's values a row is compared with when its external_id was taken in before (after id,
# external_id and created_at in `taken`).
_COMPARED = ("email_normalized", *(f for f in LEAD_DATA_FIELDS if f not in ("email", "external_id")), "attributes")


def _differing(row: _Row, lead: tuple[Any, ...]) -> list[str]:
    """The fields the row gives whose values differ from the lead's (an empty cell gives none)."""
    values = dict(zip(_COMPARED, lead[3:], strict=True))
    differing = ["email"] if row.email_normalized != values["email_normalized"] else []
    for name in _COMPARED[1:-1]:
        given = row.data.get(name)
        if given not in (None, "") and given != values[name]:
            differing.append(name)
    attributes = values["attributes"]
    if isinstance(attributes, str):  # jsonb, as a plain cursor reads it
        attributes = json.loads(attributes)
    given_attributes = row.data.get("attributes") or {}
    differing.extend(
        f"attributes.{key}"
        for key, value in given_attributes.items()
        if not _same_attribute((attributes or {}).get(key), value)
    )
    return differing


def _same_attribute(stored: Any, given: Any) -> bool:
    """A cell's text against the value the lead keeps: `"25"` is 25 and `"true"` is True, as the
    rules read them (a lead posted over the API keeps numbers and booleans, a CSV cell is text)."""
    if isinstance(given, str) and stored is not None and not isinstance(stored, str):
        typed = as_typed(given, stored)
        return not isinstance(typed, str) and isinstance(typed, bool) == isinstance(stored, bool) and typed == stored
    return isinstance(given, bool) == isinstance(stored, bool) and given == stored


def _duplicate_external_ids(values: list[str], import_id: str) -> dict[str, int | None]:
    """The external ids among `values` of leads taken in as duplicates: no lead row holds
    them, their lead.duplicate event does (indexed: audit_duplicate_external_idx). Each with
    the line of the row that took it in if that row is of this import (`import_id`), else None."""
    if not values:
        return {}
    if connection.vendor != "postgresql":
        found: dict[str, int | None] = {}
        for ext, imported_by, line in AuditEvent.objects.filter(
            type=AuditEvent.Type.LEAD_DUPLICATE, explanation__external_id__in=values
        ).values_list("explanation__external_id", "explanation__import", "explanation__line"):
            previous = found.get(ext)
            mine = line if imported_by == import_id and isinstance(line, int) else None
            found[ext] = previous if mine is None else mine if previous is None else min(mine, previous)
        return found
    with connection.cursor() as cursor:
        cursor.execute(
            # The type as a literal: the partial index's condition, which a parameter would hide.
            "SELECT explanation ->> 'external_id',"
            " min(CASE WHEN explanation ->> 'import' = %s THEN (explanation ->> 'line')::bigint END)"
            " FROM audit_auditevent"
            " WHERE type = 'lead.duplicate' AND (explanation ->> 'external_id') = ANY(%s::text[])"
            " GROUP BY 1",
            [import_id, values],
        )
        return dict(cursor.fetchall())


def _lines_taken_in(lead_ids: list[int], import_id: str) -> dict[str, int]:
    """The external ids of these leads that this import (`import_id`) took in, each with the
    line of its row, as the lead's lead.received event says (through audit_lead_id_idx)."""
    if not lead_ids:
        return {}
    events = AuditEvent.objects.filter(
        lead_id__in=lead_ids, type=AuditEvent.Type.LEAD_RECEIVED, explanation__import=import_id
    ).values_list("explanation__external_id", "explanation__line")
    return {ext: line for ext, line in events if ext and isinstance(line, int)}


def _point_lookups(on: bool) -> None:
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        if on:
            cursor.execute("SET LOCAL enable_seqscan = off; SET LOCAL max_parallel_workers_per_gather = 0")
        else:
            cursor.execute("SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL max_parallel_workers_per_gather TO DEFAULT")


def _lock_import_and_emails(emails: list[str]) -> None:
    """Imports serialize on one advisory lock (so their external_id checks are exact), then
    take the emails' locks (intake's first lock) in the order of their keys, as an intake batch
    does (routing_sql.intake_begin_many): no deadlock with intake."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(hashtextextended('leads.bulk_import', 0))")
        cursor.execute(
            "SELECT count(pg_advisory_xact_lock(k)) FROM "
            "(SELECT DISTINCT hashtextextended(e, 0) AS k FROM unnest(%s::text[]) AS e ORDER BY k) AS keys",
            [sorted(set(emails))],
        )


def _route_batch_locked(
    rows: list[_Row], *, groups: dict[str, Group], actor: str, report: ImportReport, notify_reps: bool
) -> None:
    now = timezone.now()
    set_lock_timeout()
    _lock_import_and_emails([r.email_normalized for r in rows])

    # The look-ups below are point look-ups by one indexed key each. An import grows the table
    # faster than autovacuum refreshes its statistics, and with stale statistics PostgreSQL
    # picks sequential scans (quadratic over the file) or intersects the wrong indexes. So, for
    # them only: no sequential scan, no parallel workers, and a single-column condition each.
    _point_lookups(True)
    # Idempotency by external_id: rows already imported (by an earlier run or batch) are skipped.
    external_ids = sorted({r.data["external_id"] for r in rows if r.data.get("external_id")})
    taken = _select_any(f"id, external_id, created_at, {', '.join(_COMPARED)}", "external_id", external_ids)
    done_ids = {row[1] for row in taken}
    stored = {row[1]: row for row in taken}
    duplicate_ids = _duplicate_external_ids(sorted(set(external_ids) - done_ids), report.import_id)
    done_ids |= set(duplicate_ids)
    # Those an earlier batch of this file took, with the line that took them: for the report.
    # Only leads created since the import began can be its own (none on a plain re-run).
    earlier_lines = {ext: line for ext, line in duplicate_ids.items() if line is not None}
    earlier_lines |= _lines_taken_in(
        [lead_id for lead_id, _, created_at, *_ in taken if created_at >= report.started_at], report.import_id
    )

    # Dedup, as intake: the newest open or queued lead of the email within the group's window.
    since = now - timedelta(days=max(groups[r.group_slug].dedup_days if r.group_slug else 30 for r in rows))
    open_by_email: dict[str, tuple[int, datetime, int | None, int | None]] = {}
    for lead_id, email, created_at, group_id, owner_id, status in _select_any(
        "id, email_normalized, created_at, group_id, owner_id, status",
        "email_normalized",
        sorted({r.email_normalized for r in rows}),
        order_by="id",
    ):
        if status in DEDUP_STATUSES and created_at >= since:
            open_by_email[email] = (lead_id, created_at, group_id, owner_id)
    _point_lookups(False)
    slugs = dict(Group.objects.filter(pk__in={v[2] for v in open_by_email.values()}).values_list("id", "slug"))

    # Account ownership (sticky routing), looked up by domain for the whole batch.
    owners = ownership.account_owners(ownership.email_domain(r.email_normalized) for r in rows)

    # The locks: each group's rotation row once for the whole batch, in group id order.
    turns: dict[int, _GroupTurn] = {}
    for group_id in sorted({groups[r.group_slug].id for r in rows if r.group_slug}):
        state = routing.lock_rotation(group_id)
        facts = routing.member_facts(state.group, now) if state.group.active else []
        turns[group_id] = _GroupTurn(state, facts, {f.rep_id: i for i, f in enumerate(facts)})

    new: list[_NewLead] = []
    duplicates: list[tuple[_NewLead | int, str, int | None, _Row, int]] = []
    batch_external: dict[str, int] = {}  # external id -> the line of this batch that took it
    batch_email: dict[str, _NewLead] = {}
    for row in rows:
        ext = row.data.get("external_id") or ""
        if ext and (ext in done_ids or ext in batch_external):
            report.already_imported += 1
            first_line = batch_external.get(ext) or earlier_lines.get(ext)
            if first_line is not None:  # an earlier row of this file, not an earlier run or the API
                report.repeated += 1
                if len(report.repeats) < MAX_ERRORS_KEPT:
                    report.repeats.append(RowRepeat(row.line, ext, first_line))
            elif ext in stored and (differing := _differing(row, stored[ext])):
                report.changed += 1
                if len(report.changes) < MAX_ERRORS_KEPT:
                    report.changes.append(RowChanged(row.line, ext, stored[ext][0], differing))
            continue
        if ext:
            batch_external[ext] = row.line
        group = turns[groups[row.group_slug].id].state.group if row.group_slug else None
        window = group.dedup_days if group else 30
        # The same email earlier in this batch: a duplicate, as intake would find it, unless the
        # group keeps no window (dedup_days 0: intake finds no earlier lead of the address).
        if window and row.email_normalized in batch_email:
            first = batch_email[row.email_normalized]
            duplicates.append((first, first.values["group_slug"], first.values["owner_id"], row, window))
            continue
        existing = open_by_email.get(row.email_normalized)
        if window and existing is not None and existing[1] >= now - timedelta(days=window):
            slug = slugs.get(existing[2], "") if existing[2] else ""
            duplicates.append((existing[0], slug, existing[3], row, window))
            continue
        domain = ownership.email_domain(row.email_normalized)
        owner = owners.get(domain)
        lead = _route_one(row, group, turns, now, owner)
        new.append(lead)
        batch_email[row.email_normalized] = lead

    _leads_write(new)
    assigned = [lead for lead in new if lead.kind == AuditEvent.Type.LEAD_ASSIGNED]
    rows_insert(
        Assignment,
        [
            {
                "lead_id": lead.values["id"],
                "rep_id": lead.values["owner_id"],
                "group_id": lead.values["group_id"],
                "attempt": 1,
                "reason": lead.reason,
                "started_at": now,
                "due_at": lead.values["sla_due_at"],
            }
            for lead in assigned
        ],
    )
    scheduling.batch_timer_schedule_on_commit(
        timers=[(lead.values["group_id"], lead.values["sla_due_at"]) for lead in assigned]
    )
    for turn in turns.values():
        if turn.assigned:
            turn.state.turns += turn.assigned
            turn.state.save(update_fields=["pointer", "current_weights", "turns", "updated_at"])

    events: list[Event] = []
    for lead in new:
        v = lead.values
        received = {
            "source": v["source"],
            "external_id": v["external_id"],
            "requested_group": v["requested_group"] or None,
            "client": None,
            "import": report.import_id,
            "line": lead.line,
        }
        events.append(Event(AuditEvent.Type.LEAD_RECEIVED, actor, v["id"], v["group_slug"], None, received))
        # Intake's explanation, and where it came from: an upload's events carry its request's
        # id, so its decisions are found by the import id only here.
        lead.explanation["import"] = report.import_id
        lead.explanation["line"] = lead.line
        events.append(Event(lead.kind, actor, v["id"], v["group_slug"], v["owner_id"], lead.explanation))
    for target, dup_slug, dup_owner, row, window in duplicates:
        target_id: int = target.values["id"] if isinstance(target, _NewLead) else target
        explanation: dict[str, Any] = {
            # As intake's: the row's resolution, whose group's window found the open lead.
            "rule": row.rule,
            "rules_tried": row.rules_tried,
            "dedup_group": row.group_slug,
            "duplicate_of": target_id,
            "dedup_days": window,
            "source": row.data.get("source") or "",
            "external_id": row.data.get("external_id") or "",
            "note": "same email has an open lead; no new rotation turn",
            "import": report.import_id,
            "line": row.line,
        }
        events.append(Event(AuditEvent.Type.LEAD_DUPLICATE, actor, target_id, dup_slug, dup_owner, explanation))
    # The request's id when one runs the import (the admin's upload page: its access line, its
    # log lines and its events share one id), else the import's; the import id is in each
    # event's explanation either way.
    request_id = request_id_var.get()
    audit_record_bulk(events=events, request_id=report.import_id if request_id == "-" else request_id)
    if notify_reps and assigned:
        outbox_add_many(
            messages=[
                {
                    "event": "lead.assigned",
                    "lead_id": lead.values["id"],
                    "group_id": lead.values["group_id"],
                    "rep_id": lead.values["owner_id"],
                    "payload": notify.lead_payload_values(
                        lead.values, lead.values["group_slug"], reason=lead.reason, attempt=1
                    ),
                    "created_at": now,
                }
                for lead in assigned
            ]
        )
    report.imported += len(new)
    report.assigned += len(assigned)
    report.queued += len(new) - len(assigned)
    report.duplicates += len(duplicates)
    # In /metrics as intake's leads, by the group each row resolved to, once the batch commits
    # (an attempt retried counts nothing).
    tally: dict[str | None, list[int]] = {}
    for lead in new:
        outcome = 0 if lead.kind == AuditEvent.Type.LEAD_ASSIGNED else 1  # routed, else queued
        tally.setdefault(lead.values["group_slug"] or None, [0, 0, 0])[outcome] += 1
    for *_, row, _window in duplicates:
        tally.setdefault(row.group_slug, [0, 0, 0])[2] += 1
    transaction.on_commit(lambda: _imported_counted(tally))


def _imported_counted(tally: dict[str | None, list[int]]) -> None:
    for slug, (routed, queued, duplicate) in tally.items():
        metrics.leads_imported(group=slug, routed=routed, queued=queued, duplicate=duplicate)


@dataclass
class _NewLead:
    """A lead to write, as plain column values (attnames), with its routing outcome."""

    line: int
    values: dict[str, Any]
    kind: str  # lead.assigned or lead.queued
    explanation: dict[str, Any]
    reason: str = Assignment.Reason.ROTATION  # or owner_match


def _leads_write(leads: list[_NewLead]) -> None:
    """Gives the leads their ids and writes them (COPY on PostgreSQL)."""
    if not leads:
        return
    if supports_copy():
        for lead, lead_id in zip(leads, ids_reserve(Lead, len(leads)), strict=True):
            lead.values["id"] = lead_id
        rows_insert(Lead, [lead.values for lead in leads])
        return
    objs = [Lead(**{k: v for k, v in lead.values.items() if k != "group_slug"}) for lead in leads]
    Lead.objects.bulk_create(objs)
    for lead, obj in zip(leads, objs, strict=True):
        lead.values["id"] = obj.id


def _route_one(
    row: _Row, group: Group | None, turns: dict[int, _GroupTurn], now: datetime, owner: ownership.OwnerHint | None
) -> _NewLead:
    """Routes one lead against its group's in-memory rotation (the lock is held)."""
    data = row.data
    values: dict[str, Any] = {
        "email": data["email"],
        "email_normalized": row.email_normalized,
        **{f: data.get(f) or "" for f in CONTACT_FIELDS if f != "email"},
        "country": data.get("country") or "",
        "region": data.get("region") or "",
        "source": data.get("source") or "",
        "product": data.get("product") or "",
        "score": data.get("score"),
        "company_size": data.get("company_size"),
        "external_id": data.get("external_id") or "",
        "attributes": data.get("attributes") or {},
        "raw_payload": row.raw,
        "requested_group": row.requested,
        "created_at": now,
        "group_id": group.id if group else None,
        "group_slug": group.slug if group else "",
        "owner_id": None,
        "assigned_at": None,
        "sla_due_at": None,
        "queue_reason": "",
    }
    explanation: dict[str, Any] = row.explanation()
    if group is None:
        values["queue_reason"] = "no rule matched and there is no default group"
    else:
        explanation.update({"group": group.slug, "strategy": group.strategy})
        turn = turns[group.id]
        if not group.active:
            values["queue_reason"] = f"group '{group.slug}' is inactive"
        else:
            state = turn.state
            # As intake: the account owner when eligible (rotation untouched), else the rotation.
            decision = ownership.owner_decide(
                owner=owner,
                group=group,
                strategy=group.strategy,
                pointer=state.pointer,
                current_weights=state.current_weights or {},
                facts=turn.facts,
                now=now,
            )
            explanation.update(decision.explanation())
            if decision.rep_id is None:
                values["queue_reason"] = routing.queue_reason(group, decision)
            else:
                due = routing.sla_due(group, now)
                values.update(status=LeadStatus.ASSIGNED, owner_id=decision.rep_id, assigned_at=now, sla_due_at=due)
                if decision.reason == Assignment.Reason.ROTATION:
                    # Move the rotation on in memory; written once at the end of the batch. An
                    # owner match leaves it where it is (as routing.advance does).
                    state.pointer = decision.pointer_after
                    state.current_weights = decision.weights_after
                    turn.assigned += 1
                i = turn.index[decision.rep_id]
                f = turn.facts[i]
                turn.facts[i] = dataclasses.replace(f, open=f.open + 1, assigned_today=f.assigned_today + 1)
                explanation.update(
                    {"reason": decision.reason, "attempt": 1, "sla_due_at": due.isoformat() if due else None}
                )
                return _NewLead(row.line, values, AuditEvent.Type.LEAD_ASSIGNED, explanation, decision.reason)
    values["status"] = LeadStatus.QUEUED
    explanation["queue_reason"] = values["queue_reason"]
    return _NewLead(row.line, values, AuditEvent.Type.LEAD_QUEUED, explanation)


def csv_text(binary: IO[bytes], encoding: str = "utf-8") -> Iterator[str]:
    """The lines of a CSV file opened in binary, as the csv module wants them: in `encoding`
    (UTF-8 by default, a BOM dropped), lines ending in \\n, \\r\\n or \\r alike, streamed. Bytes
    the encoding cannot read are kept as lone surrogates, so that their row, not the whole
    file, is refused with its line number (`_validate`)."""
    codec = codecs.lookup(encoding).name
    codec = "utf-8-sig" if codec == "utf-8" else codec
    text = io.TextIOWrapper(binary, encoding=codec, errors="surrogateescape", newline="")
    try:
        yield from text
    finally:
        if not binary.closed:
            text.detach()  # the caller closes its own file (else the wrapper would, when collected)
