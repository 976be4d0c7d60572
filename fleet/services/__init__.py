"""The fleet app's services: the build jobs (in-process, in a thread or on Celery), the per-document
fan-out seam, and what the admin draws. Commands, tasks and admin views are thin over these.

``fanout`` imports nothing from Django, so the Django-free builders (``fleet.fleets``) can call it.
"""
