from django.db import models


class Order(models.Model):
    email = models.EmailField()
    item = models.CharField(max_length=100)
    receipt_sent = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk}: {self.item} for {self.email}"
