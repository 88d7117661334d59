from django.contrib import admin
from django.urls import include, path
from shop import views

urlpatterns = [
    path("", views.home, name="home"),
    path("orders/", views.place_order, name="place_order"),
    path("orders/broken/", views.place_broken_order, name="place_broken_order"),
    path("imports/", views.import_products, name="import_products"),
    path("orders/shipped/", views.ship_order, name="ship_order"),
    path("admin/", admin.site.urls),
    path("rws/", include("django_rws_jobs.urls")),  # rws/metrics: Prometheus, for staff sessions
]
