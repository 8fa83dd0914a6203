from django.contrib import admin
from django.urls import URLPattern, URLResolver, include, path
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from hooks.views import HookView
from leads import admin_views
from leads.accept_link import accept_page
from leads.api.routing_views import ReplayView, SimulateView
from leads.api.views import LeadViewSet, QueueView, RotationView
from rotation.api.rules import AbsenceViewSet, RuleViewSet
from rotation.api.views import GroupViewSet, MembershipViewSet, RepViewSet

from . import health, metrics

router = DefaultRouter(trailing_slash=True)
router.include_root_view = False
# The contract's paths only: no `leads.json`-style suffix variants, which no schema documents
# and whose custom actions (events, accept, close...) took no `format` argument (a 500).
router.include_format_suffixes = False
router.register("leads", LeadViewSet, basename="lead")
router.register("groups", GroupViewSet, basename="group")
router.register("reps", RepViewSet, basename="rep")
router.register(r"groups/(?P<group_slug>[-a-zA-Z0-9_]+)/members", MembershipViewSet, basename="membership")
router.register("rules", RuleViewSet, basename="rule")
router.register(r"reps/(?P<rep_id>[0-9]+)/absences", AbsenceViewSet, basename="absence")

api_v1: list[URLPattern | URLResolver] = [
    path("hooks/<slug:source>/", HookView.as_view(), name="hook-intake"),
    path("queue/", QueueView.as_view(), name="queue"),
    path("groups/<slug:slug>/rotation/", RotationView.as_view(), name="group-rotation"),
    path("routing/simulate/", SimulateView.as_view(), name="routing-simulate"),
    path("routing/replay/", ReplayView.as_view(), name="routing-replay"),
    path("", include(router.urls)),
]

urlpatterns = [
    # The address make run prints, and the admin's "View site": there is no page of its own.
    path("", RedirectView.as_view(url="/admin/"), name="home"),
    path("admin/dashboard/", admin.site.admin_view(admin_views.dashboard_page), name="admin-dashboard"),
    path("admin/lead-import/", admin.site.admin_view(admin_views.import_page), name="admin-lead-import"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]), name="schema"),
    path(
        "api/docs/",
        # GET only: DRF's OPTIONS answer would be rendered with this page's HTML template.
        SpectacularSwaggerView.as_view(
            url_name="schema", authentication_classes=[], permission_classes=[], http_method_names=["get", "head"]
        ),
        name="docs",
    ),
    path("leads/accept/<str:token>/", accept_page, name="lead-accept-link"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics.metrics_view, name="metrics"),
]

handler400 = "routing_project.error_views.bad_request"
handler403 = "routing_project.error_views.permission_denied"
handler404 = "routing_project.error_views.not_found"
handler500 = "routing_project.error_views.server_error"
