"""Routing rules: evaluation (table tests and properties), validation, the API and the admin."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from audit.models import AuditEvent
from rotation.models import RoutingRule
from rotation.rules import (
    LEAD_FIELDS,
    OPERATORS,
    RuleError,
    RuleSpec,
    condition_holds,
    lead_facts,
    match_rules,
    validate_conditions,
)
from tests.conftest import lead_body

LEAD = {
    "email": "Jane@Acme.Example",
    "country": "FR",
    "region": "Île-de-France",
    "source": "webinar",
    "product": "Analytics Pro",
    "score": 72,
    "company_size": 250,
    "attributes": {"plan": "enterprise", "seats": 40, "trial": True},
}


@pytest.mark.parametrize(
    ("field", "op", "value", "holds"),
    [
        ("country", "equals", "fr", True),  # case-insensitive
        ("country", "equals", "DE", False),
        ("country", "in", ["BE", "FR"], True),
        ("country", "in", ["BE", "DE"], False),
        ("country", "not_in", ["BE", "DE"], True),
        ("country", "not_in", ["FR"], False),
        ("region", "contains", "france", True),
        ("product", "contains", "pro", True),
        ("product", "contains", "basic", False),
        ("score", "gte", 72, True),
        ("score", "gte", 73, False),
        ("score", "lte", 72, True),
        ("company_size", "lte", 249, False),
        ("company_size", "gte", 100.5, True),
        ("email_domain", "equals", "acme.example", True),
        ("email_domain", "in", ["ACME.example", "other.example"], True),
        ("attributes.plan", "equals", "Enterprise", True),
        ("attributes.seats", "gte", 40, True),
        ("attributes.seats", "lte", 10, False),
        ("attributes.trial", "equals", True, True),
        ("attributes.missing", "exists", True, False),
        ("attributes.missing", "exists", False, True),
        ("attributes.missing", "not_in", ["x"], True),  # absent is "not in" anything
        ("attributes.missing", "equals", "x", False),
        ("attributes.plan", "gte", 3, False),  # not a number: never holds, never raises
        ("source", "exists", None, True),
    ],
)
def test_condition_table(field, op, value, holds):
    cond = {"field": field, "op": op} | ({} if value is None else {"value": value})
    (cleaned,) = validate_conditions([cond])
    assert condition_holds(cleaned, lead_facts(LEAD)) is holds


@pytest.mark.parametrize(
    ("conditions", "message"),
    [
        ("country=FR", "must be a list"),
        ([{"field": "colour", "op": "equals", "value": "red"}], "field must be one of"),
        ([{"field": "country", "op": "like", "value": "F%"}], "op must be one of"),
        ([{"field": "country", "op": "in", "value": "FR"}], "non-empty list"),
        ([{"field": "country", "op": "in", "value": []}], "non-empty list"),
        ([{"field": "country", "op": "gte", "value": 3}], "applies to score, company_size"),
        ([{"field": "score", "op": "gte", "value": "high"}], "needs a number"),
        ([{"field": "product", "op": "contains", "value": ""}], "non-empty string"),
        ([{"field": "country", "op": "equals", "value": ["FR"]}], "string, number or boolean"),
        ([{"field": "country", "op": "exists", "value": "yes"}], "true or false"),
        ([{"field": "attributes.", "op": "exists"}], "field must be one of"),
        (["country"], "must be an object"),
        ([{"field": "country", "op": "equals", "value": "FR", "x": 1}], "unknown keys"),
        # Well formed, but no lead could ever match: refused too.
        ([{"field": "country", "op": "equals", "value": "France"}], "ISO 3166 alpha-2 codes"),
        ([{"field": "country", "op": "in", "value": ["\u0131t"]}], "ISO 3166 alpha-2 codes"),
        ([{"field": "country", "op": "in", "value": ["FR", "Germany"]}], "not 'Germany'"),
        ([{"field": "country", "op": "not_in", "value": [5]}], "ISO 3166"),
        ([{"field": "score", "op": "equals", "value": "high"}], "score is a number"),
        ([{"field": "company_size", "op": "in", "value": [10, "50"]}], "company_size is a number"),
        ([{"field": "score", "op": "contains", "value": "5"}], "contains applies to text"),
        ([{"field": "attributes." + "k" * 65, "op": "exists"}], "at most 64 characters"),
        # The domain is what follows the @: an "@acme.com" or a whole address never equals it.
        ([{"field": "email_domain", "op": "equals", "value": "@acme.example"}], "follows the @"),
        ([{"field": "email_domain", "op": "in", "value": ["acme.example", "jo@acme.example"]}], "follows the @"),
        ([{"field": "email_domain", "op": "contains", "value": "@acme"}], "follows the @"),
        # Every lead has an email address, so an email domain: it never lacks one.
        ([{"field": "email_domain", "op": "exists", "value": False}], "every lead has an email domain"),
        # An empty field is absent: it equals nothing, not even "" (exists false finds it).
        ([{"field": "region", "op": "equals", "value": ""}], "use exists with false"),
        ([{"field": "attributes.plan", "op": "in", "value": ["pro", ""]}], "empty value never matches"),
        # Intake trims a lead's region, source and product: a value with spaces around never equals one.
        ([{"field": "source", "op": "equals", "value": "webinar "}], "'webinar ' with spaces around it"),
        ([{"field": "region", "op": "in", "value": ["Bayern", "\u00a0Tirol"]}], "with spaces around it"),
        # A lead's score is 0-100 and its company size never negative.
        ([{"field": "score", "op": "gte", "value": 101}], "score is from 0 to 100"),
        ([{"field": "score", "op": "lte", "value": -1}], "score is from 0 to 100"),
        ([{"field": "score", "op": "in", "value": [50, 150]}], "150 would never match"),
        ([{"field": "company_size", "op": "equals", "value": -5}], "company_size is from 0 to 10000000"),
        ([{"field": "company_size", "op": "lte", "value": -0.5}], "company_size is from 0 to 10000000"),
        # Intake takes a company size up to 10,000,000: a rule for more would never match.
        ([{"field": "company_size", "op": "gte", "value": 10**9}], "company_size is from 0 to 10000000"),
        ([{"field": "company_size", "op": "in", "value": [50, 99999999999999999999]}], "would never match"),
        # An email domain is letters, digits, dots and hyphens: a space or a "!" is in none.
        ([{"field": "email_domain", "op": "equals", "value": "not a domain!"}], "holds ' ', which no domain has"),
        ([{"field": "email_domain", "op": "equals", "value": "acme!.com"}], "holds '!', which no domain has"),
        ([{"field": "email_domain", "op": "equals", "value": "acme\u00a0.com"}], "which no domain has"),
        ([{"field": "email_domain", "op": "in", "value": ["acme.example", "acme,example"]}], "holds ','"),
        ([{"field": "email_domain", "op": "contains", "value": "acme/"}], "holds '/'"),
        # PostgreSQL's jsonb cannot store NUL: refused here rather than failing on save.
        ([{"field": "region", "op": "equals", "value": "a\x00b"}], "NUL characters"),
        ([{"field": "region", "op": "in", "value": ["x", "\x00"]}], "NUL characters"),
        ([{"field": "attributes.a\x00b", "op": "exists"}], "NUL characters"),
    ],
)
def test_validation_names_the_problem(conditions, message):
    with pytest.raises(RuleError) as exc:
        validate_conditions(conditions)
    assert message in str(exc.value)


@pytest.mark.parametrize(
    "condition",
    [
        {"field": "country", "op": "in", "value": ["fr", "DE"]},  # codes in any case
        {"field": "score", "op": "equals", "value": 50},
        {"field": "score", "op": "in", "value": [50, 60.5]},
        {"field": "attributes." + "k" * 64, "op": "equals", "value": "x"},
        {"field": "region", "op": "equals", "value": "Île-de-France"},
        {"field": "email_domain", "op": "in", "value": ["acme.example", "bücher.example"]},
        {"field": "email_domain", "op": "contains", "value": ".example"},
        {"field": "email_domain", "op": "exists"},  # holds for every lead, harmless
        {"field": "score", "op": "gte", "value": 100},
        {"field": "score", "op": "lte", "value": 0},
        {"field": "score", "op": "not_in", "value": [0, 200]},  # out of range: holds, harmless
        {"field": "region", "op": "not_in", "value": [""]},  # holds for every lead, harmless
        {"field": "product", "op": "contains", "value": " pro"},  # a word inside: "Analytics pro"
        {"field": "source", "op": "not_in", "value": ["ads "]},  # holds for every lead, harmless
        {"field": "attributes.plan", "op": "equals", "value": " gold"},  # attributes are kept as sent
        {"field": "company_size", "op": "gte", "value": 10**7},
        {"field": "company_size", "op": "not_in", "value": [10**9]},  # out of range: holds, harmless
        {"field": "email_domain", "op": "equals", "value": "[192.0.2.1]"},  # an address literal
        {"field": "email_domain", "op": "contains", "value": "xn--bcher-kva"},
        {"field": "email_domain", "op": "equals", "value": "i\u2764.ws"},  # a symbol domain intake takes
    ],
)
def test_values_a_lead_can_hold_are_accepted(condition):
    assert validate_conditions([condition])


def test_exists_with_null_is_exists_with_no_value():
    """JSON clients write "no value" as null: exists, true."""
    assert validate_conditions([{"field": "region", "op": "exists", "value": None}]) == [
        {"field": "region", "op": "exists", "value": True}
    ]
    with pytest.raises(RuleError, match="exists takes true or false"):
        validate_conditions([{"field": "region", "op": "exists", "value": "yes"}])


HUGE = int("9" * 400)  # past what a float holds


@pytest.mark.parametrize(
    ("op", "want", "have", "holds"),
    [
        ("gte", HUGE, 40, False),
        ("lte", HUGE, 40, True),
        ("gte", 10, HUGE, True),
        ("lte", 10, HUGE, False),
        ("gte", 10, str(HUGE), True),  # text past a float's range reads as infinity
        ("gte", -HUGE, -(10**20), True),
        ("gte", 10, "12", True),
        ("gte", 10, "nan", False),
    ],
    ids=["rule-huge-gte", "rule-huge-lte", "lead-huge-gte", "lead-huge-lte", "text-huge", "negative", "text", "nan"],
)
def test_numbers_past_a_floats_range_compare_and_never_raise(op, want, have, holds):
    (cleaned,) = validate_conditions([{"field": "attributes.seats", "op": op, "value": want}])
    assert condition_holds(cleaned, {"attributes.seats": have}) is holds


@pytest.mark.parametrize(
    ("op", "want", "have", "holds"),
    [
        ("equals", 1, True, False),
        ("equals", 0, False, False),
        ("equals", True, 1, False),
        ("equals", True, True, True),
        ("equals", 1, 1.0, True),
        ("in", [0, 2], False, False),
        ("in", [True], True, True),
        ("not_in", [1], True, True),
        ("not_in", [False], False, False),
    ],
)
def test_a_boolean_is_not_the_number_one_or_zero(op, want, have, holds):
    (cleaned,) = validate_conditions([{"field": "attributes.seats", "op": op, "value": want}])
    assert condition_holds(cleaned, {"attributes.seats": have}) is holds


@pytest.mark.parametrize(
    ("op", "want", "have", "holds"),
    [
        ("equals", 25, "25", True),
        ("equals", 25, " 25 ", True),
        ("equals", 0.5, "0.5", True),
        ("equals", 25, "25.0", True),
        ("equals", 25, "26", False),
        ("equals", 25, "25 seats", False),
        ("equals", "25", 25, True),
        ("equals", True, "true", True),
        ("equals", True, "TRUE", True),
        ("equals", False, "true", False),
        ("equals", True, "1", False),
        ("equals", 1, "true", False),
        ("in", [25, 50], "50", True),
        ("in", [True], "false", False),
        ("not_in", [25], "25", False),
        ("not_in", [25], "nan", True),
        ("equals", HUGE, str(HUGE), True),
        ("equals", 5, "5" * 5000, False),
        ("contains", "750", 75001, True),  # a postcode posted as a number, as imported text
        ("contains", "750", "75001", True),
        ("contains", "751", 75001, False),
        ("contains", "tru", True, False),  # a boolean is not text
        # gte/lte read text as equals does: a number spelled in digits, nothing float() also takes.
        ("gte", 100, "150", True),
        ("gte", 100, " 1.5e2 ", True),
        ("lte", 100, "99.5", True),
        ("gte", 100, "50", False),
        ("gte", 100, "inf", False),
        ("gte", 100, "Infinity", False),
        ("lte", 100, "-inf", False),
        ("gte", 100, "1e400", False),
        ("gte", 100, "1_000", False),
        ("gte", 100, "nan", False),
        ("gte", 100, "150 seats", False),
    ],
)
def test_text_matches_a_number_or_a_boolean_it_spells(op, want, have, holds):
    # An attribute imported from a CSV cell is text; posted as JSON it is typed.
    (cleaned,) = validate_conditions([{"field": "attributes.seats", "op": op, "value": want}])
    assert condition_holds(cleaned, {"attributes.seats": have}) is holds


@pytest.mark.parametrize(
    ("field", "op", "want", "have", "holds"),
    [
        ("region", "equals", "Île-de-France", "I\u0302le-de-France", True),  # composed rule, decomposed lead
        ("region", "equals", "I\u0302LE-DE-FRANCE", "Île-de-France", True),
        ("region", "in", ["Zürich", "Bern"], "Zu\u0308rich", True),
        ("region", "not_in", ["Zu\u0308rich"], "Zürich", False),
        ("product", "contains", "é", "Cafe\u0301 Pro", True),
        ("product", "contains", "e", "Café Pro", False),  # an é is not an e
        ("attributes.city", "equals", "São Paulo", "Sa\u0303o Paulo", True),
        ("email_domain", "equals", "bu\u0308cher.example", "jo@xn--bcher-kva.example", True),
    ],
)
def test_text_compares_whichever_way_unicode_spells_an_accent(field, op, want, have, holds):
    """A letter with an accent is one character or two (a letter and a combining mark), as the
    keyboard, the form or the CRM wrote it: both read alike, so both match alike."""
    (cleaned,) = validate_conditions([{"field": field, "op": op, "value": want}])
    if field == "email_domain":
        lead = {"email": have}
    elif field.startswith("attributes."):
        lead = {"attributes": {field.removeprefix("attributes."): have}}
    else:
        lead = {field: have}
    assert condition_holds(cleaned, lead_facts(lead)) is holds


def test_first_match_by_priority_and_tried_list():
    rules = [
        RuleSpec(3, "emea", 30, [{"field": "country", "op": "in", "value": ["FR"]}], "emea"),
        RuleSpec(1, "enterprise", 10, [{"field": "company_size", "op": "gte", "value": 1000}], "ent"),
        RuleSpec(2, "webinar", 20, [{"field": "source", "op": "equals", "value": "webinar"}], "events"),
        RuleSpec(4, "also-webinar", 20, [{"field": "source", "op": "equals", "value": "webinar"}], "other"),
    ]
    match = match_rules(rules, lead_facts(LEAD))
    assert match.rule is not None and match.rule.name == "webinar"
    assert match.tried == ["enterprise", "webinar"]
    none = match_rules(rules, lead_facts({"email": "x@y.example"}))
    assert none.rule is None and none.tried == ["enterprise", "webinar", "also-webinar", "emea"]


SCALARS = st.one_of(
    st.text(max_size=8), st.integers(-1000, 1000), st.floats(allow_nan=False, allow_infinity=False), st.booleans()
)
ANY_JSON = st.recursive(
    st.none() | SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner)
)
FIELDS = st.sampled_from([*LEAD_FIELDS, "attributes.plan", "attributes.seats", "email", "attributes", ""])


@settings(max_examples=500, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries({"field": FIELDS, "op": st.sampled_from([*OPERATORS, "like"]), "value": ANY_JSON}),
        max_size=4,
    ),
    st.fixed_dictionaries(
        {},
        optional={
            "email": st.emails(),
            "country": st.text(max_size=3),
            "score": st.none() | st.integers(0, 100),
            "company_size": st.none() | st.integers(0, 10**6),
            "attributes": st.dictionaries(st.sampled_from(["plan", "seats"]), SCALARS, max_size=2),
        },
    ),
)
def test_a_rule_that_validates_always_evaluates(conditions, lead):
    """Validation either rejects a rule with a message, or the rule evaluates on any lead
    without raising."""
    try:
        cleaned = validate_conditions(conditions)
    except RuleError as exc:
        assert exc.messages
        return
    facts = lead_facts(lead)
    for cond in cleaned:
        assert condition_holds(cond, facts) in (True, False)
    match_rules([RuleSpec(1, "r", 1, cleaned, "g")], facts)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.booleans()), min_size=1, max_size=6))
def test_first_match_is_the_lowest_priority_that_holds(spec):
    always = [{"field": "email_domain", "op": "exists"}]
    never = [{"field": "email_domain", "op": "exists", "value": False}]
    rules = [RuleSpec(i, f"r{i}", prio, always if ok else never, "g") for i, (prio, ok) in enumerate(spec)]
    match = match_rules(rules, lead_facts({"email": "a@b.example"}))
    holding = sorted((r.priority, r.id) for r in rules if r.conditions is always)
    if holding:
        assert match.rule is not None and (match.rule.priority, match.rule.id) == holding[0]
    else:
        assert match.rule is None


# --- API ---------------------------------------------------------------------------------------

RULE = {
    "name": "France",
    "priority": 10,
    "conditions": [{"field": "country", "op": "in", "value": ["FR", "BE"]}],
    "group": "emea",
    "active": True,
}


@pytest.mark.django_db
def test_rule_crud_is_audited(api, make_group):
    make_group(1, slug="emea")
    make_group(1, slug="other")
    r = api.post("/api/v1/rules/", RULE, format="json")
    assert r.status_code == 201, r.content
    rule = r.json()
    assert rule == {**RULE, "id": rule["id"]}
    assert api.get("/api/v1/rules/").json()["results"] == [rule]
    r = api.patch(f"/api/v1/rules/{rule['id']}/", {"group": "other", "priority": 5}, format="json")
    assert r.status_code == 200 and r.json()["group"] == "other" and r.json()["priority"] == 5
    assert api.get(f"/api/v1/rules/{rule['id']}/").json()["group"] == "other"
    assert api.delete(f"/api/v1/rules/{rule['id']}/").status_code == 204
    assert api.get(f"/api/v1/rules/{rule['id']}/").status_code == 404
    events = AuditEvent.objects.filter(type="rule.changed").order_by("id")
    # The move shows in the trail of the group the rule left and of the one it joined.
    assert [(e.explanation["action"], e.group) for e in events] == [
        ("created", "emea"),
        ("changed", "other"),
        ("changed", "emea"),
        ("deleted", "other"),
    ]


@pytest.mark.django_db
def test_a_rule_saved_before_a_check_refused_its_conditions_can_still_be_edited(api, make_group):
    """A rule for a company size over 10,000,000 was taken before intake's limit was its limit:
    switching it off, its only useful edit, was a 400 on conditions nobody changed."""
    group, _ = make_group(1, slug="emea")
    never = [{"field": "company_size", "op": "gte", "value": 10**9}]
    rule = RoutingRule.objects.create(name="Giants", priority=1, conditions=never, group=group)
    r = api.patch(f"/api/v1/rules/{rule.id}/", {"active": False, "name": "Giants (off)"}, format="json")
    assert r.status_code == 200, r.content
    rule.refresh_from_db()
    assert (rule.active, rule.name, rule.conditions) == (False, "Giants (off)", never)
    # Given again, or with another error beside, they are checked as any conditions are.
    r = api.patch(f"/api/v1/rules/{rule.id}/", {"conditions": never}, format="json")
    assert r.status_code == 400 and "conditions" in r.json()
    r = api.patch(f"/api/v1/rules/{rule.id}/", {"priority": -1}, format="json")
    assert r.status_code == 400 and list(r.json()) == ["priority"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("patch", "field", "message"),
    [
        ({"conditions": [{"field": "colour", "op": "equals", "value": "x"}]}, "conditions", "field must be one of"),
        ({"conditions": [{"field": "score", "op": "gte", "value": "lots"}]}, "conditions", "needs a number"),
        ({"conditions": "country=FR"}, "conditions", "must be a list"),
        (
            {"conditions": [{"field": "email_domain", "op": "equals", "value": "@acme.example"}]},
            "conditions",
            "follows the @",
        ),
        ({"conditions": [{"field": "score", "op": "gte", "value": 120}]}, "conditions", "score is from 0 to 100"),
        ({"group": "nowhere"}, "group", "No group with slug 'nowhere'."),
        ({"priority": -1}, "priority", "greater than or equal"),
        ({"colour": "red"}, "colour", "Unknown field"),
    ],
)
def test_bad_rule_is_400_naming_the_problem(api, make_group, patch, field, message):
    make_group(1, slug="emea")
    r = api.post("/api/v1/rules/", {**RULE, **patch}, format="json")
    assert r.status_code == 400, r.content
    assert message in json.dumps(r.json()[field])
    assert not RoutingRule.objects.exists()
    assert not AuditEvent.objects.filter(type="rule.changed").exists()


@pytest.mark.django_db
def test_a_rule_without_conditions_is_named_with_the_other_bad_fields(api, make_group):
    """The model refuses an empty list ("cannot be blank"), but only when the service saves,
    once every field is valid: with a bad priority too, the 400 named the priority alone."""
    make_group(1, slug="emea")
    r = api.post("/api/v1/rules/", {**RULE, "conditions": [], "priority": -1}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"conditions", "priority"}, r.content
    assert "at least one condition" in r.json()["conditions"][0]
    rule = api.post("/api/v1/rules/", RULE, format="json").json()
    r = api.patch(f"/api/v1/rules/{rule['id']}/", {"conditions": [], "group": "nowhere"}, format="json")
    assert r.status_code == 400 and set(r.json()) == {"conditions", "group"}, r.content
    assert RoutingRule.objects.get().conditions == RULE["conditions"]


@pytest.mark.django_db
def test_huge_numbers_in_rules_and_leads_are_not_a_500(api, make_group):
    make_group(1, slug="emea")
    r = api.post(
        "/api/v1/rules/",
        {**RULE, "conditions": [{"field": "attributes.seats", "op": "gte", "value": HUGE}]},
        format="json",
    )
    assert r.status_code == 201, r.content
    assert RoutingRule.objects.get().conditions[0]["value"] == HUGE
    small = api.post("/api/v1/leads/", lead_body(attributes={"seats": 10**30}), format="json")
    assert small.status_code == 201 and small.json()["status"] == "queued"  # no rule matched, no default
    big = api.post("/api/v1/routing/simulate/", lead_body(attributes={"seats": HUGE * 10}), format="json")
    assert big.status_code == 200 and big.json()["group"] == "emea"


@pytest.mark.django_db
def test_nul_in_a_rule_is_400_not_500(api, make_group):
    make_group(1, slug="emea")
    for cond in (
        {"field": "region", "op": "equals", "value": "a\x00b"},
        {"field": "attributes.a\x00b", "op": "exists"},
        {"field": "source", "op": "in", "value": ["\x00"]},
    ):
        r = api.post("/api/v1/rules/", {**RULE, "conditions": [cond]}, format="json")
        assert r.status_code == 400 and "NUL" in json.dumps(r.json()["conditions"]), r.content
    assert not RoutingRule.objects.exists()


@pytest.mark.django_db
def test_rule_needs_manage_scope_and_unique_name(api, api_with, make_group):
    make_group(1, slug="emea")
    assert api_with(["intake", "read"]).get("/api/v1/rules/").status_code == 403
    assert api.post("/api/v1/rules/", RULE, format="json").status_code == 201
    r = api.post("/api/v1/rules/", RULE, format="json")
    assert r.status_code == 400 and "name" in r.json()


@pytest.mark.django_db
def test_a_rule_for_a_symbol_domain_routes_the_leads_intake_takes_from_it(api, make_group):
    make_group(1, slug="emea")
    condition = {"field": "email_domain", "op": "equals", "value": "i\u2764.ws"}
    r = api.post("/api/v1/rules/", {**RULE, "conditions": [condition]}, format="json")
    assert r.status_code == 201, r.content
    lead = api.post("/api/v1/leads/", lead_body(email="jo@i\u2764.ws"), format="json")
    assert lead.status_code == 201, lead.content
    assert lead.json()["group"] == "emea"


@pytest.mark.django_db
def test_rules_route_leads_and_explain(api, make_group):
    emea, emea_reps = make_group(2, slug="emea")
    make_group(1, slug="default-pool", is_default=True)
    own, own_reps = make_group(1, slug="own")
    api.post("/api/v1/rules/", RULE, format="json")
    api.post(
        "/api/v1/rules/",
        {**RULE, "name": "Big", "priority": 5, "conditions": [{"field": "company_size", "op": "gte", "value": 1000}]},
        format="json",
    )
    matched = api.post("/api/v1/leads/", lead_body(country="FR"), format="json").json()
    assert matched["group"] == "emea"
    ex = AuditEvent.objects.get(lead_id=matched["id"], type="lead.assigned").explanation
    assert ex["rule"] == "France" and ex["rules_tried"] == ["Big", "France"] and ex["group_source"] == "rule"
    requested = api.post("/api/v1/leads/", lead_body(country="US", group="own"), format="json").json()
    assert requested["group"] == "own"
    assert AuditEvent.objects.get(lead_id=requested["id"], type="lead.assigned").explanation["group_source"] == (
        "requested"
    )
    fallback = api.post("/api/v1/leads/", lead_body(country="US"), format="json").json()
    assert fallback["group"] == "default-pool"


@pytest.mark.django_db
def test_no_rule_no_default_queues_with_reason(api):
    body = api.post("/api/v1/leads/", lead_body(country="US"), format="json").json()
    assert body["status"] == "queued" and "no rule matched" in body["queue_reason"]


# --- admin -------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_admin_refuses_a_rule_that_cannot_be_evaluated(client, django_user_model, make_group):
    group, _ = make_group(1, slug="emea")
    admin = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(admin)
    form = {"name": "Bad", "priority": "10", "group": str(group.pk), "active": "on"}
    bad = json.dumps([{"field": "colour", "op": "equals", "value": "red"}])
    r = client.post("/admin/rotation/routingrule/add/", {**form, "conditions": bad})
    assert r.status_code == 200  # the form again, with the error
    assert "field must be one of" in r.content.decode()
    assert not RoutingRule.objects.exists()
    good = json.dumps([{"field": "country", "op": "in", "value": ["FR"]}])
    r = client.post("/admin/rotation/routingrule/add/", {**form, "conditions": good})
    assert r.status_code == 302
    rule = RoutingRule.objects.get()
    assert rule.conditions == [{"field": "country", "op": "in", "value": ["FR"]}]
    assert AuditEvent.objects.get(type="rule.changed").actor == "admin:ops"
