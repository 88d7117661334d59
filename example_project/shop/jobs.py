"""The shop's job handlers, discovered by django_rws_jobs like admin.py is by the admin."""

import logging

from django_rws_jobs import job

from .models import Order

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
