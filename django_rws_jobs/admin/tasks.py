"""django.tasks in the admin: a task row's task fields, and the read-only list of results."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.http import HttpRequest
from django.utils.safestring import SafeString
from django.utils.translation import gettext_lazy as _

from ..models import Job, TaskResultRecord
from ..queue.registry import TASK_PREFIX
from ..tasks import history
from .common import QueueDatabaseAdmin, ReadOnlyAdminMixin, links, pre, short_text, time_cell

#: The fields of a task row's "Task" fieldset.
TASK_FIELDS = ("task_path", "args", "kwargs", "task_errors", "worker_ids")


def _json(value: Any) -> SafeString | str:
    return pre(json.dumps(value, indent=2, ensure_ascii=False))


def _history(obj: Job | TaskResultRecord) -> dict[str, Any]:
    return history.load(obj.task_history if isinstance(obj, Job) else obj.history)


class TaskDetail:
    """Read-only fields of a task, on its job row and on its result: arguments, errors, workers."""

    @admin.display(description=_("args"))
    def args(self, obj: Job | TaskResultRecord) -> SafeString | str:
        return _json(history.load(obj.payload).get("args", []))

    @admin.display(description=_("kwargs"))
    def kwargs(self, obj: Job | TaskResultRecord) -> SafeString | str:
        return _json(history.load(obj.payload).get("kwargs", {}))

    @admin.display(description=_("errors of the attempts"))
    def task_errors(self, obj: Job | TaskResultRecord) -> SafeString | str:
        errors = _history(obj).get("errors") or []
        if not errors:
            return "-"
        return pre("\n\n".join(f"{e.get('exception_class_path')}\n{e.get('traceback', '')}" for e in errors))

    @admin.display(description=_("worker ids"))
    def worker_ids(self, obj: Job | TaskResultRecord) -> SafeString | str:
        return pre("\n".join(_history(obj).get("worker_ids") or [])) or "-"


class TaskFields(TaskDetail):
    """Shows a task row as its task: a "Task" fieldset on the job pages."""

    @admin.display(description=_("task"))
    def task_path(self, obj: Job) -> str:
        return obj.job_type[len(TASK_PREFIX) :]

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)  # type: ignore[misc]
        if obj is not None and obj.job_type.startswith(TASK_PREFIX):
            return (*fieldsets[:1], (_("Task"), {"fields": TASK_FIELDS}), *fieldsets[1:])
        return fieldsets


@admin.register(TaskResultRecord)
class TaskResultAdmin(TaskDetail, ReadOnlyAdminMixin, QueueDatabaseAdmin):
    """The results of tasks that succeeded, view only (pruned after RESULTS_RETENTION)."""

    list_display = ("id", "task_path", "queue", "finished", "value")
    list_filter = ("queue",)
    search_fields = ("id", "task_path")
    ordering = ("-finished_at",)
    show_full_result_count = False
    list_per_page = 50
    fields = (
        "id",
        "task_path",
        "queue",
        "priority",
        "args",
        "kwargs",
        "value_detail",
        "worker_ids",
        "task_errors",
    )
    readonly_fields = fields
    actions = None
    change_list_template = "django_rws_jobs/admin/taskresultrecord_change_list.html"

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> Any:
        context = {**links(request, self), "title": _("Task results")}
        return super().changelist_view(request, {**context, **(extra_context or {})})

    @admin.display(description=_("finished"), ordering="finished_at")
    def finished(self, obj: TaskResultRecord) -> SafeString | str:
        return time_cell(obj.finished_at)

    @admin.display(description=_("return value"))
    def value(self, obj: TaskResultRecord) -> SafeString | str:
        return short_text(obj.return_value)

    @admin.display(description=_("return value"))
    def value_detail(self, obj: TaskResultRecord) -> SafeString | str:
        return _json(history.load_value(obj.return_value))
