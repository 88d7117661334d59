"""The shop's job handlers, discovered by django_rws_jobs like admin.py is by the admin."""

import json
import logging
import time

from django.conf import settings

from django_rws_jobs import current_job, job

from .models import Import, Order, Product

logger = logging.getLogger(__name__)


@job("shop.send_receipt", queue="mailers", max_retries=3)
def send_receipt(payload: str) -> None:
    order = Order.objects.get(pk=int(payload))
    logger.info("sending the receipt for %s", order)
    Order.objects.filter(pk=order.pk).update(receipt_sent=True)


@job("shop.charge_card", max_retries=1)
def charge_card(payload: str) -> None:
    # The card processor is always down in this example: the job ends on the dead-letter list.
    raise ConnectionError(f"payment gateway unreachable while charging order {payload}")


@job("shop.stock_report")
def stock_report(payload: str) -> None:
    logger.info("stock report: %d orders so far", Order.objects.count())


@job("shop.import_rows", queue="imports")
def import_rows(payload: str) -> None:
    # One member of an import's batch: a chunk of rows, reporting its progress as it goes (the
    # admin's job page draws it as a bar while the job runs).
    rows = json.loads(payload)
    job = current_job()
    for i, row in enumerate(rows, 1):
        Product.objects.update_or_create(
            sku=row["sku"], defaults={"name": row["name"], "stock": row["stock"]}
        )
        job.progress(i, len(rows), f"row {row['sku']}")
        time.sleep(settings.SHOP_IMPORT_ROW_SECONDS)  # slow enough to watch the bars move


@job("shop.import_done")
def import_done(payload: str) -> None:
    # The batch's callback: runs once, when every chunk has ended.
    batch = current_job().batch
    summary = f"{batch.succeeded} of {batch.total} chunks imported; {Product.objects.count()} products"
    Import.objects.filter(pk=int(payload)).update(summary=summary)
    logger.info("import %s: %s", payload, summary)


# A chain: pack, then ship, then send the receipt; each step starts once the one before succeeded.
@job("shop.pack_order")
def pack_order(payload: str) -> None:
    logger.info("packing order %s", payload)


@job("shop.ship_order")
def ship_order(payload: str) -> None:
    Order.objects.filter(pk=int(payload)).update(shipped=True)
