import re
from collections.abc import Collection
from datetime import UTC
from decimal import Decimal
from zoneinfo import available_timezones

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.db.models import Q
from django.db.models.functions import Lower
from django.utils.timezone import localtime

from .domains import domain_unicode


def is_timezone(value: str) -> bool:
    return value in _TIMEZONES


def validate_timezone(value: str) -> None:
    if not is_timezone(value):
        raise ValidationError(f"'{value}' is not a known IANA time zone.")


# Control characters (line breaks, tabs, escapes) and the invisible characters that reorder or
# hide text (bidirectional overrides and isolates, the zero-width space): a name sales ops read
# in the admin, the audit trail and e-mails is one line of what it says. The marks a name's
# script needs stay: left-to-right and right-to-left marks (U+200E, U+200F), and the zero-width
# non-joiner and joiner of Persian words and emoji (U+200C, U+200D).
_NOT_IN_A_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b\u2028-\u202e\u2060-\u2069\ufeff]")


def validate_one_line(value: str) -> None:
    """A name or a short reason: one line, with no hidden characters."""
    found = _NOT_IN_A_NAME.search(value)
    if found:
        raise ValidationError(
            f"Control characters, line breaks and invisible characters that reorder or hide text are not allowed "
            f"(U+{ord(found.group()):04X} at character {found.start() + 1})."
        )


# `localtime` sits beside the zones on many systems (a link to the machine's own clock): no
# IANA name, and a group or rep on it would follow whichever server reads it.
_TIMEZONES = frozenset(available_timezones()) - {"localtime"}


class Strategy(models.TextChoices):
    ROUND_ROBIN = "round_robin", "Round robin"
    WEIGHTED = "weighted", "Weighted (smooth)"
    LEAST_LOADED = "least_loaded", "Least loaded"


