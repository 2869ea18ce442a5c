"""OpenTelemetry: spans per run attempt and planning pass (``OPENTELEMETRY``)."""


def follow() -> None:
    """Connect the receivers if the setting is on (to be written)."""
