# A lease names its process while held only: released leases leave the index on process, and
# a process's row goes without rewriting its history. Leases released before this keep their
# process until that process's row goes (as before: SET_NULL).

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_periodic', '0017_calendars'),
    ]

    operations = [
        migrations.AlterField(
            model_name='lease',
            name='process',
            field=models.ForeignKey(blank=True, db_index=False, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='leases', to='django_periodic.schedulerprocess'),
        ),
        migrations.AddIndex(
            model_name='lease',
            index=models.Index(condition=models.Q(('process__isnull', False)), fields=['process'], name='periodic_lease_process'),
        ),
    ]
