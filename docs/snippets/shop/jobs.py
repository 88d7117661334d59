# shop/jobs.py: discovered in every installed app, as admin.py is
from django.core.mail import send_mail

from django_rws_jobs import job


@job("shop.send_receipt", queue="mailers", max_retries=5)
def send_receipt(payload: str) -> None:
    """Email the receipt of an order. The payload is the customer's address.

    Returning means success: the job's row is deleted. Raising means failure: the job is retried
    with backoff, and after its retries it waits on the dead-letter list.
    """
    send_mail("Your receipt", "Thank you for your order.", "shop@example.com", [payload])
