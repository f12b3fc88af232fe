#!/usr/bin/env python
"""Kept for old commands: runs `python -m benchmarks` with the same flags (see benchmarks/__init__.py).

`benchmarks` is importable from the repository root, which `python -m` puts on sys.path; this
script's own sys.path starts with scripts/, so it hands over to that command instead of importing.
"""

import os
import sys
from pathlib import Path

if Path.cwd().resolve() != Path(__file__).resolve().parent.parent:
    sys.exit(f"run from the repository root ({Path(__file__).resolve().parent.parent}): "
             "python -m benchmarks [flags]  (or python scripts/benchmark.py [flags])")
os.execv(sys.executable, [sys.executable, "-m", "benchmarks", *sys.argv[1:]])
