"""Form pieces the admin's model forms share."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django import forms
from django.contrib import messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.widgets import AutocompleteSelect
from django.core.exceptions import ValidationError
from django.db import models
from django.forms.fields import InvalidJSONInput, JSONString
from django.http import HttpRequest, HttpResponseRedirect

from .api import json_loads_client


class ClientJSONFormField(forms.JSONField):
    """A JSON field that parses as the API does (`json_loads_client`): NaN, Infinity, a lone
    UTF-16 surrogate or nesting too deep is a form error, where Django's would let it through
    to a 500 (PostgreSQL refuses NaN in jsonb) or fail parsing it."""

    def to_python(self, value: Any) -> Any:
        if self.disabled:
            return value
        if value in self.empty_values:
            return None
        if isinstance(value, list | dict | int | float | JSONString):
            return value
        try:
            converted = json_loads_client(value)
        except ValueError as exc:
            raise ValidationError(f"Enter valid JSON: {exc}.", code="invalid") from None
        return JSONString(converted) if isinstance(converted, str) else converted

    def bound_data(self, data: Any, initial: Any) -> Any:
        if self.disabled:
            return initial
        if data is None:
            return None
        try:
            return json_loads_client(data)
        except ValueError:
            return InvalidJSONInput(data)


# For a ModelAdmin: `formfield_overrides = STRICT_JSON`.
STRICT_JSON: dict[type[models.Field], dict[str, Any]] = {models.JSONField: {"form_class": ClientJSONFormField}}


class CheckedAutocompleteSelect(AutocompleteSelect):
    """Django's autocomplete widget, re-rendering a posted form, looks its value up as the
    related model's key: a value that is no key ("abc" for an integer id, or one past the
    column's range, which SQLite's driver refuses) raised there, a 500 in place of the form's
    own "Select a valid choice" error. Such values are left out.

    `chosen`, set by a form whose object is already read with its related row, is shown
    without looking it up again: a page of 60 members made 60 queries for their reps."""

    chosen: models.Model | None = None

    def optgroups(self, name: str, value: Sequence[str], attr: Any = None) -> Any:
        if self.chosen is not None and [str(item) for item in value] == [str(self.chosen.pk)]:
            default: tuple[None, list[Any], int] = (None, [], 0)
            if not self.is_required and not self.allow_multiple_selected:
                default[1].append(self.create_option(name, "", "", False, 0))
            label = self.choices.field.label_from_instance(self.chosen)
            default[1].append(self.create_option(name, self.chosen.pk, label, True, len(default[1])))
            return [default]
        opts = self.field.remote_field.model._meta
        target = opts.get_field(getattr(self.field.remote_field, "field_name", None) or opts.pk.name)
        keys = []
        for item in value:
            try:
                key = target.to_python(item)
                target.get_prep_value(key)
                target.run_validators(key)  # the column's range (integer keys)
            except (ValidationError, ValueError, TypeError):
                continue
            keys.append(item)
        return super().optgroups(name, keys, attr)


class CheckedAutocompleteMixin:
    """For a ModelAdmin or inline with `autocomplete_fields`: their widgets are
    `CheckedAutocompleteSelect`."""

    def formfield_for_foreignkey(self, db_field: Any, request: Any, **kwargs: Any) -> Any:
        if "widget" not in kwargs and db_field.name in self.get_autocomplete_fields(request):  # type: ignore[attr-defined]
            kwargs["widget"] = CheckedAutocompleteSelect(db_field, self.admin_site, using=kwargs.get("using"))  # type: ignore[attr-defined]
        field = super().formfield_for_foreignkey(db_field, request, **kwargs)  # type: ignore[misc]
        # The chosen value as the autocomplete lists it (routing_project/admin_site.py).
        related = self.admin_site._registry.get(db_field.remote_field.model)  # type: ignore[attr-defined]
        label = getattr(related, "autocomplete_label", None)
        if field is not None and label is not None and db_field.name in self.get_autocomplete_fields(request):  # type: ignore[attr-defined]
            field.label_from_instance = label
        return field


class RowsGoneAdminMixin:
    """For a ModelAdmin with inlines. A row of a page whose object someone else deleted since
    the page was read (a member removed, an absence deleted) fails on its hidden id, and the
    inline does not draw that row (it lists the objects that still exist): the page said
    "Please correct the error below." and showed no error, and saving it again failed again.
    Such a save is refused up front, said, and the page shown as it is now."""

    def changeform_view(
        self, request: HttpRequest, object_id: str | None = None, form_url: str = "", extra_context: Any = None
    ) -> Any:
        if request.method == "POST" and object_id is not None:
            gone = self._inline_rows_gone(request, object_id)
            if gone:
                one = len(gone) == 1 and gone[0].startswith("1 ")
                self.message_user(  # type: ignore[attr-defined]
                    request,
                    f"Nothing was saved: {', '.join(gone)} of this page {'was' if one else 'were'} "
                    "removed by someone else since the page was read. Here it is as it is now: make your "
                    "changes again.",
                    messages.ERROR,
                )
                return HttpResponseRedirect(request.get_full_path())
        return super().changeform_view(request, object_id, form_url, extra_context)  # type: ignore[misc]

    def _inline_rows_gone(self, request: HttpRequest, object_id: str) -> list[str]:
        obj = self.get_object(request, unquote(object_id))  # type: ignore[attr-defined]
        if obj is None or not self.has_change_permission(request, obj):  # type: ignore[attr-defined]
            return []  # Django's own answer (a 403, "no such object")
        gone = []
        for inline in self.get_inline_instances(request, obj):  # type: ignore[attr-defined]
            formset = inline.get_formset(request, obj)
            prefix, pk_name = formset.get_default_prefix(), inline.model._meta.pk.name
            initial = request.POST.get(f"{prefix}-INITIAL_FORMS", "")
            if not (initial.isascii() and initial.isdigit()):
                continue  # a broken management form: the formset says so itself
            posted = {request.POST.get(f"{prefix}-{i}-{pk_name}", "") for i in range(min(int(initial), 1000))}
            ids = {int(v) for v in posted if v.isascii() and v.isdigit() and len(v) < 19}
            found = inline.model._default_manager.filter(**{formset.fk.name: obj, "pk__in": ids}).count()
            if found < len(ids):
                names = (
                    inline.model._meta.verbose_name_plural if len(ids) - found > 1 else inline.model._meta.verbose_name
                )
                gone.append(f"{len(ids) - found} {names}")
        return gone


class EditedFieldsForm(forms.ModelForm):
    """A change form that knows which fields its user edited on the page they loaded: each
    field also carries its value as loaded, in a hidden input (Django's `show_hidden_initial`),
    so that `changed_data` names what the user edited, not what a colleague changed since the
    page was read (those differ from the row as it is now, too). The services then write only
    the edited fields over the row as it is now (rotation.services._change): a stale second
    tab no longer puts back a group made inactive or a member's weight."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, field in self.fields.items():
            # A post without the field's value as loaded (a script, an older page): compared
            # with the row as it is now, as Django's forms do.
            field.show_hidden_initial = not self.is_bound or self.add_initial_prefix(name) in self.data
