"""Routing rules: validation and evaluation, pure functions over plain data.

A rule's conditions are a list of `{"field", "op", "value"}`; all must hold. Fields are the
lead's routing fields or `attributes.<key>`. Validation is strict so that a saved rule can
always be evaluated; evaluation never raises.
"""

import math
import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pycountry

from .domains import domain_unicode

LEAD_FIELDS = ("country", "region", "source", "product", "score", "company_size", "email_domain")
NUMERIC_FIELDS = frozenset({"score", "company_size"})
OPERATORS = ("equals", "in", "not_in", "contains", "gte", "lte", "exists")
MAX_CONDITIONS = 20
# What a lead can hold (the intake API validates the same): a rule value outside it could
# never match, so it is refused when the rule is saved.
COUNTRY_CODES = frozenset(c.alpha_2 for c in pycountry.countries)
MAX_ATTRIBUTE_KEY = 64
# A lead's numbers as intake takes them (SPEC: score 0-100; a size is never negative).
MAX_COMPANY_SIZE = 10_000_000
LEAD_NUMBER_RANGES: dict[str, tuple[int, int | None]] = {"score": (0, 100), "company_size": (0, MAX_COMPANY_SIZE)}
# What an email domain is written with: letters and their marks (of any script: an IDN),
# digits, dots and hyphens, and the brackets and colons of an address literal ([192.0.2.1]).
_DOMAIN_PUNCTUATION = frozenset(".-[]:")


def _in_a_domain(char: str) -> bool:
    """What an email domain intake takes may hold: letters, digits and its punctuation in
    ASCII; beyond ASCII, anything but spaces and controls (intake reads symbol domains, `i❤.ws`,
    as IDNA 2003 does)."""
    if char.isascii():
        return char.isalnum() or char in _DOMAIN_PUNCTUATION
    return unicodedata.category(char)[0] not in "ZC"


# Text fields intake trims (its serializer's CharFields): a rule value with spaces around equals none.
TRIMMED_FIELDS = frozenset({"region", "source", "product"})


class RuleError(ValueError):
    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


def _is_scalar(value: Any) -> bool:
    return isinstance(value, str | bool) or _is_number(value)


def _is_number(value: Any) -> bool:
    """A finite number (NaN and infinities cannot be stored as JSON, nor compared). Any int
    is one, however long: Python compares it with a float exactly, never converting it."""
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or (isinstance(value, float) and math.isfinite(value))


def validate_conditions(conditions: Any) -> list[dict[str, Any]]:
    """Returns the conditions normalised, or raises RuleError naming every problem."""
    if not isinstance(conditions, list):
        raise RuleError(["Conditions must be a list of {field, op, value} objects."])
    if len(conditions) > MAX_CONDITIONS:
        raise RuleError([f"At most {MAX_CONDITIONS} conditions."])
    errors: list[str] = []
    cleaned: list[dict[str, Any]] = []
    for i, cond in enumerate(conditions):
        where = f"Condition {i + 1}"
        if not isinstance(cond, dict):
            errors.append(f"{where}: must be an object.")
            continue
        unknown = set(cond) - {"field", "op", "value"}
        if unknown:
            errors.append(f"{where}: unknown keys {sorted(unknown)}.")
        field, op = cond.get("field"), cond.get("op")
        if not isinstance(field, str) or not (
            field in LEAD_FIELDS or (field.startswith("attributes.") and len(field) > len("attributes."))
        ):
            errors.append(f"{where}: field must be one of {', '.join(LEAD_FIELDS)} or attributes.<key>.")
            continue
        if "\x00" in field:
            errors.append(f"{where}: NUL characters are not allowed in a field name.")
            continue
        if op not in OPERATORS:
            errors.append(f"{where}: op must be one of {', '.join(OPERATORS)}.")
            continue
        value = cond.get("value")
        if op == "exists":
            if value is not None and not isinstance(value, bool):  # null, as no value: true
                errors.append(f"{where}: exists takes true or false (or no value).")
                continue
            value = True if value is None else value
        elif op in ("in", "not_in"):
            if not isinstance(value, list) or not value or not all(_is_scalar(v) for v in value):
                errors.append(f"{where}: {op} needs a non-empty list of strings or numbers.")
                continue
        elif op in ("gte", "lte"):
            if not _is_number(value):
                errors.append(f"{where}: {op} needs a number.")
                continue
            if field in LEAD_FIELDS and field not in NUMERIC_FIELDS:
                errors.append(f"{where}: {op} applies to score, company_size or attributes.")
                continue
        elif op == "contains":
            if not isinstance(value, str) or not value:
                errors.append(f"{where}: contains needs a non-empty string.")
                continue
        elif op == "equals" and not _is_scalar(value):
            errors.append(f"{where}: equals needs a string, number or boolean.")
            continue
        if any(isinstance(v, str) and "\x00" in v for v in (value if isinstance(value, list) else [value])):
            errors.append(f"{where}: NUL characters are not allowed in a value.")  # PostgreSQL's jsonb refuses them
            continue
        if problem := _never_matches(field, op, value):
            errors.append(f"{where}: {problem}")
            continue
        cleaned.append({"field": field, "op": op, "value": value})
    if errors:
        raise RuleError(errors)
    return cleaned


