"""Channels HTTP consumers: one per dialect, plus models, health and not-found."""
