import json

from django.db import transaction
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

import django_rws_jobs as rws
from django_rws_jobs import enqueue

from .models import Import, Order
from .tasks import count_orders


def home(request: HttpRequest) -> HttpResponse:
    imports = list(Import.objects.order_by("-pk")[:5])
    for imp in imports:
        imp.batch = rws.get_batch(imp.batch_id)  # its state and counts; None once pruned
        imp.ended = imp.batch.total - imp.batch.pending if imp.batch else 0
    context = {"orders": Order.objects.order_by("-pk")[:20], "imports": imports}
    return render(request, "shop/home.html", context)


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


#: Rows per job of an import.
CHUNK = 50


@require_POST
def import_products(request: HttpRequest) -> HttpResponse:
    # A few hundred catalogue rows as a batch of jobs, CHUNK rows each; once all have ended the
    # batch enqueues its callback, which writes the import's summary.
    count = min(int(request.POST.get("rows") or 300), 5000)
    rows = [{"sku": f"SKU-{n:05}", "name": f"product {n}", "stock": n % 17} for n in range(1, count + 1)]
    with transaction.atomic():
        imp = Import.objects.create(rows=count)
        done = rws.call("shop.import_done", str(imp.pk))
        with rws.batch(
            on_finish=done, description=f"import {imp.pk}: {count} rows", metadata={"import": imp.pk}
        ) as b:
            b.enqueue_many(
                ("shop.import_rows", json.dumps(rows[i : i + CHUNK])) for i in range(0, count, CHUNK)
            )
        Import.objects.filter(pk=imp.pk).update(batch_id=b.id)
    return redirect("home")


@require_POST
def ship_order(request: HttpRequest) -> HttpResponse:
    # A chain: pack, then ship, then send the receipt, each step once the one before succeeded.
    with transaction.atomic():
        order = Order.objects.create(email="chain@example.com", item="kettle")
        pk = str(order.pk)
        rws.chain(
            rws.call("shop.pack_order", pk),
            rws.call("shop.ship_order", pk),
            rws.call("shop.send_receipt", pk),
        )
    return redirect("home")
