#!/usr/bin/env python3
"""Install lmserve into .venv and serve the default model: ``python3 scripts/serve.py [lmserve args]``."""

import os
import sys

from bootstrap import ROOT, ensure_venv, environment

if __name__ == "__main__":
    python = ensure_venv("requirements.txt")
    args = [str(python), str(ROOT / "manage.py"), "lmserve", *sys.argv[1:]]
    os.chdir(ROOT)
    os.execve(str(python), args, environment())
