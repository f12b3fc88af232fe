"""Run-to-run spread of the quality side by side: several runs per model, their means, and the margin between them.

One run of the main job is one draw: the training-time budget ends at a step count that depends on the host's
speed, the seed picks the initial weights and the order of the batches, and on Multi30k single runs of one config
differ by about 1 BLEU on test_2016_flickr. A margin between two models of that size needs several runs per side.

Run from the repository root, after runs of `python -m benchmarks.quality` (with `--seed N` to vary the seed):
    python -m benchmarks.quality_spread outputs/seed1/quality.json outputs/seed2/quality.json
    python -m benchmarks.quality_spread benchmarks/results/quality.json --cpu "model 207"
    python -m benchmarks.quality_spread outputs/pair5/quality.json --record   # into benchmarks/results/quality.json

Each SOURCE is one of:
- a quality.json written by `python -m benchmarks.quality`: every run in it;
- a list of runs in the form this command writes (benchmarks/results/quality.json): every run in it;
- `FILE.json:SIDE` (SIDE ours or marian): that run only;
- a run folder of the main job (its all_results.json), optionally `FOLDER=COMMIT` to record the commit it was
  trained at; its side is read from its config.json (model_type marian, or ours).

Prints one Markdown table: each run's steps, seed, val BLEU and test BLEU per test set, then per side the mean, the
sample standard deviation and the range, and the difference of the means (ours minus Marian) with its standard
error, sqrt(s_ours^2 / n_ours + s_marian^2 / n_marian) (Welch). Writes the figures to --output_json.

`--cpu TEXT` keeps the runs whose CPU model contains TEXT. `--record` adds the runs to
benchmarks/results/quality.json (the current config's runs, from which README's and docs/results.md's tables are
made: `python -m benchmarks.tables`), replacing a run of the same side, commit, seed and CPU.

Raises (exits with a message): a source that does not exist or holds no finished run; quality.json files from
different CPU models (speeds, and so the steps a budget reaches, compare on one CPU only); a side with no run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import shlex
import statistics
import sys
from pathlib import Path

from benchmarks.quality import SIDES, TEST_SETS, read_run


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.quality_spread", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("sources", nargs="+", metavar="SOURCE",
                   help="quality.json, FILE.json:SIDE, or a run folder (FOLDER or FOLDER=COMMIT)")
    p.add_argument("--output_json", default=None, help="where to write the figures (default: print only)")
    p.add_argument("--cpu", default=None, help="keep only the runs whose CPU model contains this text")
    p.add_argument("--record", action="store_true",
                   help="add the runs to benchmarks/results/quality.json (runs of the current config only)")
    return p.parse_args(argv)


def _seed(command: str | None) -> int | None:
    """The --seed a run's command passed, or None (the config's seed)."""
    if not command:
        return None
    words = shlex.split(command)
    seeds = [words[i + 1] for i, word in enumerate(words[:-1]) if word == "--seed"]
    seeds += [word.split("=", 1)[1] for word in words if word.startswith("--seed=")]
    return int(seeds[-1]) if seeds else None


def _folder_seed(folder: str) -> int | None:
    """The seed a run folder was trained with (its training_args.bin), or None where it cannot be read."""
    try:
        import torch

        return int(torch.load(Path(folder) / "training_args.bin", weights_only=False).seed)
    except Exception:  # noqa: BLE001 - a folder without readable training arguments records no seed
        return None


def _folder_date(folder: str) -> str:
    """When the run finished: its all_results.json's time, UTC, as the other runs' dates are written."""
    stamp = (Path(folder) / "all_results.json").stat().st_mtime
    return datetime.datetime.fromtimestamp(stamp, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def load_source(source: str) -> list[dict]:
    """The runs a SOURCE names, each a dict with side, source, commit, cpu_model, seed, steps, eval_bleu and
    test_sets ({split: {bleu, chrf}}).

    Raises:
        ValueError: the source does not exist, names an unknown side, or holds no finished run.
    """
    path, _, suffix = source.partition("=")
    if Path(path).is_dir():
        run = read_run(path)
        if run is None:
            raise ValueError(f"{path} holds no all_results.json: not a finished run of the main job")
        side = "marian" if run["model_type"] == "marian" else "ours"
        return [{**run, "side": side, "source": path, "commit": suffix or None, "cpu_model": None,
                 "seed": _folder_seed(path), "date": _folder_date(path)}]
    path, side = source, ""
    if not Path(source).is_file() and ":" in source:
        path, _, side = source.rpartition(":")
    if not Path(path).is_file():
        raise ValueError(f"{source}: no such file or run folder")
    if side and side not in SIDES:
        raise ValueError(f"{source}: unknown side {side!r} (choose from {', '.join(SIDES)})")
    result = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(result, dict) or "runs" not in result:
        raise ValueError(f"{path} is not a quality.json written by python -m benchmarks.quality")
    if isinstance(result["runs"], list):  # runs as this command writes them (benchmarks/results/quality.json)
        runs = [{**run, "source": run.get("source") or path} for run in result["runs"]
                if not side or run["side"] == side]
        if not runs:
            raise ValueError(f"{source}: no finished run" + (f" of {side}" if side else ""))
        return runs
    runs = []
    for name, run in result["runs"].items():
        if run is None or (side and name != side):
            continue
        seed = _seed(run.get("command"))
        if seed is None:  # a report of runs made earlier: the seed passed to both, else the config's
            seed = _seed(shlex.join(result.get("passthrough") or []))
        runs.append({**run, "side": name, "source": f"{path}:{name}", "commit": result.get("commit"),
                     "cpu_model": (result.get("machine") or {}).get("cpu_model"), "seed": seed,
                     "date": result.get("date")})
    if not runs:
        raise ValueError(f"{source}: no finished run" + (f" of {side}" if side else ""))
    return runs


def _score(run: dict, name: str) -> float | None:
    """A run's BLEU on `name`: "val" (the kept weights' validation BLEU) or a test set; None where it has none."""
    return run["eval_bleu"] if name == "val" else (run["test_sets"].get(name) or {}).get("bleu")


def spread(values: list[float]) -> dict | None:
    """n, mean, sample standard deviation (None for one value), min and max of a list of scores; None for none."""
    if not values:
        return None
    return {"n": len(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None, "min": min(values), "max": max(values)}


def summarise(runs: list[dict]) -> dict:
    """Per side and per score (val BLEU, each test set's BLEU): the spread; and per score the difference of the means
    (ours minus Marian) with its Welch standard error (None unless both sides have two runs or more).

    Raises:
        ValueError: runs from different CPU models, or a side without runs.
    """
    cpus = sorted({run["cpu_model"] for run in runs if run["cpu_model"]})
    if len(cpus) > 1:
        raise ValueError(f"runs from different CPUs ({'; '.join(cpus)}): compare runs of one CPU only")
    missing = [side for side in SIDES if not any(run["side"] == side for run in runs)]
    if missing:
        raise ValueError(f"no run of {' or '.join(missing)}: the margin needs runs of both sides")
    scores = ["val", *TEST_SETS]
    per_side = {side: {name: spread([_score(r, name) for r in runs if r["side"] == side
                                     and _score(r, name) is not None])
                       for name in scores}
                for side in SIDES}
    margin = {}
    for name in scores:
        ours, marian = per_side["ours"][name], per_side["marian"][name]
        if ours is None or marian is None:
            margin[name] = {"difference": None, "standard_error": None}
            continue
        error = (math.sqrt(ours["std"] ** 2 / ours["n"] + marian["std"] ** 2 / marian["n"])
                 if ours["std"] is not None and marian["std"] is not None else None)
        margin[name] = {"difference": ours["mean"] - marian["mean"], "standard_error": error}
    return {"cpu_model": cpus[0] if cpus else None, "sides": per_side, "margin": margin}


def _f(value, spec=".2f") -> str:
    return "-" if value is None else format(value, spec)


def markdown_table(runs: list[dict], summary: dict) -> str:
    scores = ["val", *TEST_SETS]
    lines = [f"## Run-to-run spread: ours and Marian (CPU {summary['cpu_model'] or 'not recorded'})", "",
             "| model | source | commit | seed | steps | " + " | ".join(f"{name} BLEU" for name in scores) + " |",
             "|---|---|---|---:|---:|" + "---:|" * len(scores)]
    for run in sorted(runs, key=lambda r: SIDES.index(r["side"])):
        values = [_score(run, name) for name in scores]
        lines.append(f"| {run['side']} | {run['source']} | {run['commit'] or '-'} | "
                     f"{run['seed'] if run['seed'] is not None else 'config'} | {_f(run['steps'], 'd')} | "
                     + " | ".join(_f(v) for v in values) + " |")
    lines += ["", "| | " + " | ".join(f"{name} BLEU" for name in scores) + " |", "|---|" + "---:|" * len(scores)]
    for side in SIDES:
        cells = []
        for name in scores:
            s = summary["sides"][side][name]
            if s is None:
                cells.append("-")
                continue
            cells.append(f"{s['mean']:.2f} ± {_f(s['std'])} ({s['min']:.2f}-{s['max']:.2f}, n {s['n']})")
        lines.append(f"| {side}: mean ± std (range, n) | " + " | ".join(cells) + " |")
    cells = ["-" if summary["margin"][name]["difference"] is None else
             f"**{summary['margin'][name]['difference']:+.2f}** ± {_f(summary['margin'][name]['standard_error'])}"
             for name in scores]
    lines.append("| ours minus Marian: difference of the means ± standard error | " + " | ".join(cells) + " |")
    lines += ["", "Standard deviations are the sample ones (n - 1); the standard error of the difference is Welch's."]
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    runs = [run for source in args.sources for run in load_source(source)]
    if args.cpu:
        runs = [run for run in runs if args.cpu in (run["cpu_model"] or "")]
        if not runs:
            raise ValueError(f"no run on a CPU whose model contains {args.cpu!r}")
    if args.record:
        from benchmarks import record
        from benchmarks.quality import machine

        here = machine().get("cpu_model")  # a run folder does not say its CPU: recorded where it ran, here
        runs = [{**run, "cpu_model": run["cpu_model"] or here} for run in runs]
        path = record.record("quality", [{k: v for k, v in run.items() if k not in ("folder", "wall_seconds")}
                                         for run in runs],
                             key=lambda run: (run["side"], run["commit"], run["seed"], run["cpu_model"]))
        print(f"[quality_spread] recorded {len(runs)} run(s) in {path}", file=sys.stderr)
        if len({run["side"] for run in runs}) < 2:  # one side recorded: no margin to report
            return {"runs": runs}
    summary = summarise(runs)
    result = {
        "command": shlex.join([sys.executable, "-m", "benchmarks.quality_spread",
                               *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "runs": runs, **summary,
    }
    result["table"] = markdown_table(runs, summary)
    print(result["table"])
    if args.output_json:
        Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output_json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        print(f"[quality_spread] wrote {args.output_json}", file=sys.stderr)
    return result


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as error:
        sys.exit(f"python -m benchmarks.quality_spread: error: {error}")
