from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_periodic", "0010_lease_started_at"),
    ]

    operations = [
        migrations.AddField(
            model_name="schedulerprocess",
            name="locked_at",
            field=models.DateTimeField(
                blank=True,
                help_text=(
                    "When it last took its session lock (PostgreSQL), which tells others at "
                    "once that it died; empty: it holds none, and only its leases' expiry tells."
                ),
                null=True,
            ),
        ),
    ]
