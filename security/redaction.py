"""A logging filter that redacts contact data and secrets: the safety net under the rule that
no code logs an email, a phone number, a name, a token or a signature in the first place."""

from __future__ import annotations

import logging
import re
from typing import Any
from urllib.parse import unquote

from django.http import HttpRequest

REDACTED = "[redacted]"

_PATTERNS = [
    # Bearer tokens and API tokens (ours start with lr_), intake secrets (whsec_).
    re.compile(r"(?i)\bbearer\s+\S+"),
    re.compile(r"\b(?:lr|whsec)_[A-Za-z0-9_\-]{8,}"),
    # X-Signature values and any long hex digest (HMACs, token hashes).
    re.compile(r"\bt=\d+,\s*v1=[0-9a-fA-F]+"),
    re.compile(r"\bv1=[0-9a-fA-F]{16,}"),
    re.compile(r"\b[0-9a-fA-F]{32,}\b"),
    # The signed token of a rep's accept link (leads/accept_link.py): it opens the lead.
    re.compile(r"(?<=/leads/accept/)[^/\s\"']+"),
    # Email addresses, in every spelling that reaches a log line: a non-ASCII local part or
    # domain (the API accepts IDN domains), as Django escapes it ("Not Found: /a@ex\xe4mple.com/"),
    # or percent-encoded (%40 for the @, %C3%A4 for a letter). A match starts only where a
    # run of address characters starts: tried at every character of a long run instead, a
    # line with no address in it (x.x.x. ... @) took time quadratic in its length.
    re.compile(
        r"(?<![\w.!#$%&'*+/=?^`{|}~\-])(?!(?<=\\)[xu][0-9a-fA-F]{2})"
        r"(?:[\w.!#$%&'*+/=?^`{|}~\-]|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4})+(?:@|%40)"
        r"(?:[\w\-]|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|%[0-9a-fA-F]{2})+"
        r"(?:\.(?:[\w\-]|\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|%[0-9a-fA-F]{2})+)+"
    ),
    # The two addresses without a dotted domain that the API accepts (Django's email rule):
    # at localhost and at an address literal (jane@[192.0.2.1], jane@[IPv6:2001:db8::1]).
    re.compile(
        r"(?<![\w.!#$%&'*+/=?^`{|}~\-])[\w.!#$%&'*+/=?^`{|}~\-]+(?:@|%40)"
        r"(?:localhost\b|(?:\[|%5[Bb])[\w:.]+(?:\]|%5[Dd]))"
    ),
]
# Phone numbers in their usual shapes (not dates, times or ids): international (+...),
# national with a leading 0 (01 23 45 67 89), North American ((555) 123-4567, 555-123-4567).
_PHONE_PATTERNS = [
    re.compile(r"\+\d[\d\s().\-]{5,}\d"),
    re.compile(r"\b0\d(?:[\s.\-]?\d{2}){4}\b"),
    re.compile(r"\(\d{3}\)\s*\d{3}[\s.\-]?\d{4}\b"),
    re.compile(r"\b\d{3}[\s.\-]\d{3}[\s.\-]\d{4}\b"),
]
_PATTERNS += _PHONE_PATTERNS

# The query parameters the product's own API and admin pages take for filters, paging and
# ordering (an admin filter's lookups too, `owner__id__exact`: the name before `__`). In a URL
# a log line carries (gunicorn's request line and Referer, runserver's, a login redirect's
# `next`, where the query is percent-encoded once more), every other parameter's value goes,
# whatever its shape: one named for contact data (`email`, `phone`, the admin's search `q`),
# or any name a client chose (`surname`, `contact`, `search`), since national phone formats
# (020 7946 0958) and names match none of the patterns above.
_SAFE_PARAMS = frozenset(
    [
        "page",
        "page_size",
        "p",
        "o",
        "e",
        "all",
        "_popup",
        "_to_field",
        "_facets",
        "next",
        "status",
        "group",
        "owner",
        "active",
        "is_default",
        "since",
        "until",
        "created_after",
        "created_at",
        "at",
        "type",
        "strategy",
        "source",
        "channel",
        "event",
        "message",
        "lead",
        "rep",
        "outcome",
        "reason",
    ]
)
# A value ends at the next parameter, plain or percent-encoded (%26 &, %3F ?): a `next`
# keeps its path while the search inside it goes. A name may be percent-encoded itself
# (`first%20name`, `contact%5Bphone%5D`), up to its `=` (or `%3D`).
_QUERY_PARAM = re.compile(
    r"(?i)(?:(?<=[?&;])|(?<=%3f)|(?<=%26))((?:(?!%3d|%26|%3f)[\w.\-\[\]%]){1,64})(=|%3d)((?:(?!%26|%3f)[^&;\s\"'<>])+)"
)


