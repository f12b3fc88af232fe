"""The results tables of README.md, docs/results.md and docs/compatibility.md, made from benchmarks/results/<benchmark>.json.

Run from the repository root:
    python -m benchmarks.tables           # rewrite every table between its markers in the docs
    python -m benchmarks.tables --check   # exit 1, naming the tables, where a doc differs from its file

A table lives in a document between `<!-- table:NAME -->` and `<!-- /table:NAME -->`; everything between the two
markers is generated, everything else is written by hand. tests/test_tables.py fails when a table is out of date,
so a figure is kept in exactly one place: its results file.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from pathlib import Path

from benchmarks import record

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = ("README.md", "docs/results.md", "docs/compatibility.md")
TEST_SETS = ("test_2016_flickr", "test_2017_flickr", "test_2017_mscoco")
# The results at a glance: one block per CPU model with runs of the current config, with native bf16 first (the
# precision the main job chose there tells which kind a CPU is); a side with no run there says so.
SIDE_NAMES = {"ours": "ours", "marian": "Marian"}


def short_cpu(name: str | None) -> str:
    """'Intel(R) Xeon(R) Processor (family 6 model 207)' -> 'Intel Xeon (family 6 model 207)'."""
    if not name:
        return "not recorded"
    return re.sub(r"\s+", " ", name.replace("(R)", "").replace(" Processor", "")).strip()


def _mean_std(values: list[float]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.fmean(values):.2f} ± {statistics.stdev(values):.2f}"


def _bleu(run: dict, name: str) -> float | None:
    return run.get("eval_bleu") if name == "val" else ((run.get("test_sets") or {}).get(name) or {}).get("bleu")


def _f(value, spec=".2f") -> str:
    return "-" if value is None else format(value, spec)


def glance_label(cpu: str | None, precision: str | None) -> str:
    """'AMD EPYC (family 25 model 17)', 'bf16' -> 'AMD EPYC (family 25 model 17), native bf16: bf16'."""
    kind = "native bf16" if precision == "bf16" else "no native bf16"
    return f"{short_cpu(cpu)}, {kind}: {precision or '-'}"


def quality_at_a_glance(quality: dict) -> list[str]:
    lines = ["| CPU (2 cores): precision | model | runs | steps in 25 min | test_2016_flickr | test_2017_flickr | "
             "test_2017_mscoco |", "|---|---|---:|---:|---:|---:|---:|"]
    precision = {}
    for run in quality["runs"]:
        precision.setdefault(run["cpu_model"], run.get("precision"))
    for cpu in sorted(precision, key=lambda c: (precision[c] != "bf16", short_cpu(c))):
        label = glance_label(cpu, precision[cpu])
        for side in ("ours", "marian"):
            mine = [run for run in quality["runs"] if run["cpu_model"] == cpu and run["side"] == side]
            if not mine:
                lines.append(f"| {label} | {SIDE_NAMES[side]} | 0 | - | no run yet | | |")
                continue
            steps = statistics.fmean(run["steps"] for run in mine)
            cells = [_mean_std([_bleu(run, name) for run in mine]) for name in TEST_SETS]
            lines.append(f"| {label} | {SIDE_NAMES[side]} | {len(mine)} | {steps:.0f} | " + " | ".join(cells) + " |")
    return lines


def quality_runs(quality: dict) -> list[str]:
    lines = ["| CPU | model | commit | date | seed | precision | steps | s/step | val BLEU | test_2016_flickr | "
             "test_2017_flickr | test_2017_mscoco |", "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for run in sorted(quality["runs"], key=lambda r: (r["cpu_model"] or "", r["side"] != "ours", r["date"] or "")):
        tests = []
        for name in TEST_SETS:
            scores = (run.get("test_sets") or {}).get(name) or {}
            tests.append(f"{_f(scores.get('bleu'))} / {_f(scores.get('chrf'))}")
        lines.append(f"| {short_cpu(run['cpu_model'])} | {SIDE_NAMES[run['side']]} | {run['commit']} | "
                     f"{(run.get('date') or '-')[:10]} | {_f(run.get('seed'), 'd')} | {run.get('precision') or '-'} | "
                     f"{run['steps']} | {_f(run.get('seconds_per_step'), '.3f')} | {_f(run.get('eval_bleu'))} | "
                     + " | ".join(tests) + " |")
    return lines


def quality_margins(quality: dict) -> list[str]:
    from benchmarks.quality_spread import summarise

    lines = ["| CPU | runs (ours + Marian) | val BLEU | test_2016_flickr | test_2017_flickr | test_2017_mscoco |",
             "|---|---|---:|---:|---:|---:|"]
    for cpu in sorted({run["cpu_model"] for run in quality["runs"]}):
        runs = [run for run in quality["runs"] if run["cpu_model"] == cpu]
        count = f"{sum(r['side'] == 'ours' for r in runs)} + {sum(r['side'] == 'marian' for r in runs)}"
        if len({run["side"] for run in runs}) < 2:  # no margin without runs of both sides
            lines.append(f"| {short_cpu(cpu)} | {count} | - | - | - | - |")
            continue
        summary = summarise(runs)
        cells = []
        for name in ("val", *TEST_SETS):
            margin = summary["margin"][name]
            cells.append("-" if margin["difference"] is None else
                         f"{margin['difference']:+.2f} ± {_f(margin['standard_error'])}")
        lines.append(f"| {short_cpu(cpu)} | {count} | " + " | ".join(cells) + " |")
    return lines


def job_step(result: dict) -> list[str]:
    lines = ["| CPU | precision | commit | date | ours ms/step | Marian ms/step | ours / Marian speed |",
             "|---|---|---|---|---:|---:|---:|"]
    for run in result["runs"]:
        figures = run["figures"]
        emulated = run["precision"] == "bf16" and (run.get("machine") or {}).get("native_bf16") is False
        precision = "bf16 (emulated)" if emulated else run["precision"]
        lines.append(f"| {short_cpu(record.cpu_of(run))} | {precision} | {run['commit']} | {run['date']} | "
                     f"{figures['ours']['mean_ms']:.0f} | {figures['marian']['mean_ms']:.0f} | "
                     f"{run['ours_over_marian']:.2f}x |")
    return lines


def inference_engines(result: dict) -> list[str]:
    lines = ["| CPU | commit | search | engine | sentences/s | BLEU | same output as generate() | speed-up |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for run in result["runs"]:
        for search, engines in run["searches"].items():
            for engine, figures in engines.items():
                lines.append(f"| {short_cpu(record.cpu_of(run))} | {run['commit']} | {search} | {engine} | "
                             f"{figures['sentences_per_second']:.1f} | {figures['bleu']:.2f} | "
                             f"{figures['same_as_torch'] * 100:.1f}% | {figures['speed_over_torch']:.2f}x |")
    return lines


def speed(result: dict) -> list[str]:
    lines = ["| CPU | commit | figure | ours (eager) tokens/s | ours (sdpa) tokens/s | Marian tokens/s | "
             "ours (eager) / Marian |", "|---|---|---|---:|---:|---:|---:|"]
    for run in result["runs"]:
        contenders = run["contenders"]
        for figure in run["settings"]["figures"]:
            rate = {name: ((contenders.get(name) or {}).get("figures", {}).get(figure) or {}).get(
                "tokens_per_s", {}).get("median") for name in ("ours-eager", "ours-sdpa", "marian")}
            ratio = rate["ours-eager"] / rate["marian"] if rate["ours-eager"] and rate["marian"] else None
            lines.append(f"| {short_cpu(record.cpu_of(run))} | {run['commit']} | {figure} | "
                         f"{_f(rate['ours-eager'], '.0f')} | {_f(rate['ours-sdpa'], '.0f')} | "
                         f"{_f(rate['marian'], '.0f')} | {_f(ratio)}x |")
    return lines


def data_scale(result: dict) -> list[str]:
    lines = ["| CPU | commit | pairs | minutes to the first step | peak memory (GB) | cached rerun (minutes) |",
             "|---|---|---:|---:|---:|---:|"]
    for run in result["runs"]:
        for size in run["sizes"]:
            rerun = size.get("rerun") or {}
            lines.append(f"| {short_cpu(record.cpu_of(run))} | {run['commit']} | {size['pairs']:,} | "
                         f"{size['first']['to_first_step_seconds'] / 60:.1f} | "
                         f"{size['first']['peak_rss_mb'] / 1024:.1f} | "
                         f"{_f(rerun.get('to_first_step_seconds') and rerun['to_first_step_seconds'] / 60)} |")
    return lines


def published(result: dict) -> list[str]:
    """Ours English→German beside published Multi30k figures (benchmarks/results/multi30k_en_de.json)."""
    lines = ["| model | direction | test_2016_flickr sacreBLEU | test_2016_flickr papers' BLEU (lowercased, Moses "
             "tokens) | decoding | trained |", "|---|---|---:|---:|---|---|"]
    for run in result["runs"]:
        scores = (run.get("test_sets") or {}).get("test_2016_flickr") or {}
        lines.append(f"| ours ({short_cpu(run.get('cpu_model'))}, {run.get('commit')}, {run.get('date', '-')[:10]}) | "
                     f"{run.get('languages', 'en->de')} | {_f(scores.get('bleu'))} | {_f(scores.get('papers_bleu'))} "
                     f"| beam 4 | {run.get('steps')} steps in 25 min, 2 CPU cores |")
    if not result["runs"]:
        lines.append("| ours | en->de | not run yet | not run yet | beam 4 | 25 min, 2 CPU cores |")
    for row in result.get("published", []):
        lines.append(f"| {row['model']} | {row['direction']} | - | {row['bleu']:.2f} | {row['decoding']} | "
                     f"{row['trained']} |")
    return lines


def activation_memory(result: dict) -> list[str]:
    """Activation memory kept for backward, with and without gradient checkpointing (benchmarks.activation_memory)."""
    lines = ["| CPU | device | commit | size | batch x (source + target) | plain MiB | checkpointed MiB | less | "
             "same loss | max grad diff |", "|---|---|---|---|---|---:|---:|---:|---|---:|"]
    for run in result["runs"]:
        s = run["settings"]
        lines.append(f"| {short_cpu(record.cpu_of(run))} | {run['device']} | {run['commit']} | d_model {s['d_model']}, "
                     f"{s['num_heads']} heads, {s['layers']}+{s['layers']} layers, d_ff {s['d_ff']}, vocab "
                     f"{s['vocab_size']} | {s['batch_size']} x ({s['source_length']} + {s['target_length']}) | "
                     f"{run['runs']['plain']['saved_for_backward_mib']:.1f} | "
                     f"{run['runs']['checkpointed']['saved_for_backward_mib']:.1f} | {run['saved_ratio']:.1f}x | "
                     f"{'yes' if run['same_loss'] else 'NO'} | {run['max_abs_grad_difference']:.1e} |")
    return lines


def exported_decoding(result: dict) -> list[str]:
    """The exported model (torch.export) against generate() and CTranslate2 (benchmarks.exported_decoding)."""
    lines = ["| CPU | commit | sentences | engine | same ids as generate() | same text | BLEU | sentences/s | x generate |",
             "|---|---|---:|---|---:|---:|---:|---:|---:|"]
    for run in result["runs"]:
        for engine, row in run["engines"].items():
            ids = f"{100 * row['same_ids_as_generate']:.1f}%" if "same_ids_as_generate" in row else "n/a"
            speed = (f"{row['sentences_per_second']:.1f} | {row['speed_over_generate']:.2f}x"
                     if "median_seconds" in row else "not timed | -")
            lines.append(f"| {short_cpu(record.cpu_of(run))} | {run['commit']} | {run['sentences']} | {engine} | {ids} | "
                         f"{100 * row['same_text_as_generate']:.1f}% | {row['bleu']:.2f} | {speed} |")
    return lines


def compiled_decoding(result: dict) -> list[str]:
    """generate() with the dynamic cache, the static cache, and the static cache compiled (benchmarks.compiled_decoding)."""
    lines = ["| CPU | commit | size, threads | model | batch | search | mode | new tokens/s | x dynamic | warm-up s | "
             "same tokens |", "|---|---|---|---|---:|---|---|---:|---:|---:|---|"]
    for run in result["runs"]:
        for r in run["rows"]:
            lines.append(f"| {short_cpu(record.cpu_of(run))} | {run['commit']} | {run['size']['name']}, {run['threads']} | "
                         f"{r['model']} | {r['batch_size']} | {r['search']} | {r['mode']} | "
                         f"{r['new_tokens_per_second']:.0f} | {r['speed_over_dynamic']:.2f} | "
                         f"{r['warm_up_seconds']:.1f} | {'yes' if r['same_tokens_as_dynamic'] else 'NO'} |")
    return lines


def gpu(result: dict) -> list[str]:
    """The GPU check, one row per check (benchmarks/gpu_check.py); rehearsals at tiny sizes are not kept here."""
    lines = ["| device | date, commit | torch, transformers | part | check | result | figures |",
             "|---|---|---|---|---|---|---|"]
    runs = [run for run in result["runs"] if run.get("size") == "full"]
    if not runs:
        return lines + ["| no GPU run yet | | | | | | |"]
    for run in runs:
        env = run["environment"]
        head = f"| {env['device_name']} | {run['date']}, {run['commit']} | {env['torch']}, {env['transformers']} |"
        for row in run["rows"]:
            result_ = "ok" if row["ok"] else ("-" if row["ok"] is None else "FAIL")
            lines.append(f"{head} {row['part']} | {row['check']} | {result_} | {row['figures']} |")
            head = "| | | |"
    return lines


TABLES = {
    "quality-at-a-glance": ("quality", quality_at_a_glance),
    "quality-runs": ("quality", quality_runs),
    "quality-margins": ("quality", quality_margins),
    "job-step": ("job_step", job_step),
    "inference-engines": ("inference_engines", inference_engines),
    "speed": ("speed", speed),
    "data-scale": ("data_scale", data_scale),
    "published": ("multi30k_en_de", published),
    "activation-memory": ("activation_memory", activation_memory),
    "exported-decoding": ("exported_decoding", exported_decoding),
    "compiled-decoding": ("compiled_decoding", compiled_decoding),
    "gpu": ("gpu", gpu),
}


def render(name: str, results_dir: str | Path | None = None) -> str:
    """The Markdown of table `name`, from its results file."""
    benchmark, make = TABLES[name]
    return "\n".join(make(record.load(benchmark, results_dir)))


def fill(text: str, results_dir: str | Path | None = None) -> tuple[str, list[str]]:
    """`text` with every marked table regenerated, and the names of the tables that changed.

    Raises:
        ValueError: a marker names no known table, or a table's closing marker is missing.
    """
    changed = []

    def replace(match: re.Match) -> str:
        name = match.group(1)
        if name not in TABLES:
            raise ValueError(f"unknown table {name!r} (known: {', '.join(TABLES)})")
        if match.group(3) != name:
            raise ValueError(f"table {name!r} is closed by <!-- /table:{match.group(3)} -->")
        table = render(name, results_dir)
        if match.group(2).strip() != table:
            changed.append(name)
        return f"<!-- table:{name} -->\n{table}\n<!-- /table:{name} -->"

    new = re.sub(r"<!-- table:([\w-]+) -->\n(.*?)<!-- /table:([\w-]+) -->", replace, text, flags=re.S)
    opened, closed = re.findall(r"<!-- table:([\w-]+) -->", text), re.findall(r"<!-- /table:([\w-]+) -->", text)
    if opened != closed:
        raise ValueError(f"unbalanced table markers: opened {opened}, closed {closed}")
    return new, changed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.tables", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 where a table is out of date")
    args = p.parse_args(argv)
    stale = []
    for doc in DOCS:
        path = REPO_ROOT / doc
        text = path.read_text(encoding="utf-8")
        new, changed = fill(text)
        stale += [f"{doc}: {name}" for name in changed]
        if changed and not args.check:
            path.write_text(new, encoding="utf-8")
    if stale:
        verb = "out of date" if args.check else "rewritten"
        print(f"{verb}: " + "; ".join(stale) + (" (run python -m benchmarks.tables)" if args.check else ""))
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
