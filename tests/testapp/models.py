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


class Item(models.Model):
    """A row a long job iterates over (tests/test_long_jobs.py)."""

    group = models.CharField(max_length=20)
    number = models.IntegerField()
    code = models.CharField(max_length=20, null=True)


class Effect(models.Model):
    """A write an atomic step makes (tests/test_long_jobs.py): it must commit exactly once."""

    name = models.CharField(max_length=40)
