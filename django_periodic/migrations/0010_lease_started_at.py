from django.db import migrations, models
from django.db.models import F


def held_leases_started(apps, schema_editor):
    """Leases held when migrating were taken by a version that did not mark starts: take
    them as started, so that the sweeper applies their schedule's reentry policy, as it did."""
    Lease = apps.get_model("django_periodic", "Lease")
    held = Lease.objects.using(schema_editor.connection.alias).filter(released_at__isnull=True)
    held.update(started_at=F("acquired_at"))


class Migration(migrations.Migration):
    dependencies = [
        ("django_periodic", "0009_schedule_bounds"),
    ]

    operations = [
        migrations.AddField(
            model_name="lease",
            name="started_at",
            field=models.DateTimeField(
                blank=True,
                help_text="When its job was called; empty: claimed, but the job never started.",
                null=True,
            ),
        ),
        migrations.RunPython(held_leases_started, migrations.RunPython.noop),
    ]
