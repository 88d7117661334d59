# shop/tasks.py
from django.core.mail import send_mail

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2: the backport, pip install "django-rws-jobs[tasks]"
    from django_tasks import task


@task(queue_name="default", priority=10)
def send_receipt_task(email: str) -> str:
    send_mail("Your receipt", "Thank you for your order.", "shop@example.com", [email])
    return email
