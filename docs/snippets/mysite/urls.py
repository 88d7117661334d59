# mysite/urls.py
from django.contrib import admin
from django.urls import path
from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("order/", views.place_order),
]
