"""The queue overview's entry on the admin index: its list page is the overview itself."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseRedirect
from django.urls import reverse

from ..models import Job, QueueOverview
from .common import ReadOnlyAdminMixin


@admin.register(QueueOverview)
class QueueOverviewAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    def _may_view(self, request: HttpRequest) -> bool:
        return request.user.has_perm(f"{Job._meta.app_label}.view_job")

    def has_module_permission(self, request: HttpRequest) -> bool:
        return self._may_view(request)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return self._may_view(request)

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        if not self._may_view(request):
            raise PermissionDenied
        return HttpResponseRedirect(
            reverse("admin:django_rws_jobs_job_overview", current_app=self.admin_site.name)
        )
