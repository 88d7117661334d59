"""A django.tasks task beside the @job handlers: the same worker runs both."""

import logging

from django.tasks import task

from .models import Order

logger = logging.getLogger(__name__)


@task(queue_name="default")
def count_orders(item: str) -> int:
    """Count the orders of one item; the result is kept in rws_task_results for the admin."""
    count = Order.objects.filter(item=item).count()
    logger.info("%d order(s) of %s", count, item)
    return count