def _query_value(match: re.Match[str]) -> str:
    name = match.group(1).lower().split("__", 1)[0]
    if name in _SAFE_PARAMS:
        return match.group(0)
    return f"{match.group(1)}{match.group(2)}{REDACTED}"


# PostgreSQL writes the values of the row at fault into a constraint error's DETAIL: every
# column of a lead (names, company, phone in any shape, the raw payload) for a check or
# not-null violation ("Failing row contains (...)"), the key's values for a unique violation
# ("Key (col)=(...) already exists"); the text it could not read as a number or a date; and
# a quote of the statement, its values inlined (psycopg binds them on the client), under
# "LINE n:". The error reaches a log line in a traceback, in django.request's record of a 500
# and in a Celery task's failure or retry message (as its repr: one line, its newlines
# written \n). The values go, to the end of the line; the constraint and the columns stay.
_TO_LINE_END = r".*?(?=\\n|$)"
# Each pattern matches wherever it starts (to the end of the line when its end is missing):
# a line a client can shape ("Key (" 10,000 times) is scanned once, not once per start.
_DATABASE_VALUES = [
    (re.compile(r"(Failing row contains )\(.*?(?:\)(?=\.?(?:\\n|$))|$)", re.MULTILINE), rf"\1({REDACTED})"),
    (
        # A foreign key's id ("Key (owner_id)=(12) is not present in table") is no contact data.
        re.compile(
            r"(\b[Kk]ey \((?:[^()]|\([^()]*\))*\)=)(?!\(\d+\) is not present)"
            r"\(.*?(?:\)(?= already exists| conflicts with| is not present|\.?(?:\\n|$))|$)",
            re.MULTILINE,
        ),
        rf"\1({REDACTED})",
    ),
    (
        re.compile(rf"(invalid input (?:syntax|value) for [^:\n]{{1,64}}: ){_TO_LINE_END}", re.MULTILINE),
        rf"\1{REDACTED}",
    ),
    (re.compile(rf"(LINE \d+: ){_TO_LINE_END}", re.MULTILINE), rf"\1{REDACTED}"),
]

# A run of characters a URL (a request line, a query string) keeps together.
_URL_TOKEN = re.compile(r"[^\s\"'<>]+")
# Not a time zone's offset (+00:00): read as a space, a time whose seconds start with 0
# (08:13:07.123456+00:00, Celery's eta on every retry) lost them to the national pattern.
_PLUS_BETWEEN_DIGITS = re.compile(r"(?<=\d)\+(?=\d)(?!\d\d:\d\d)")


def _url_phones(match: re.Match[str]) -> str:
    """A phone number as a query string spells it (%2B33%206..., +33+6+12..., as gunicorn's
    request line and runserver's log it): the token is decoded, and redacted if it holds one."""
    token = match.group(0)
    if "%" not in token and "+" not in token:
        return token
    decoded = _PLUS_BETWEEN_DIGITS.sub(" ", unquote(token))  # a "+" inside a number: a space
    cleaned = decoded
    for pattern in _PHONE_PATTERNS:
        cleaned = pattern.sub(REDACTED, cleaned)
    return cleaned if cleaned != decoded else token


def redact(text: str) -> str:
    for pattern, replacement in _DATABASE_VALUES:
        text = pattern.sub(replacement, text)
    text = _QUERY_PARAM.sub(_query_value, text)
    for pattern in _PATTERNS:
        text = pattern.sub(REDACTED, text)
    return _URL_TOKEN.sub(_url_phones, text)


class RedactingFilter(logging.Filter):
    """Renders the message (and any traceback) and replaces what looks like contact data or a
    secret. Attached to the log handlers in settings, so it covers every logger."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: keep the record as it is
            return True
        cleaned = redact(message)
        if cleaned != message or record.args:
            record.msg, record.args = cleaned, None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        for key, value in list(record.__dict__.items()):
            # Fields passed with `extra=` (structured logs) get the same treatment, whatever
            # their type: Django's own records carry the request object.
            if key not in _RECORD_ATTRS:
                setattr(record, key, _redacted(value))
        return True


def _redacted(value: Any) -> Any:
    if isinstance(value, str):
        return redact(value)
    if value is None or isinstance(value, bool | int | float):
        return value
    if isinstance(value, dict):
        return {k: _redacted(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_redacted(v) for v in value]
    if isinstance(value, HttpRequest):
        # Its method and path: never the query string, which may hold anything a client sent.
        return redact(f"{value.method} {value.path}")
    return redact(str(value))


_RECORD_ATTRS = frozenset(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "request_id", "taskName"}
