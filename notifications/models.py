"""Outbound notifications: per-group webhook endpoints, the outbox, and the delivery log.

The routing transaction writes one `OutboxMessage` per event (one INSERT, no look-ups under
the rotation lock). After commit a Celery task fans it out into `Delivery` rows, one per
channel (each webhook endpoint of the group, the rep's e-mail), and sends each with retries
and exponential backoff. A periodic sweep picks up whatever a lost task left behind.
"""

import secrets
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import models
from django.db.models import Q

from rotation.models import Group, Rep
from security.fields import SealedField

# Deliveries are HTTP POSTs: an ftp:// address (which URLField takes) could never get one.
_HTTP_URL = URLValidator(
    schemes=["http", "https"], message="Enter an http:// or https:// URL: deliveries are POSTed.", code="not_http"
)


def port_in_range(url: str) -> None:
    """URLValidator takes any 1-5 digit port: 0 or one over 65535 could never get a delivery."""
    try:
        port = urlsplit(url).port
    except ValueError:
        port = 0
    if port == 0:
        raise ValidationError("Enter a port from 1 to 65535.", code="bad_port")


def url_shown(url: str) -> str:
    """The address with the credentials of its user part masked (`https://crm:<password>@host/`,
    sent as HTTP Basic authentication, shows as `https://crm:***@host/`; a user part alone, often
    a token, as `***`): as the delivery log, the audit trail and the endpoint's name show it to
    staff who may not see the endpoints themselves."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "@" not in parts.netloc:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    user, colon, _password = userinfo.partition(":")
    return parts._replace(netloc=f"{user}:***@{host}" if colon else f"***@{host}").geturl()


def new_secret() -> str:
    return secrets.token_hex(32)


class WebhookEndpoint(models.Model):
    """Where a group's lead events are POSTed, signed with the endpoint's secret."""

    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="webhook_endpoints")
    url = models.URLField(max_length=500, validators=[_HTTP_URL, port_in_range])
    secret = SealedField(  # encrypted at rest (security/fields.py)
        default=new_secret,
        help_text="Signs each delivery: X-Signature: t=<unix>,v1=<hex HMAC-SHA256 of '<t>.<body>'>.",
    )
    # The replaced secrets still in their grace period, one per line (security/secret_rotation.py):
    # deliveries carry a signature under each of them too, so the receiver can switch at its pace.
    previous_secret = SealedField(blank=True, default="", editable=False)
    previous_secret_expires_at = models.DateTimeField(
        "old secret signs until",
        null=True,
        blank=True,
        editable=False,
        help_text="Until then deliveries also carry a v1 signature under the replaced secret.",
    )
    secret_rotated_at = models.DateTimeField(null=True, blank=True, editable=False)
    active = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)
    unreachable_until = models.DateTimeField(
        null=True,
        blank=True,
        editable=False,
        help_text="It gave no answer at all (timeout, refused): until then a try of its other deliveries "
        "is not sent but fails as that one did (no worker held), each due again at its own backoff.",
    )

    class Meta:
        ordering = ["group", "id"]

    def __str__(self) -> str:
        return f"{self.group} -> {url_shown(self.url)}"


class OutboxMessage(models.Model):
    """One lead event to announce, written inside the transaction that made it happen."""

    id = models.BigAutoField(primary_key=True)
    event = models.CharField(max_length=40)
    lead_id = models.BigIntegerField()  # no key: notifications sits below leads (leads writes here)
    # The group whose webhooks hear of it and the rep it is for: keys for the admin's list to
    # join (`list_select_related`), without a database constraint or index: nothing more to
    # check or write on each intake's insert, and a group or rep deleted later leaves the
    # message as it was sent (the list then shows the id it names).
    group = models.ForeignKey(
        Group, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    rep = models.ForeignKey(
        Rep, null=True, blank=True, on_delete=models.DO_NOTHING, db_constraint=False, db_index=False, related_name="+"
    )
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            # The sweep's index: messages not yet fanned out.
            models.Index(fields=["id"], name="outbox_undispatched_idx", condition=Q(dispatched_at__isnull=True)),
            # The admin's search of the outbox by lead (a lead's messages): a scan of the whole
            # table without it, and the table holds NOTIFY_RETENTION_DAYS of every lead's events.
            models.Index(fields=["lead_id"], name="outbox_lead_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.event} lead #{self.lead_id}"


class Delivery(models.Model):
    """One channel of one message, and how sending it went (the delivery log)."""

    class Channel(models.TextChoices):
        WEBHOOK = "webhook"
        EMAIL = "email"

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"  # gave up after the last attempt

    id = models.BigAutoField(primary_key=True)
    message = models.ForeignKey(OutboxMessage, on_delete=models.CASCADE, related_name="deliveries")
    channel = models.CharField(max_length=10, choices=Channel.choices)
    endpoint = models.ForeignKey(
        WebhookEndpoint, null=True, blank=True, on_delete=models.SET_NULL, related_name="deliveries"
    )
    rep = models.ForeignKey(Rep, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    target = models.CharField(max_length=500, help_text="The URL, or the rep's e-mail address.")
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True, default="")
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    next_attempt_at = models.DateTimeField()
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "deliveries"
        indexes = [
            models.Index(fields=["next_attempt_at"], name="delivery_pending_idx", condition=Q(status="pending")),
        ]
        constraints = [
            # Fan-out is safe to run twice: one delivery per (message, endpoint) and per (message, e-mail).
            models.UniqueConstraint(
                fields=["message", "endpoint"], condition=Q(channel="webhook"), name="one_webhook_delivery"
            ),
            models.UniqueConstraint(fields=["message"], condition=Q(channel="email"), name="one_email_delivery"),
        ]

    def __str__(self) -> str:
        return f"{self.channel} #{self.id} ({self.status})"
