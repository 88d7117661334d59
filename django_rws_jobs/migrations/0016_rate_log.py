# The log of a rate limit's starts, rws_queue_starts: a ring of the last N start times of each
# rate-limited queue, so that at most N start in every interval of the limit's period, not only in
# windows aligned to the clock (limited_claims.py). rws_queues keeps the ring's size and next slot
# in place of the aligned window's start and count. MariaDB/MySQL: the queue's name compares
# exactly, as rws_queues.name does (0015).

from django.db import migrations, models

from django_rws_jobs.migrations import _exact

COLUMNS = {"queuestart": ["queue"]}


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0015_exact_names"),
    ]

    operations = [
        migrations.CreateModel(
            name="QueueStart",
            fields=[
                (
                    "pk",
                    models.CompositePrimaryKey(
                        "queue", "slot", blank=True, editable=False, primary_key=True, serialize=False
                    ),
                ),
                ("queue", models.CharField(max_length=64)),
                ("slot", models.IntegerField()),
                ("started_us", models.BigIntegerField(help_text="unix microseconds")),
            ],
            options={
                "verbose_name": "queue start",
                "verbose_name_plural": "queue starts",
                "db_table": "rws_queue_starts",
                "default_permissions": (),
            },
        ),
        migrations.RemoveField(
            model_name="queue",
            name="window_claims",
        ),
        migrations.RemoveField(
            model_name="queue",
            name="window_start",
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_next",
            field=models.IntegerField(db_default=0, default=0, help_text="the rate log's next slot"),
        ),
        migrations.AddField(
            model_name="queue",
            name="rate_slots",
            field=models.IntegerField(db_default=0, default=0, help_text="the rate log's size"),
        ),
        _exact.collate(COLUMNS),
    ]
