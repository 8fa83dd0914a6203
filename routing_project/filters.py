"""Query filters that say what is wrong instead of ignoring it."""

from __future__ import annotations

import django_filters


class StrictFilterSet(django_filters.FilterSet):
    """A filter parameter given empty (`?created_after=`) or twice (`?owner=1&owner=2`) is a
    400 naming it, rather than silently ignored: a client that meant to filter learns it did
    not. Text filters may be empty."""

    def is_valid(self) -> bool:
        valid = super().is_valid()
        getlist = getattr(self.data, "getlist", None)
        for name, filter_ in self.filters.items():
            if name not in self.data:
                continue
            values = getlist(name) if getlist else [self.data.get(name)]
            problem = None
            if len(values) > 1:
                problem = "Give this parameter once."
            elif values[0] == "" and not isinstance(filter_, django_filters.CharFilter):
                problem = "Give a value, or leave the parameter out."
            if problem:
                self.form.add_error(name, problem)
                valid = False
        return valid
