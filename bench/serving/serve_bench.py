#!/usr/bin/env python3
"""Serving benchmark entry point; `tandem bench serve ARGS...` runs this script with ARGS.
See `python3 bench/serving/serve_bench.py --help` and docs/benchmarks.md."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from servebench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
