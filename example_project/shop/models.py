from django.db import models


class Order(models.Model):
    email = models.EmailField()
    item = models.CharField(max_length=100)
    receipt_sent = models.BooleanField(default=False)
    shipped = models.BooleanField(default=False)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk}: {self.item} for {self.email}"


class Product(models.Model):
    """A row of the catalogue, written by the import's jobs."""

    sku = models.CharField(max_length=20, unique=True)
    name = models.CharField(max_length=100)
    stock = models.IntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.sku}: {self.name}"


class Import(models.Model):
    """One catalogue import: its rows run as a batch of jobs; the batch's callback fills summary."""

    rows = models.IntegerField()
    batch_id = models.CharField(max_length=64, blank=True)
    summary = models.CharField(max_length=200, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"import {self.pk}: {self.rows} rows"
