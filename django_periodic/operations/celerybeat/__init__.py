"""Importing celery beat's schedules: django-celery-beat's rows (``rows``, ``tables``), or a
``beat_schedule`` written in code (``code``); both map onto schedules the same way
(``applying``), or print the ``@job`` decorators that define them in code (``emitting``)."""
