from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def query_errors(self, request: Request) -> dict[str, list[str]]:
        """The page parameters' problems, both named at once: a page size that is not a whole
        number from 1 to 500 (never silently replaced by the default), a page number that is
        not a whole number from 1 (or `last`; an empty `?page=` is not read as page 1)."""
        errors: dict[str, list[str]] = {}
        sizes = request.query_params.getlist(self.page_size_query_param)
        if sizes and not _whole(sizes, least=1, most=self.max_page_size):
            errors[self.page_size_query_param] = [f"A whole number from 1 to {self.max_page_size}."]
        pages = request.query_params.getlist(self.page_query_param)
        if pages and pages[-1] not in self.last_page_strings and not _whole(pages, least=1):
            errors[self.page_query_param] = ["A whole number from 1."]
        return errors

    def get_page_size(self, request: Request) -> int:
        # Read first when a page is made (before the page number): a 400 names both.
        errors = self.query_errors(request)
        if errors:
            raise ValidationError(errors)
        raw = request.query_params.getlist(self.page_size_query_param)
        return int(raw[-1]) if raw else self.page_size

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update({"minimum": 1, "maximum": self.max_page_size})
            elif parameter["name"] == self.page_query_param:
                parameter["schema"].update({"minimum": 1})
        return parameters


def _whole(values: list[str], *, least: int, most: int | None = None) -> bool:
    """One value, a whole number in ASCII digits from `least` (to `most`)."""
    value = values[-1]
    if len(values) > 1 or not value.isascii() or not value.isdigit():
        return False
    return least <= int(value) and (most is None or int(value) <= most)