class Group(models.Model):
    """A rotation pool: a territory, a product line or a source."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200, validators=[validate_one_line])
    strategy = models.CharField(max_length=20, choices=Strategy.choices, default=Strategy.ROUND_ROBIN)
    sla_minutes = models.DecimalField(
        "SLA minutes",
        max_digits=8,
        decimal_places=2,
        null=True,
        blank=True,
        validators=[MinValueValidator(Decimal("0.01"))],
        help_text="An assigned lead must be accepted within this many minutes. Empty: no SLA.",
    )
    # The same limits as the API's (rotation/api/serializers.py), so the admin keeps to them.
    max_attempts = models.PositiveIntegerField(
        default=3,
        validators=[MinValueValidator(1), MaxValueValidator(100)],
        help_text="Assignments a lead may have in this group before it goes to the queue.",
    )
    timezone = models.CharField(
        "time zone",
        max_length=64,
        default="UTC",
        validators=[validate_timezone],
        help_text="Where the group's day starts and ends (daily caps): an IANA name, such as Europe/Paris or UTC.",
    )
    dedup_days = models.PositiveIntegerField(
        default=30,
        validators=[MaxValueValidator(3650)],
        help_text="A lead whose email has an open lead within this many days is a duplicate.",
    )
    is_default = models.BooleanField("default group", default=False, help_text="Leads that match no rule go here.")
    active = models.BooleanField(default=True)
    owner_match_fallback_to_rotation = models.BooleanField(
        default=True,
        help_text="When an account owner is not eligible, route through the rotation "
        "(otherwise queue the lead for the owner).",
    )
    auto_pause_after_misses = models.PositiveIntegerField(
        null=True,
        blank=True,
        help_text="Pause a rep in this group after this many consecutive SLA misses (empty or 0: never).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["slug"]
        constraints = [
            models.UniqueConstraint(fields=["is_default"], condition=Q(is_default=True), name="one_default_group"),
            models.CheckConstraint(condition=Q(max_attempts__gte=1), name="group_max_attempts_positive"),
            # clean() names a slug taken in another case; this holds it for two requests at once.
            models.UniqueConstraint(Lower("slug"), name="group_slug_unique_without_case"),
        ]

    def __str__(self) -> str:
        return self.slug

    def save(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        adding = self._state.adding
        super().save(*args, **kwargs)
        if adding:
            # Its rotation row with it, however the group is made (the services, a shell, a
            # data migration): made later, by the first lead, a batch would take it after the
            # rotation rows of higher groups, out of the lock order, and could deadlock.
            RotationState.objects.get_or_create(group=self)

    def clean(self) -> None:
        # Integrations post leads to a slug and the audit trail is filed under it: "EMEA" beside
        # "emea" would be two territories no one tells apart. Checked when the group is made
        # (its slug is fixed then), so that a group saved before keeps its edits.
        if self._state.adding and self.slug:
            problem = group_slug_taken_in_another_case(self.slug)
            if problem:
                raise ValidationError({"slug": [problem]})

    def validate_constraints(self, exclude: Collection[str] | None = None) -> None:
        # The slug taken as it is: `unique=True` says so ("Group with this Slug already exists."),
        # and the case-blind constraint said it again beside, by its name.
        if self.slug and Group.objects.filter(slug=self.slug).exclude(pk=self.pk).exists():
            exclude = {*(exclude or ()), "slug"}
        super().validate_constraints(exclude)


def group_slug_taken_in_another_case(slug: str) -> str | None:
    """Why `slug` cannot name a new group because another group has it in another case, or None."""
    taken = Group.objects.filter(slug__iexact=slug).exclude(slug=slug).first()
    if taken is None:
        return None
    return f"A group with this slug already exists in another case ('{taken.slug}')."


class Rep(models.Model):
    name = models.CharField(max_length=200, validators=[validate_one_line])
    email = models.EmailField(max_length=254, unique=True)
    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="rep"
    )
    timezone = models.CharField(
        "time zone",
        max_length=64,
        default="UTC",
        validators=[validate_timezone],
        help_text="The rep's working hours and absences are in it: an IANA name, such as Europe/Paris or UTC.",
    )
    active = models.BooleanField(default=True)
    working_hours = models.JSONField(
        null=True,
        blank=True,
        help_text='Weekly hours in the rep\'s time zone, e.g. {"mon": [["09:00", "17:30"]]}. Empty: always.',
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name", "id"]
        constraints = [
            # Mailboxes do not care about case, so neither does a rep's identity.
            models.UniqueConstraint(Lower("email"), name="rep_email_unique_without_case"),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from .eligibility import validate_working_hours

        if self.email and (problem := rep_email_taken(self.email, rep_id=self.pk)):
            raise ValidationError({"email": [problem]})

        try:
            self.working_hours = validate_working_hours(self.working_hours)
        except ValueError as exc:
            raise ValidationError({"working_hours": [str(exc)]}) from exc


def rep_email_taken(email: str, *, rep_id: int | None) -> str | None:
    """Why `email` cannot be the address of rep `rep_id` (None: a new rep), or None."""
    others = Rep.objects.filter(email__iexact=email)
    if rep_id is not None:
        others = others.exclude(pk=rep_id)
    if others.exists():
        return "A rep with this e-mail already exists (e-mails are compared without case)."
    return None


class Membership(models.Model):
    """A rep in a group's rotation. Position orders the rotation; removal never renumbers."""

    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="memberships")
    rep = models.ForeignKey(Rep, on_delete=models.CASCADE, related_name="memberships")
    position = models.PositiveIntegerField()  # at most 1,000,000 by the API and the admin form
    weight = models.PositiveIntegerField(default=1, validators=[MinValueValidator(1), MaxValueValidator(1000)])
    active = models.BooleanField(default=True, help_text="Unticked: paused in this group.")
    max_open = models.PositiveIntegerField(
        null=True, blank=True, validators=[MaxValueValidator(1_000_000)], help_text="Cap on open leads. Empty: none."
    )
    max_per_day = models.PositiveIntegerField(
        validators=[MaxValueValidator(1_000_000)],
        null=True,
        blank=True,
        help_text="Cap on assignments per day (group's time zone). Empty: none.",
    )
    consecutive_misses = models.PositiveIntegerField(default=0, editable=False)
    paused_reason = models.CharField(max_length=200, blank=True, default="", validators=[validate_one_line])
    joined_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["group", "position"]
        constraints = [
            models.UniqueConstraint(fields=["group", "rep"], name="one_membership_per_rep_and_group"),
            models.UniqueConstraint(
                fields=["group", "position"],
                name="unique_position_in_group",
                deferrable=models.Deferrable.DEFERRED,
            ),
            models.CheckConstraint(condition=Q(weight__gte=1), name="membership_weight_positive"),
        ]

    def __str__(self) -> str:
        return f"{self.rep} in {self.group} (#{self.position})"