def _never_matches(field: str, op: str, value: Any) -> str | None:
    """Why a well-formed condition could still never hold for any lead (or None): a lead's
    empty field is an absent one, its region, source and product are trimmed, its country is an
    ISO code, its email domain is a domain name and never missing, its score (0-100) and size
    (0-10,000,000) are numbers, its attribute names are short."""
    if field.startswith("attributes.") and len(field) - len("attributes.") > MAX_ATTRIBUTE_KEY:
        return f"attribute names are at most {MAX_ATTRIBUTE_KEY} characters."
    values = value if op in ("in", "not_in") else [value] if op == "equals" else []
    if op in ("equals", "in") and "" in values:
        # An empty field is an absent one: it equals nothing, not even "".
        return f"an empty value never matches; to match a lead without {field}, use exists with false."
    if field in TRIMMED_FIELDS and op in ("equals", "in"):
        bad = [v for v in values if isinstance(v, str) and v != v.strip()]
        if bad:
            return f"a lead's {field} is trimmed when it comes in: {bad[0]!r} with spaces around it would never match."
    if field == "country":
        bad = [v for v in values if not isinstance(v, str) or not v.isascii() or v.upper() not in COUNTRY_CODES]
        if bad:
            return f"country values are ISO 3166 alpha-2 codes (FR, US, ...), not {bad[0]!r}."
    if field == "email_domain" and op == "exists" and value is False:
        return "every lead has an email domain (its address is required): exists with false would never match."
    if field == "email_domain":
        # The part after the @ of an address: "@acme.com" or a whole address never equals it.
        texts = [value] if op == "contains" else values
        bad = [v for v in texts if isinstance(v, str) and "@" in v]
        if bad:
            return f"email_domain is what follows the @ of an address (acme.com), not {bad[0]!r}."
        for v in texts:
            odd = next((c for c in v if not _in_a_domain(c)), None) if isinstance(v, str) else None
            if odd is not None:
                return f"email_domain is a domain name (acme.com): {v!r} holds {odd!r}, which no domain has."
    if field in NUMERIC_FIELDS:
        if op == "contains":
            return f"contains applies to text; {field} is a number (use gte or lte)."
        bad = [v for v in values if not _is_number(v)]
        if bad:
            return f"{field} is a number: {bad[0]!r} would never match."
        low, high = LEAD_NUMBER_RANGES[field]
        bad = [v for v in values if op != "not_in" and (v < low or (high is not None and v > high))]
        if (op == "gte" and high is not None and value > high) or (op == "lte" and value < low):
            bad = [value]
        if bad:
            span = f"from {low} to {high}" if high is not None else f"{low} or more"
            return f"a lead's {field} is {span}: {bad[0]!r} would never match."
    return None


def lead_facts(lead: Mapping[str, Any]) -> dict[str, Any]:
    """The routing fields of a lead (validated payload) as a flat mapping."""
    email = str(lead.get("email") or "")
    facts = {f: lead.get(f) for f in LEAD_FIELDS if f != "email_domain"}
    facts["email_domain"] = domain_unicode(email.rsplit("@", 1)[-1]) if "@" in email else None
    for key, value in (lead.get("attributes") or {}).items():
        facts[f"attributes.{key}"] = value
    return facts


def _fold(text: str) -> str:
    """Text without case, an accented letter read alike whether it is one character or a
    letter and a combining mark (NFC), as the keyboard, the form or the CRM wrote it."""
    if text.isascii():
        return text.casefold()
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", text).casefold())


def _norm(value: Any) -> Any:
    """For equals and (not_)in: text by `_fold`; a boolean never equal to a number (Python's
    True == 1 would make `seats equals 1` match `"seats": true`)."""
    if isinstance(value, str):
        return _fold(value)
    if isinstance(value, bool):
        return (bool, value)
    return value


