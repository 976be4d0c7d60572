#!/usr/bin/env python
"""Django's command-line utility for lmserve."""

import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lmserve_site.settings")
    # OpenBLAS threads spin after each call and starve numba's threads on the next kernel
    # (~20x slower alternation on 2 cores); a short spin fixes it. Must precede numpy's import.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
