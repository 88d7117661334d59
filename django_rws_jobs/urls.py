"""``path("rws/", include("django_rws_jobs.urls"))``: ``rws/metrics``, the Prometheus endpoint
(prometheus.py; the ``prometheus`` extra)."""

from django.urls import path

from .operations.prometheus import metrics_view

app_name = "django_rws_jobs"
urlpatterns = [path("metrics", metrics_view, name="metrics")]
