from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request


class Pagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500

    def get_page_size(self, request: Request) -> int:
        """A page size that is not a whole number from 1 to 500 is a 400 naming it (not
        silently replaced by the default)."""
        raw = request.query_params.getlist(self.page_size_query_param)
        if not raw:
            return self.page_size
        value = raw[-1]
        if len(raw) > 1 or not value.isascii() or not value.isdigit() or not 1 <= int(value) <= self.max_page_size:
            raise ValidationError({"page_size": [f"A whole number from 1 to {self.max_page_size}."]})
        return int(value)

    def get_page_number(self, request: Request, paginator: Any) -> Any:
        """A page number that is not a whole number from 1 (or `last`) is a 400 naming it; an
        empty `?page=` is not read as page 1. A page past the end stays a 404, as in DRF."""
        raw = request.query_params.getlist(self.page_query_param)
        if raw:
            value = raw[-1]
            if value not in self.last_page_strings and (
                len(raw) > 1 or not value.isascii() or not value.isdigit() or int(value) < 1
            ):
                raise ValidationError({self.page_query_param: ["A whole number from 1."]})
        return super().get_page_number(request, paginator)

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters = super().get_schema_operation_parameters(view)
        for parameter in parameters:
            if parameter["name"] == self.page_size_query_param:
                parameter["schema"].update({"minimum": 1, "maximum": self.max_page_size})
            elif parameter["name"] == self.page_query_param:
                parameter["schema"].update({"minimum": 1})
        return parameters
