from __future__ import annotations

from typing import Any

from django.db.models import ProtectedError, QuerySet
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema, extend_schema_view, inline_serializer
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response

from rotation import services
from rotation.models import Group, Membership, Rep
from routing_project.api import CREATED_LOCATION, CreatedLocationMixin
from routing_project.exceptions import Conflict
from routing_project.filters import StrictFilterSet, TrueFalseFilter

from .serializers import (
    TO_END,
    GroupSerializer,
    GroupUpdateSerializer,
    MembershipSerializer,
    MembershipUpdateSerializer,
    RepSerializer,
)

ERROR = inline_serializer("RotationError", fields={"detail": serializers.CharField()})
ERRORS = {400: OpenApiTypes.OBJECT, 401: ERROR, 403: ERROR, 404: ERROR}


def actor_of(request: Request) -> str:
    return str(request.user) if request.user else "api:anonymous"


def _changed(serializer: serializers.BaseSerializer) -> list[str]:
    return list(serializer.validated_data)  # type: ignore[arg-type]


class GroupFilter(StrictFilterSet):
    active = TrueFalseFilter()
    is_default = TrueFalseFilter()

    class Meta:
        model = Group
        fields = ["active", "is_default"]


class RepFilter(StrictFilterSet):
    active = TrueFalseFilter()

    class Meta:
        model = Rep
        fields = ["active"]


@extend_schema_view(
    list=extend_schema(responses={200: GroupSerializer(many=True), **ERRORS}),
    create=extend_schema(parameters=[CREATED_LOCATION], responses={201: GroupSerializer, **ERRORS}),
    retrieve=extend_schema(responses={200: GroupSerializer, **ERRORS}),
    partial_update=extend_schema(request=GroupUpdateSerializer, responses={200: GroupSerializer, **ERRORS}),
    destroy=extend_schema(responses={204: None, 409: ERROR, **ERRORS}),
)
class GroupViewSet(CreatedLocationMixin, viewsets.ModelViewSet):
    # SPEC's contract updates with PATCH; a PUT would have to resend fields it cannot change.
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    serializer_class = GroupSerializer
    lookup_field = "slug"
    location_field = "slug"
    lookup_value_regex = r"[-a-zA-Z0-9_]+"  # anything else names no group: a 404 from the URL conf
    required_scope = "manage"
    queryset = Group.objects.order_by("slug")
    filterset_class = GroupFilter

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = services.group_save(
            group=Group(**serializer.validated_data), actor=actor_of(self.request)
        )

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        group = serializer.instance
        assert isinstance(group, Group)
        for name, value in serializer.validated_data.items():
            setattr(group, name, value)
        services.group_save(group=group, actor=actor_of(self.request), changed=_changed(serializer))

    def perform_destroy(self, instance: Group) -> None:
        try:
            services.group_delete(group=instance, actor=actor_of(self.request))
        except services.InUse as exc:
            kept = " and ".join([", ".join(exc.what[:-1]), exc.what[-1]] if len(exc.what) > 1 else exc.what)
            raise Conflict(f"The group has {kept}; deactivate it instead (active: false).") from None
        except ProtectedError:
            raise Conflict("The group has leads or rules; deactivate it instead (active: false).") from None


@extend_schema_view(
    list=extend_schema(responses={200: RepSerializer(many=True), **ERRORS}),
    create=extend_schema(parameters=[CREATED_LOCATION], responses={201: RepSerializer, **ERRORS}),
    retrieve=extend_schema(responses={200: RepSerializer, **ERRORS}),
    partial_update=extend_schema(responses={200: RepSerializer, **ERRORS}),
)
class RepViewSet(
    CreatedLocationMixin,
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.UpdateModelMixin,
    viewsets.GenericViewSet,
):
    # SPEC's contract updates with PATCH; a PUT would have to resend fields it cannot change.
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    serializer_class = RepSerializer
    required_scope = "manage"
    lookup_value_regex = r"[0-9]+"  # int() would read "1_0" as rep 10, "+1" or a full-width "１" as rep 1
    queryset = Rep.objects.order_by("id")
    filterset_class = RepFilter

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        serializer.instance = services.rep_save(rep=Rep(**serializer.validated_data), actor=actor_of(self.request))

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        rep = serializer.instance
        assert isinstance(rep, Rep)
        for name, value in serializer.validated_data.items():
            setattr(rep, name, value)
        services.rep_save(rep=rep, actor=actor_of(self.request), changed=_changed(serializer))


@extend_schema_view(
    list=extend_schema(responses={200: MembershipSerializer(many=True), **ERRORS}),
    create=extend_schema(parameters=[CREATED_LOCATION], responses={201: MembershipSerializer, **ERRORS}),
    retrieve=extend_schema(responses={200: MembershipSerializer, **ERRORS}),
    partial_update=extend_schema(request=MembershipUpdateSerializer, responses={200: MembershipSerializer, **ERRORS}),
    destroy=extend_schema(responses={204: None, **ERRORS}),
)
class MembershipViewSet(
    CreatedLocationMixin,
    mixins.CreateModelMixin,
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,  # the Location a POST answers with can be read back
    mixins.UpdateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """A group's members, addressed by rep id: listed whole, in rotation order (a group's
    members are few, and read as the rotation they make)."""

    # SPEC's contract updates with PATCH; a PUT would have to resend fields it cannot change.
    http_method_names = ["get", "post", "patch", "delete", "head", "options"]
    serializer_class = MembershipSerializer
    required_scope = "manage"
    lookup_field = "rep_id"
    lookup_url_kwarg = "rep_id"
    location_field = "rep"
    lookup_value_regex = r"[0-9]+"
    pagination_class = None

    def get_group(self) -> Group:
        if not hasattr(self, "_group"):
            self._group = get_object_or_404(Group, slug=self.kwargs["group_slug"])
        return self._group

    def get_queryset(self) -> QuerySet[Membership]:
        if getattr(self, "swagger_fake_view", False):
            return Membership.objects.none()
        return Membership.objects.filter(group=self.get_group()).select_related("rep").order_by("position")

    def get_serializer_context(self) -> dict[str, Any]:
        context = super().get_serializer_context()
        if "group_slug" in self.kwargs:
            context["group"] = self.get_group()
        return context

    def perform_create(self, serializer: serializers.BaseSerializer) -> None:
        fields = dict(serializer.validated_data)
        rep = fields.pop("rep")
        serializer.instance = services.membership_add(
            group=self.get_group(), rep=rep, actor=actor_of(self.request), **fields
        )

    def perform_update(self, serializer: serializers.BaseSerializer) -> None:
        membership = serializer.instance
        assert isinstance(membership, Membership)
        fields = dict(serializer.validated_data)  # type: ignore[arg-type]
        to_end = bool(fields.pop(TO_END, False))
        for name, value in fields.items():
            setattr(membership, name, value)
        try:
            services.membership_update(
                membership=membership, actor=actor_of(self.request), changed=list(fields), to_end=to_end
            )
        except Membership.DoesNotExist as exc:
            raise NotFound(str(exc)) from None

    def perform_destroy(self, instance: Membership) -> None:
        # Removed by another request meanwhile: a 404 (routing_project/exceptions.py).
        services.membership_remove(membership=instance, actor=actor_of(self.request))

    def destroy(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        self.perform_destroy(self.get_object())
        return Response(status=status.HTTP_204_NO_CONTENT)
