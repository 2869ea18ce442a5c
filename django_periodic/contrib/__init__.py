"""Integrations with optional third-party packages, each importable only with its package."""
