from django.db import models


class Run(models.Model):
    """One handler run, written by the handler: what the tests count."""

    kind = models.CharField(max_length=20)
    payload = models.TextField()
    pid = models.IntegerField()
    at = models.DateTimeField(auto_now_add=True)


class Order(models.Model):
    """Stands for a user's data saved in the same transaction as an enqueue."""

    number = models.CharField(max_length=20)
