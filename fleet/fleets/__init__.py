"""Fleets: one cartridge per document, composed per request (Django-free)."""
