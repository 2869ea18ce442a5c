from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_periodic", "0011_scheduler_process_locked_at"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="run",
            name="periodic_run_claimable",
        ),
        migrations.AddIndex(
            model_name="run",
            index=models.Index(
                condition=models.Q(("status__in", ["pending", "retrying"]), ("tasks_backend", "")),
                fields=["plan_time", "id"],
                name="periodic_run_claimable",
            ),
        ),
    ]
