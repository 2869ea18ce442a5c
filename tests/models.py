from django.db import models


class Execution(models.Model):
    """A job body ran: written by the test jobs so tests can count real executions."""

    schedule = models.CharField(max_length=200)
    plan_time = models.DateTimeField()
    attempt = models.PositiveIntegerField()
    pid = models.PositiveIntegerField()
    executed_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.plan_time} by {self.pid}"
