# A backfilled run takes its plan time in the ledger as a scheduled fire does: the database
# keeps a backfill and the planner (or two backfills) from recording the same plan time twice.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_periodic', '0007_revisions_and_retention'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='run',
            name='periodic_run_once_per_plan_time',
        ),
        migrations.AddConstraint(
            model_name='run',
            constraint=models.UniqueConstraint(condition=models.Q(('trigger__in', ('schedule', 'backfill'))), fields=('schedule', 'scope', 'plan_time'), name='periodic_run_once_per_plan_time'),
        ),
    ]
