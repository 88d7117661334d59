# shop/views.py
from django.db import transaction
from django.http import HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from django_rws_jobs import enqueue


@csrf_exempt  # the tutorial posts with curl, which has no CSRF token; your site's forms send one
@require_POST
def place_order(request):
    email = request.POST["email"]
    with transaction.atomic():  # the order and its job commit together, or neither does
        # order = Order.objects.create(email=email, ...)
        job_id = enqueue("shop.send_receipt", email, unique=f"receipt:{email}")
    return HttpResponse(f"receipt job {job_id}\n", status=202)
