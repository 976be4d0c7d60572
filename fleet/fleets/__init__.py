"""Fleets: one cartridge per document, a retrieval index through the model itself, and the
prefix source that composes the retrieved documents' cartridges per conversation.

Django-free, like fleet.cartridges: the worker, the commands and the Celery tasks use it.
"""