_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")


def as_typed(text: str, like: Any) -> Any:
    """Text read as the rule's (or the lead's) type when it spells one: `"25"` as 25 beside a
    number, `"true"` as True beside a boolean; else the text itself. An attribute from a CSV
    import is always text, the same attribute posted as JSON is typed: both must match alike."""
    spelled = text.strip()
    if isinstance(like, bool):
        return {"true": True, "false": False}.get(spelled.casefold(), text)
    if _is_number(like) and _NUMBER_TEXT.fullmatch(spelled):
        try:
            if spelled.lstrip("+-").isdigit():
                return int(spelled)
            number = float(spelled)
        except ValueError:  # past Python's limit on the digits of an int read from text
            return text
        return number if math.isfinite(number) else text
    return text


def _typed_equal(have: Any, want: Any) -> bool:
    """Text against a number or a boolean, read as that type (`_norm` compared them already)."""
    if isinstance(have, str) and not isinstance(want, str):
        return _norm(as_typed(have, want)) == _norm(want)
    if isinstance(want, str) and not isinstance(have, str):
        return _norm(have) == _norm(as_typed(want, have))
    return False


def _among(have: Any, wants: list[Any]) -> bool:
    """(not_)in: by `_norm`, then text as the other side's type."""
    return _norm(have) in {_norm(v) for v in wants} or any(_typed_equal(have, v) for v in wants)


def condition_holds(cond: Mapping[str, Any], facts: Mapping[str, Any]) -> bool:
    field, op = cond["field"], cond["op"]
    want: Any = cond.get("value")
    if field == "email_domain":  # compared as `lead_facts` gives it, whichever spelling the rule has
        want = [domain_unicode(v) if isinstance(v, str) else v for v in want] if isinstance(want, list) else want
        want = domain_unicode(want) if isinstance(want, str) else want
    have: Any
    have = facts.get(field)
    present = have is not None and have != ""
    if op == "exists":
        return present is bool(want if want is not None else True)
    if not present:
        return op == "not_in"
    if field == "email_domain" and isinstance(have, str):
        # Both sides as `domain_unicode` gives them (lower case, NFC), compared as they are:
        # folding would make straße.example strasse.example, a domain of its own.
        if op == "equals":
            return have == want
        if op in ("in", "not_in"):
            return (have in want) is (op == "in")
        if op == "contains":
            return isinstance(want, str) and want in have
    if op == "equals":
        return _norm(have) == _norm(want) or _typed_equal(have, want)
    if op == "in":
        return _among(have, want)
    if op == "not_in":
        return not _among(have, want)
    if op == "contains":
        if _is_number(have):  # its digits, as the same attribute imported as text reads
            have = str(have)
        return isinstance(have, str) and _norm(want) in _norm(have)
    if op in ("gte", "lte"):
        if isinstance(have, bool):
            return False
        # An attribute sent as text ("12") is read as `equals` reads it: a number spelled in
        # digits, not whatever Python's float() takes ("inf", "1_000", "1e400").
        number = as_typed(have, want) if isinstance(have, str) else have
        if not _is_number(number):
            return False
        return number >= want if op == "gte" else number <= want
    return False


@dataclass(frozen=True)
class RuleSpec:
    id: int
    name: str
    priority: int
    conditions: Sequence[Mapping[str, Any]]
    group_slug: str


@dataclass(frozen=True)
class RuleMatch:
    rule: RuleSpec | None
    tried: list[str]
    # The matched rule's conditions as they were, each with the lead's value it held for: the
    # audit trail explains the decision on its own, after the rule is edited or deleted.
    matched_on: list[dict[str, Any]] = field(default_factory=list)


def match_rules(rules: Iterable[RuleSpec], facts: Mapping[str, Any]) -> RuleMatch:
    """First rule (by priority, then id) whose conditions all hold."""
    tried: list[str] = []
    for rule in sorted(rules, key=lambda r: (r.priority, r.id)):
        tried.append(rule.name)
        if all(condition_holds(c, facts) for c in rule.conditions):
            return RuleMatch(rule, tried, matched_on(rule, facts))
    return RuleMatch(None, tried)


def matched_on(rule: RuleSpec, facts: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`[{"field", "op", "value", "lead"}]`: each condition and what the lead had there."""
    return [
        {"field": c["field"], "op": c["op"], "value": c.get("value"), "lead": facts.get(c["field"])}
        for c in rule.conditions
    ]
