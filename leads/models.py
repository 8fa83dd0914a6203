import hashlib

from django.core.validators import MinValueValidator
from django.db import models
from django.db.models import Q

from rotation.models import Group, Rep


class ApiClient(models.Model):
    """A named API token with scopes. Only the token's SHA-256 is stored."""

    class Scope(models.TextChoices):
        INTAKE = "intake"
        READ = "read"
        MANAGE = "manage"

    name = models.CharField(max_length=100, unique=True)
    token_hash = models.CharField(max_length=64, unique=True)
    token_prefix = models.CharField(max_length=12, help_text="First characters of the token, to recognise it.")
    scopes = models.JSONField(default=list)
    active = models.BooleanField(default=True, help_text="Off: its token gets 401 until switched on again.")
    rate_limit_per_minute = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Requests a minute before a 429 (empty: the server's API_RATE_LIMIT_PER_MINUTE).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # Revoked for good (the admin's action): never active again; a new client gets a new token.
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        verbose_name = "API client"  # not Django's "Api client"

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def hash_token(token: str) -> str:
        return hashlib.sha256(token.encode()).hexdigest()

    def has_scope(self, scope: str) -> bool:
        return scope in self.scopes


class LeadStatus(models.TextChoices):
    ASSIGNED = "assigned"
    ACCEPTED = "accepted"
    QUEUED = "queued"
    CLOSED = "closed"


OPEN_STATUSES = (LeadStatus.ASSIGNED, LeadStatus.ACCEPTED)
# A new lead whose email matches one of these (within the dedup window) is a duplicate.
DEDUP_STATUSES = (LeadStatus.ASSIGNED, LeadStatus.ACCEPTED, LeadStatus.QUEUED)

# What a lead says of its contact and of itself, in the order the API, the webhook payload and
# a web form's field map list them.
LEAD_DATA_FIELDS = (
    "email",
    "first_name",
    "last_name",
    "company",
    "phone",
    "country",
    "region",
    "source",
    "product",
    "score",
    "company_size",
    "external_id",
)


class Lead(models.Model):
    class Outcome(models.TextChoices):
        WON = "won"
        LOST = "lost"
        DISQUALIFIED = "disqualified"

    id = models.BigAutoField(primary_key=True)
    email = models.EmailField(max_length=254)
    email_normalized = models.CharField(max_length=254)  # looked up through lead_dedup_idx
    first_name = models.CharField(max_length=100, blank=True, default="")
    last_name = models.CharField(max_length=100, blank=True, default="")
    company = models.CharField(max_length=200, blank=True, default="")
    phone = models.CharField(max_length=40, blank=True, default="")
    country = models.CharField(max_length=2, blank=True, default="")
    region = models.CharField(max_length=100, blank=True, default="")
    source = models.CharField(max_length=100, blank=True, default="")
    product = models.CharField(max_length=100, blank=True, default="")
    score = models.PositiveSmallIntegerField(null=True, blank=True)
    company_size = models.PositiveIntegerField(null=True, blank=True)
    external_id = models.CharField(max_length=255, blank=True, default="")
    attributes = models.JSONField(default=dict, blank=True)
    raw_payload = models.JSONField(default=dict, blank=True)
    requested_group = models.CharField(max_length=64, blank=True, default="")

    group = models.ForeignKey(Group, null=True, blank=True, on_delete=models.PROTECT, related_name="leads")
    status = models.CharField(max_length=10, choices=LeadStatus.choices)
    # Looked up through lead_owner_status_idx (owner first): no index of its own.
    owner = models.ForeignKey(
        Rep, null=True, blank=True, on_delete=models.PROTECT, related_name="leads", db_index=False
    )
    # Composed by routing from slugs, reasons and counts (a pause's reason inside an account
    # owner's): text, so that no composition can outgrow a column and fail an intake.
    queue_reason = models.TextField(blank=True, default="")
    outcome = models.CharField(max_length=20, choices=Outcome.choices, blank=True, default="")
    escalations = models.PositiveIntegerField(default=0)
    api_client = models.ForeignKey(
        ApiClient, null=True, blank=True, on_delete=models.SET_NULL, related_name="+", verbose_name="API client"
    )

    created_at = models.DateTimeField(db_index=True)
    assigned_at = models.DateTimeField(null=True, blank=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)
    sla_due_at = models.DateTimeField("SLA due at", null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["status", "group", "id"], name="lead_status_group_idx"),
            models.Index(fields=["owner", "status"], name="lead_owner_status_idx"),
            models.Index(fields=["email_normalized", "status", "created_at"], name="lead_dedup_idx"),
            # Exact matches only (imports are idempotent by external_id): no pattern-ops twin.
            models.Index(fields=["external_id"], name="lead_external_id_idx"),
        ]
        constraints = [
            # An open lead always has exactly one owner; a queued lead has none.
            models.CheckConstraint(
                condition=~Q(status__in=["assigned", "accepted"]) | Q(owner__isnull=False),
                name="open_lead_has_owner",
            ),
            models.CheckConstraint(
                condition=~Q(status="queued") | Q(owner__isnull=True),
                name="queued_lead_has_no_owner",
            ),
        ]

    def __str__(self) -> str:
        return f"Lead #{self.id}"


