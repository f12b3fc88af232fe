"""The current results of each benchmark: one file per benchmark, benchmarks/results/<benchmark>.json.

Each file holds {"benchmark": name, ..., "runs": [entry, ...]}: the latest entry per machine (and precision, size)
for the speed benchmarks, every run of the current config for the quality one. A benchmark run with `--record`
puts its entry in, replacing the entry it supersedes (same key), and leaves the others; older figures stay in git.
The tables of README.md and docs/results.md are made from these files (`python -m benchmarks.tables`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def results_path(benchmark: str, results_dir: str | Path | None = None) -> Path:
    """benchmarks/results/<benchmark>.json (or under `results_dir`)."""
    return Path(results_dir or RESULTS_DIR) / f"{benchmark}.json"


def load(benchmark: str, results_dir: str | Path | None = None) -> dict:
    """The benchmark's results file, or an empty one ({"benchmark": name, "runs": []}) where none exists yet.

    Raises:
        ValueError: the file exists but is not a results file (no "runs" list).
    """
    path = results_path(benchmark, results_dir)
    if not path.is_file():
        return {"benchmark": benchmark, "runs": []}
    result = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(result, dict) or not isinstance(result.get("runs"), list):
        raise ValueError(f"{path} is not a results file (no 'runs' list)")
    return result


def record(benchmark: str, entries: list[dict], key: Callable[[dict], tuple], results_dir: str | Path | None = None,
           **fields) -> Path:
    """Put `entries` into the benchmark's results file: each replaces the run with the same `key(run)`, or is added;
    `fields` (e.g. the command that makes the runs) are set at the top of the file. Returns the file's path.

    Raises:
        ValueError: the existing file is not a results file.
    """
    result = load(benchmark, results_dir)
    result.update(fields)
    runs = result["runs"]
    for entry in entries:
        same = [i for i, run in enumerate(runs) if key(run) == key(entry)]
        if same:
            runs[same[0]] = entry
            for i in reversed(same[1:]):
                del runs[i]
        else:
            runs.append(entry)
    path = results_path(benchmark, results_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def stamped(entry: dict) -> dict:
    """`entry` with the commit and the date (UTC) of the checkout it was measured in, where it has none."""
    import datetime

    from benchmarks.quality import git_commit

    return {"commit": git_commit(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            **entry}


RECORD_HELP = "also put the result into benchmarks/results/{name}.json (replacing the entry of this CPU{more})"


def cpu_of(entry: dict) -> str | None:
    """The CPU model an entry was measured on, wherever its benchmark keeps it."""
    return entry.get("cpu_model") or (entry.get("machine") or {}).get("cpu_model")
