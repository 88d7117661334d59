# shop/tasks.py
from django.core.mail import send_mail
from django.tasks import task


@task(queue_name="default", priority=10)
def send_receipt_task(email: str) -> str:
    send_mail("Your receipt", "Thank you for your order.", "shop@example.com", [email])
    return email