class QueuedLead(Lead):
    """The fallback queue, as its own admin page for managers."""

    class Meta:
        proxy = True
        verbose_name = "queued lead"
        verbose_name_plural = "fallback queue"


class Assignment(models.Model):
    """One row per (lead, rep, attempt). The open one (ended_at null) is the lead's owner."""

    class Reason(models.TextChoices):
        ROTATION = "rotation"
        OWNER_MATCH = "owner_match"
        ESCALATION = "escalation"
        MANUAL = "manual"
        REROUTE = "reroute"

    id = models.BigAutoField(primary_key=True)
    # Both looked up through the composite indexes below (unique_lead_attempt, assignment_daily_idx):
    # every index is written once per lead, so none is kept twice.
    lead = models.ForeignKey(Lead, on_delete=models.PROTECT, related_name="assignments", db_index=False)
    rep = models.ForeignKey(Rep, on_delete=models.PROTECT, related_name="assignments")
    group = models.ForeignKey(Group, null=True, on_delete=models.PROTECT, related_name="assignments", db_index=False)
    attempt = models.PositiveIntegerField()
    reason = models.CharField(max_length=20, choices=Reason.choices)
    started_at = models.DateTimeField()
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=40, blank=True, default="")
    due_at = models.DateTimeField(null=True, blank=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    over_cap = models.BooleanField(default=False)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["group", "rep", "started_at"], name="assignment_daily_idx"),
            # The escalation sweep's index: open, unaccepted assignments by due time.
            models.Index(
                fields=["due_at"],
                name="assignment_open_due_idx",
                condition=Q(ended_at__isnull=True, accepted_at__isnull=True, due_at__isnull=False),
            ),
        ]
        constraints = [
            # Never two owners at once: at most one open assignment per lead.
            models.UniqueConstraint(fields=["lead"], condition=Q(ended_at__isnull=True), name="one_open_assignment"),
            models.UniqueConstraint(fields=["lead", "attempt"], name="unique_lead_attempt"),
        ]

    def __str__(self) -> str:
        return f"Lead #{self.lead_id}, attempt {self.attempt}"


class IdempotencyRecord(models.Model):
    class State(models.TextChoices):
        IN_FLIGHT = "in_flight"
        DONE = "done"

    client = models.ForeignKey(ApiClient, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    request_hash = models.CharField(max_length=64)
    state = models.CharField(max_length=10, choices=State.choices, default=State.IN_FLIGHT)
    response_status = models.PositiveSmallIntegerField(null=True)
    response_body = models.BinaryField(null=True)
    lead = models.ForeignKey(Lead, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(db_index=True)
    # The PostgreSQL backend of the request that claimed the key: gone with its connection when
    # that request's worker dies, so a retry need not wait for the claim to go stale.
    claimed_by_pid = models.IntegerField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["client", "key"], name="one_record_per_client_key")]

    def __str__(self) -> str:
        return f"{self.client_id}:{self.key[:20]}"
