"""A plain admin for the ledger; the scheduling console proper comes with its own issue."""

from django.contrib import admin

from django_periodic.forms import ScheduleForm
from django_periodic.models import Lease, Run, Schedule, SchedulerProcess
from django_periodic.registry import JOB_FIELDS, POLICY_FIELDS, TRIGGER_FIELDS


@admin.register(Schedule)
class ScheduleAdmin(admin.ModelAdmin):
    form = ScheduleForm
    fieldsets = [
        (None, {"fields": ["name", "job", *JOB_FIELDS, "enabled"]}),
        ("Trigger (set one of cron, interval or run at)", {"fields": TRIGGER_FIELDS}),
        ("Policies", {"fields": POLICY_FIELDS}),
        ("State", {"fields": ["next_fire_at", "last_error", "defined_in", "created_at"]}),
    ]
    list_display = ["name", "job", "trigger_text", "timezone", "enabled", "next_fire_at"]
    list_filter = ["enabled", "job", "overlap", "misfire"]
    search_fields = ["name", "job"]
    readonly_fields = ["next_fire_at", "last_error", "defined_in", "created_at"]
    actions = ["run_now"]

    @admin.display(description="trigger")
    def trigger_text(self, schedule: Schedule) -> str:
        if schedule.cron:
            return schedule.cron
        if schedule.interval is not None:
            return f"every {schedule.interval}"
        return f"once at {schedule.run_at}"

    @admin.action(description="Run selected schedules now", permissions=["change"])
    def run_now(self, request, queryset):
        for schedule in queryset:
            schedule.run_now()
        self.message_user(request, f"Requested {len(queryset)} runs.")


class LeaseInline(admin.TabularInline):
    model = Lease
    extra = 0
    can_delete = False
    fields = ["attempt", "holder", "acquired_at", "heartbeat_at", "expires_at", "released_at"]
    readonly_fields = fields

    def has_add_permission(self, request, obj=None):
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = ["schedule", "plan_time", "trigger", "status", "attempt", "started_at"]
    list_filter = ["status", "trigger", "schedule"]
    list_select_related = ["schedule"]
    search_fields = ["schedule__name", "job_name", "error_message"]
    date_hierarchy = "plan_time"
    inlines = [LeaseInline]


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = ["run", "attempt", "holder", "acquired_at", "expires_at", "outcome"]
    list_filter = ["outcome"]
    list_select_related = ["run"]


@admin.register(SchedulerProcess)
class SchedulerProcessAdmin(ReadOnlyAdmin):
    list_display = ["host", "pid", "started_at", "heartbeat_at"]
