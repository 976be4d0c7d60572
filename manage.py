#!/usr/bin/env python
"""Django's command-line utility for lmserve."""

import os
import signal
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "lmserve_site.settings")
    # OpenBLAS threads spin after each call and starve numba's threads on the next kernel
    # (~20x slower alternation on 2 cores); a short spin fixes it. Must precede numpy's import.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
    # A shell without job control starts background jobs with SIGINT ignored, and the ignore
    # is inherited: a server started that way (runserver: its reactor only takes over a default
    # handler) would never stop on SIGINT. Every command here stops on it, however started.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
