"""Cartridges: trained KV prefixes, their file format and their initialisation.

Django-free (numpy + safetensors): the worker, the training code and the Celery tasks all use
these modules; the Django models in ``fleet.models`` only record where the files are.
"""
