# A long job's checkpoint (its steps' results and its loops' cursors, running/checkpoints.py) and
# the times it was handed back at a worker's stop: ours, nullable, so such a row stays a valid row
# for the Rust crate, which neither reads nor writes them (a Rust worker runs it from the start).

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_rws_jobs", "0023_snoozes"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="checkpoint",
            field=models.TextField(
                blank=True, editable=False, help_text="JSON: steps' results and loops' cursors", null=True
            ),
        ),
        migrations.AddField(
            model_name="job",
            name="resumptions",
            field=models.IntegerField(
                blank=True, editable=False, help_text="times it was handed back at a stop", null=True
            ),
        ),
    ]
