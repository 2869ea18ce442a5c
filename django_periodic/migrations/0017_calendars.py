# Calendars and business days.

import django_periodic.models.calendars
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('django_periodic', '0016_schedule_alerts'),
    ]

    operations = [
        migrations.AddField(
            model_name='schedule',
            name='on_closed_day',
            field=models.CharField(choices=[('skip', 'skip it'), ('next_open_day', 'run it on the next open day, at its time of day'), ('previous_open_day', 'run it on the previous open day, at its time of day')], default='skip', help_text='A fire on a closed day: skipped, or run on the next or previous open day.', max_length=20),
        ),
        migrations.CreateModel(
            name='Calendar',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=200)),
                ('timezone', models.CharField(default=django_periodic.models.calendars._default_timezone, help_text='Its days are days here.', max_length=64)),
                ('holidays_country', models.CharField(blank=True, help_text="Closed on this country's public holidays (ISO code, e.g. DE); needs the holidays package.", max_length=8)),
                ('holidays_subdivision', models.CharField(blank=True, help_text='A state or province of it, e.g. BY.', max_length=16)),
                ('closed_weekdays', models.JSONField(blank=True, default=list, help_text='0 (Monday) to 6 (Sunday), e.g. [5, 6].')),
                ('closed_dates', models.JSONField(blank=True, default=list, help_text='Dates, e.g. ["2026-12-24", "2026-12-31"].')),
                ('blackouts', models.JSONField(blank=True, default=list, help_text='Periods, e.g. [{"start": "2026-12-18T18:00+01:00", "end": "2027-01-04T06:00+01:00", "reason": "year-end freeze"}].')),
                ('updated_at', models.DateTimeField(auto_now=True)),
            ],
            options={
                'ordering': ['name'],
                'constraints': [models.UniqueConstraint(fields=('name',), name='periodic_calendar_name_unique')],
            },
        ),
        migrations.AddField(
            model_name='schedule',
            name='calendars',
            field=models.ManyToManyField(blank=True, help_text='Its fires on the days these close, or in their blackouts, do not run.', related_name='schedules', to='django_periodic.calendar'),
        ),
    ]
