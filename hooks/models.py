from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from leads.models import LEAD_DATA_FIELDS
from security.fields import SealedField

# The lead fields a source may map its form fields to (plus `attributes.<key>`).
LEAD_FIELDS = (*LEAD_DATA_FIELDS, "group")


def field_map_problems(field_map: Any) -> list[str]:
    if not isinstance(field_map, dict):
        return ["The field map is a JSON object: {form field: lead field}."]
    problems = []
    for form_field, lead_field in field_map.items():
        if not isinstance(lead_field, str) or not (
            lead_field in LEAD_FIELDS
            or (lead_field.startswith("attributes.") and 0 < len(lead_field) - len("attributes.") <= 64)
        ):
            problems.append(
                f"'{form_field}': maps to '{lead_field}', which is not a lead field "
                f"({', '.join(LEAD_FIELDS)} or attributes.<key>)."
            )
    return problems


class IntakeSource(models.Model):
    """A web form (or form service) allowed to post leads to /api/v1/hooks/<slug>/, signed
    with its secret. The secret must be kept to verify signatures; it is shown once, when
    created or rotated, and never displayed again."""

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=100)
    secret = SealedField(editable=False)  # encrypted at rest (security/fields.py)
    secret_prefix = models.CharField(max_length=12, editable=False, help_text="To recognise the secret.")
    # The replaced secrets still in their grace period, one per line (security/secret_rotation.py).
    previous_secret = SealedField(blank=True, default="", editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    field_map = models.JSONField(
        default=dict,
        blank=True,
        help_text='{"form field": "lead field"}, e.g. {"your-email": "email", "utm_campaign": '
        '"attributes.campaign"}. Form fields named like a lead field need no entry; others are ignored '
        "(kept in the raw payload).",
    )
    active = models.BooleanField(default=True)
    rate_limit_per_minute = models.PositiveIntegerField(
        default=120, validators=[MinValueValidator(1)], help_text="Posts a minute from this source before a 429."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    secret_rotated_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["slug"]

    def __str__(self) -> str:
        return self.slug

    def clean(self) -> None:
        errors: dict[str, list[str]] = {}
        problems = field_map_problems(self.field_map)
        if problems:
            errors["field_map"] = problems
        # A form posts to /api/v1/hooks/<slug>/: "Site" beside "site" would be two sources
        # that no one tells apart in the trail (`hook:<slug>`), as groups refuse it.
        taken = IntakeSource.objects.filter(slug__iexact=self.slug).exclude(pk=self.pk).exclude(slug=self.slug).first()
        if self.slug and taken is not None:
            errors["slug"] = [f"A source with this slug already exists in another case ('{taken.slug}')."]
        if errors:
            raise ValidationError(errors)


class HookDelivery(models.Model):
    """A verified signed message (`signature_hash`: the sha256 of "<t>.<raw body>"), kept for
    the tolerance window: the same message again is a replay, whichever of its signatures it
    carries. The unique constraint makes that hold across processes."""

    source = models.ForeignKey(IntakeSource, on_delete=models.CASCADE, related_name="+")
    signature_hash = models.CharField(max_length=64)
    signed_at = models.DateTimeField()
    received_at = models.DateTimeField(db_index=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["source", "signature_hash"], name="one_delivery_per_signature")]

    def __str__(self) -> str:
        return f"{self.source_id}:{self.signature_hash[:12]}"
