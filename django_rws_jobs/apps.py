from django.apps import AppConfig
from django.db.backends.signals import connection_created


class RwsJobsConfig(AppConfig):
    name = "django_rws_jobs"
    label = "django_rws_jobs"
    verbose_name = "Jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import models  # (loads the models; registers the system checks)
        from .database import clock  # (loads the models)
        from .database.connections import before_first_connections, configure_connection  # (loads the models)
        from .queue.registry import TASK_PREFIX, autodiscover, registry  # (imports the apps' jobs.py)

        models.queue_now = clock.now
        connection_created.connect(configure_connection, dispatch_uid="django_rws_jobs.configure_connection")
        before_first_connections()
        registry.row_runners[TASK_PREFIX] = "django_rws_jobs.tasks.rows.TaskRows"
        autodiscover()
