from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from django_rws_jobs import enqueue

from .models import Order
from .tasks import count_orders


def home(request: HttpRequest) -> HttpResponse:
    return render(request, "shop/home.html", {"orders": Order.objects.order_by("-pk")[:20]})


@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    # The order and its receipt job commit together, or not at all.
    with transaction.atomic():
        order = Order.objects.create(
            email=request.POST.get("email") or "buyer@example.com", item=request.POST.get("item") or "teapot"
        )
        enqueue("shop.send_receipt", str(order.pk), unique=f"receipt:{order.pk}")
        count_orders.enqueue(order.item)  # a django.tasks task, in the same transaction
    return redirect("home")


@require_POST
def place_broken_order(request: HttpRequest) -> HttpResponse:
    # A job whose handler always fails: after its retries it lands on the dead-letter list.
    with transaction.atomic():
        order = Order.objects.create(email="broken@example.com", item="broken card")
        enqueue("shop.charge_card", str(order.pk))
    return redirect("home")
