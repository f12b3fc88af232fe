"""`python -m benchmarks ...` (from the repository root): see benchmarks/__init__.py and --help."""

from benchmarks.cli import main

if __name__ == "__main__":
    main()