class RotationState(models.Model):
    """The one row per group that routing locks. Nothing but the routing services writes it.

    `pointer` is the position the next turn starts from: round robin picks the first eligible
    member at or after it (wrapping) and moves it just past the member chosen. For weighted
    groups `current_weights` holds each member's place on the weighted virtual clock, keyed by
    rep id (see rotation.strategies.weighted).
    """

    group = models.OneToOneField(Group, on_delete=models.CASCADE, primary_key=True, related_name="rotation")
    pointer = models.PositiveIntegerField(default=0)
    current_weights = models.JSONField(default=dict, blank=True)
    turns = models.BigIntegerField(default=0)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"rotation of {self.group_id}"


class Absence(models.Model):
    """An out-of-office window: the rep is not eligible anywhere while it lasts."""

    rep = models.ForeignKey(Rep, on_delete=models.CASCADE, related_name="absences")
    starts_at = models.DateTimeField()
    ends_at = models.DateTimeField()
    reason = models.CharField(max_length=200, blank=True, default="", validators=[validate_one_line])
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["starts_at"]
        indexes = [models.Index(fields=["rep", "ends_at"], name="absence_rep_ends_idx")]
        constraints = [
            models.CheckConstraint(condition=Q(ends_at__gt=models.F("starts_at")), name="absence_ends_after_start"),
        ]

    def __str__(self) -> str:
        # In the current time zone: on the rep's page, the rep's, as the fields beside it.
        starts, ends = localtime(self.starts_at), localtime(self.ends_at)
        return f"{self.rep} away {starts:%Y-%m-%d %H:%M} to {ends:%Y-%m-%d %H:%M}"

    def clean(self) -> None:
        # Entered in the rep's time zone (the admin): a time near the year 1 or 9999 can fall
        # outside them in UTC, which PostgreSQL stores but no read of the row could load back
        # (every routing read of the rep's absences would fail).
        out_of_range = {}
        for name in ("starts_at", "ends_at"):
            value = getattr(self, name)
            if value is None:
                continue
            try:
                value.astimezone(UTC)
            except OverflowError:
                out_of_range[name] = "Datetime value out of range once in UTC (years 1 to 9999)."
        if out_of_range:
            raise ValidationError(out_of_range)
        if self.starts_at and self.ends_at and self.ends_at <= self.starts_at:
            raise ValidationError({"ends_at": "The end must be after the start."})


class RoutingRule(models.Model):
    """Conditions on a lead (all must hold) that send it to a group. Lowest priority first."""

    name = models.CharField(max_length=200, unique=True, validators=[validate_one_line])
    priority = models.PositiveIntegerField(default=100)
    conditions = models.JSONField(default=list)
    group = models.ForeignKey(Group, on_delete=models.PROTECT, related_name="rules")
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["priority", "id"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from .rules import RuleError, validate_conditions

        try:
            self.conditions = validate_conditions(self.conditions)
        except RuleError as exc:
            raise ValidationError({"conditions": exc.messages}) from exc


class Account(models.Model):
    """A customer account by email domain, owned by a rep (sticky routing)."""

    domain = models.CharField(max_length=253, unique=True)
    name = models.CharField(max_length=200, blank=True, default="", validators=[validate_one_line])
    owner = models.ForeignKey(Rep, on_delete=models.CASCADE, related_name="accounts")

    class Meta:
        ordering = ["domain"]

    def __str__(self) -> str:
        return self.domain

    def save(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        self.domain = domain_unicode(self.domain)
        super().save(*args, **kwargs)


class ConfigVersion(models.Model):
    """One row whose number changes with every write to the configuration that intake reads
    before it takes a lock: groups, rules, accounts, reps' active flag and API clients.

    PostgreSQL triggers (migration 0002) set it from a sequence on every such statement, so a
    number is never reused, not even after a rollback. Web processes keep that configuration
    in memory and read only this number per request (routing_project/configcache.py)."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=1)
    version = models.BigIntegerField(default=0)

    def __str__(self) -> str:
        return f"configuration version {self.version}"
