"""Upgrades without downtime: the previous release keeps working on this release's schema.

During a rolling deploy, ``migrate`` runs first and processes of the previous release go on
inserting rows that do not name the columns added since. Every NOT NULL column whose value the
code supplies therefore needs a database default too (docs/deployment.md, "Upgrading").
"""

from django.apps import apps
from django.db.models import Field, Model
from django.db.models.expressions import Value

# Columns without a database default, each because every release that can meet this schema
# passes its value on every insert, so no process ever leaves it to the database.
EXEMPT = {
    # The project's TIME_ZONE: a migration cannot carry a setting, and a fixed zone would
    # differ from the Python default. Every release has set it since the table's first
    # migration.
    ("Schedule", "timezone"): "every release sets it; its value is a setting",
    ("Calendar", "timezone"): "every release sets it; its value is a setting",
    # The lease's guard, a fresh uuid4 that the claim itself writes (in SQL on PostgreSQL):
    # every release passes it, and RandomUUID() would be PostgreSQL only.
    ("Lease", "token"): "every release's claim writes it",
}


def code_supplied(field: Field) -> bool:
    """Whether Django fills the field in when an insert does not name it: a ``default``, the
    empty string of a blank text field, or ``auto_now``/``auto_now_add``."""
    if field.null or field.primary_key:
        return False
    blank_text = field.blank and field.empty_strings_allowed
    auto = getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False)
    return field.has_default() or blank_text or auto


def code_supplied_fields() -> list[tuple[type[Model], Field]]:
    config = apps.get_app_config("django_periodic")
    return [
        (model, field)
        for model in config.get_models()
        for field in model._meta.concrete_fields
        if code_supplied(field)
    ]


def test_every_column_the_code_supplies_has_a_database_default():
    missing = [
        f"{model.__name__}.{field.name}"
        for model, field in code_supplied_fields()
        if not field.has_db_default() and (model.__name__, field.name) not in EXEMPT
    ]
    assert not missing, f"without a database default (add db_default= beside default=): {missing}"


def test_every_exemption_names_a_field_without_a_database_default():
    """A stale exemption would hide nothing, but would say something untrue."""
    fields = {(model.__name__, field.name): field for model, field in code_supplied_fields()}
    for key in EXEMPT:
        assert key in fields, key
        assert not fields[key].has_db_default(), key


def test_database_defaults_equal_the_python_ones():
    """Where both are constants, a row the database completes reads as one the code made."""
    for model, field in code_supplied_fields():
        db_default = field.db_default
        if not isinstance(db_default, Value) or not field.has_default():
            continue  # an expression (Now()), or no db_default (the exemptions)
        default = field.default() if callable(field.default) else field.default
        assert db_default.value == default, f"{model.__name__}.{field.name}"
