"""Recipe study: short proxy runs of the main job that rank one lever at a time (issue: ahead of Marian).

Run from the repository root, nothing else on the cores (each proxy has a training-time budget):
    python -m benchmarks.recipe --list                                  # the variants and their flags
    python -m benchmarks.recipe --variants baseline,init_std_0.02       # run these, one after the other
    python -m benchmarks.recipe --report_only                           # the table of the runs already there
    python -m benchmarks.recipe --variants batch_64 --proxy_minutes 6                # at equal training time
    python -m benchmarks.recipe --variants baseline --proxy_steps 20 --output_dir /tmp/recipe_check

Each variant is `scripts/train_translation.py configs/multi30k_de_en.json` with the proxy flags and then the
variant's own flags, which win. The proxy: --proxy_steps steps (default 500, about 6 minutes of the main
job on 2 AMD EPYC cores) with the main job's schedule shape laid on steps (warm-up over the same share),
checkpoints every --save_steps so that the last 5 averaged cover about the same share of the run as in the
25-minute job, no evaluation during training and no test sets. Steps make the ranking independent of how
busy the machine is; a lever that changes the time per step (batch size, model shape) has to be compared
at equal training time instead: --proxy_minutes M lays the schedule on a budget of M training minutes, as
the main job does, and then needs the cores to itself.

Prints one Markdown table (variant, flags, steps, s/step, val BLEU / chrF of the model the main job keeps:
the average of the last 5 checkpoints or the last one, whichever scores higher on val) read from each run's
all_results.json and trainer_state.json, and writes it with the raw figures to <output_dir>/recipe.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
from pathlib import Path

from benchmarks.quality import CONFIG, SCRIPT, _number, git_commit, machine, read_run, run_side

# The proxy: a short run, the averaging window scaled with it, no mid-run evaluation, no test sets.
PROXY_FLAGS = ["--eval_strategy", "no", "--logging_steps", "25", "--do_predict", "false"]

# name -> (flags, what it tests). Flags are main-job flags; --config_overrides replaces the config's whole
# string, so variants that change the model repeat the shipped overrides with their change.
SHIPPED_OVERRIDES = ("d_model=256,num_heads=4,encoder_layers=3,decoder_layers=3,d_ff=1024,dropout=0.1,"
                     "attention_dropout=0.1,share_encoder_decoder_embeddings=true,init_std=0.02")


def _overrides(**changes) -> list[str]:
    fields = dict(item.split("=", 1) for item in SHIPPED_OVERRIDES.split(","))
    fields.update({key: str(value).lower() if isinstance(value, bool) else str(value)
                   for key, value in changes.items()})
    return ["--config_overrides", ",".join(f"{key}={value}" for key, value in fields.items())]


VARIANTS: dict[str, tuple[list[str], str]] = {
    "baseline": ([], "the shipped config"),
    "init_paper": (_overrides(init_std="null"), "the paper's init: Xavier linears, N(0, d^-1/2) embeddings"),
    "init_std_0.01": (_overrides(init_std=0.01), "N(0, 0.01) for every weight"),
    "init_std_0.04": (_overrides(init_std=0.04), "N(0, 0.04) for every weight"),
    "lr_2e-3": (["--learning_rate", "2e-3"], "peak learning rate 2e-3"),
    "lr_5e-4": (["--learning_rate", "5e-4"], "peak learning rate 5e-4"),
    "warmup_0.1": (["--warmup_steps", "0.1"], "warm-up over 10% of the run (shipped: 33%)"),
    "batch_32": (["--per_device_train_batch_size", "32"], "batches of 32 pairs"),
    "batch_64": (["--per_device_train_batch_size", "64"], "batches of 64 pairs (the config since 667c38e)"),
    "batch_128": (["--per_device_train_batch_size", "128"], "batches of 128 pairs (the config until 667c38e)"),
    "batch_256": (["--per_device_train_batch_size", "256"], "batches of 256 pairs"),
    "dropout_0.2": (_overrides(dropout=0.2), "residual/embedding dropout 0.2"),
    "attention_dropout_0": (_overrides(attention_dropout=0.0), "no attention dropout"),
    "label_smoothing_0": (["--label_smoothing_factor", "0"], "no label smoothing"),
    "vocab_6000": (["--vocab_size", "6000"], "a joint BPE vocabulary of 6000"),
    "vocab_10000": (["--vocab_size", "10000"], "a joint BPE vocabulary of 10000"),
    "vocab_14000": (["--vocab_size", "14000"], "a joint BPE vocabulary of 14000"),
    "deeper_narrower": (_overrides(d_model=192, num_heads=4, encoder_layers=5, decoder_layers=5, d_ff=768),
                        "5+5 layers of width 192 (about the same compute)"),
    "wider_shallower": (_overrides(d_model=320, num_heads=4, encoder_layers=2, decoder_layers=2, d_ff=1280),
                        "2+2 layers of width 320 (about the same compute)"),
    "encoder_4_decoder_2": (_overrides(encoder_layers=4, decoder_layers=2),
                            "4 encoder and 2 decoder layers instead of 3+3 (5% fewer multiply-adds per pair)"),
    "gelu": (_overrides(activation_function="gelu"), "GELU in the feed-forward instead of ReLU"),
}


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.recipe", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                                epilog="Any other flag is passed to every run, after the variant's flags.")
    p.add_argument("--variants", default=None, help="comma-separated names (see --list); default: all")
    p.add_argument("--output_dir", default="outputs/recipe", help="one folder per variant inside")
    p.add_argument("--proxy_steps", type=int, default=500,
                   help="steps of each proxy run, the schedule laid on them (default; independent of load)")
    p.add_argument("--proxy_minutes", type=float, default=None,
                   help="instead of steps: a training-time budget of each run, the schedule laid on it as in the "
                        "main job (for levers that change the time per step; needs the cores to itself)")
    p.add_argument("--save_steps", type=int, default=35,
                   help="checkpoint interval: the 25-minute job averages its last 5 of ~2200 steps (every 150); "
                        "35 keeps that share for ~520 steps")
    p.add_argument("--config", default=CONFIG, help="the main job's config file")
    p.add_argument("--list", action="store_true", help="print the variants and exit")
    p.add_argument("--report_only", action="store_true", help="run nothing: the table of the existing runs")
    args, passthrough = p.parse_known_args(argv)
    if args.proxy_minutes is not None and args.proxy_minutes <= 0:
        p.error("--proxy_minutes must be positive")
    if args.proxy_steps <= 0:
        p.error("--proxy_steps must be positive")
    names = list(VARIANTS) if args.variants is None else [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        p.error(f"unknown variant(s) {unknown}; known: {', '.join(VARIANTS)}")
    args.names, args.passthrough = names, passthrough
    return args


def run_command(args, name: str) -> list[str]:
    flags, _ = VARIANTS[name]
    if args.proxy_minutes is not None:
        length = ["--max_train_minutes", f"{args.proxy_minutes:g}"]
    else:  # a budget out of reach, the schedule on the steps (warm-up stays the config's share of them)
        length = ["--max_train_minutes", "100000", "--schedule_on_budget", "false",
                  "--max_steps", str(args.proxy_steps)]
    return [sys.executable, SCRIPT, args.config, "--output_dir", str(Path(args.output_dir) / name), *length,
            "--save_steps", str(args.save_steps), *PROXY_FLAGS, *flags, *args.passthrough]


def markdown_table(result: dict) -> str:
    m = result["machine"]
    lines = [f"## Recipe study: proxies of the main job ({result['proxy']})", "",
             f"CPU {m['cpu_model']} ({m['logical_cpus']} logical CPUs), native bf16: "
             f"{'yes' if m['native_bf16'] else 'no'}; {result['date']}, commit {result['commit']}.", "",
             "| variant | what | steps | s/step | val BLEU / chrF |",
             "|---|---|---:|---:|---:|"]
    for name, run in result["runs"].items():
        if run is None:
            continue
        lines.append(f"| {name} | {VARIANTS[name][1]} | {_number(run['steps'], 'd')} "
                     f"| {_number(run['seconds_per_step'], '.3f')} | {_number(run['eval_bleu'], '.2f')} / "
                     f"{_number(run['eval_chrf'], '.2f')} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.list:
        for name, (flags, what) in VARIANTS.items():
            print(f"{name:22s} {what}: {shlex.join(flags) or '(no flags)'}")
        return {}
    def log(message):
        print(message, file=sys.stderr, flush=True)

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "recipe.json"
    previous = json.loads(json_path.read_text(encoding="utf-8")) if json_path.is_file() else {}
    commands = previous.get("commands", {})
    if not args.report_only:
        for name in args.names:  # one after the other: never two runs sharing the cores
            command = run_command(args, name)
            run_side(command, out / f"{name}.log", log, tag="recipe")
            commands[name] = shlex.join(command)
    names = [n for n in VARIANTS if (out / n / "all_results.json").is_file()]
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": git_commit(), "machine": machine(),
        "proxy": f"{args.proxy_minutes:g} training minutes each" if args.proxy_minutes is not None
        else f"{args.proxy_steps} steps each",
        "runs": {name: read_run(out / name) for name in names}, "commands": commands,
    }
    result["table"] = markdown_table(result)
    json_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(result["table"])
    log(f"[recipe] wrote {json_path}")
    return result


if __name__ == "__main__":
    try:
        main()
    except (ValueError, RuntimeError, OSError) as error:
        sys.exit(f"python -m benchmarks.recipe: error: {error}")
