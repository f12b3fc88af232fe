"""The main job's training step on its own batches: ours and Marian, alternating step by step, in one process.

Run from the repository root, nothing else on the cores:
    python -m benchmarks.job_step                                   # 100 batches of the shipped config
    python -m benchmarks.job_step --steps 40 --per_device_train_batch_size 32
    python -m benchmarks.job_step --steps 4 --max_train_samples 256 --output_json /tmp/job_step.json

Why: the 25-minute side by side (`benchmarks.quality`) runs the two models one after the other, and this machine's
speed drifts between runs by more than the models differ; `python -m benchmarks` times a fixed batch of equal
lengths without padding. Here both models are built by the main job's own functions from the same flags (Marian
with the anchor's settings, as benchmarks.quality builds it), and both take the same first --steps batches of the
job's training DataLoader (its length-grouped sampler, padding and collator). Each step is the Trainer's:
`training_step` (the forward in the precision the job picks, under accelerate's autocast wrapper, the loss as the
job computes it, backward), gradient clipping at max_grad_norm, the optimizer step and zero_grad. The models
alternate on each batch (the order flipped every batch), after --warmup batches that are not counted.

Prints the CPU model, the precision, each model's mean and median ms per step and (source + target) tokens/s
over the same batches, and the ratio of means (> 1: ours is faster); writes them to --output_json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import record
from benchmarks.quality import (
    CONFIG,
    REPO_ROOT,
    git_commit,
    machine,
    marian_config_values,
    refuse_benchmark_flags,
    write_marian_config,
)

SIDES = ("ours", "marian")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.job_step", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False,
                                epilog="Any other flag (e.g. --per_device_train_batch_size 32) goes to both models' "
                                       "job arguments, after the config file.")
    p.add_argument("--config", default=CONFIG, help="the main job's config file")
    p.add_argument("--steps", type=int, default=100, help="batches timed for each model (after --warmup)")
    p.add_argument("--warmup", type=int, default=5, help="batches run first and not counted")
    p.add_argument("--output_json", default="outputs/job_step.json")
    p.add_argument("--record", action="store_true",
                   help=record.RECORD_HELP.format(name="job_step", more=" and precision"))
    args, passthrough = p.parse_known_args(argv)
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be at least 1 and --warmup at least 0")
    refuse_benchmark_flags(p, passthrough)
    args.passthrough = passthrough
    return args


def build_side(side: str, args, folder: Path):
    """(trainer, prepared model) for one side, built as the main job builds it."""
    if str(REPO_ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import train_translation

    from scratch_transformer import translation

    flags = [str(REPO_ROOT / args.config), "--output_dir", str(folder / side), "--report_to", "none",
             *args.passthrough]
    if side == "marian":
        marian = write_marian_config(folder / "marian_config", marian_config_values(args.config, args.passthrough))
        flags += ["--config_name", str(marian), "--config_overrides", ""]
    model_args, data_args, training_args = train_translation.parse_args(flags)
    raw = translation.load_data(data_args, training_args)
    tokenizer, model, decoding = translation.build_tokenizer_and_model(model_args, data_args, training_args, raw, None)
    trainer, _ = translation.build_trainer(model, tokenizer, raw, data_args, training_args, decoding, None)
    trainer.create_optimizer()
    prepared = trainer.accelerator.prepare_model(model)  # the forward under the job's autocast, as Trainer does
    prepared.train()
    return trainer, prepared


def step(trainer, model, batch) -> float:
    """One training step as the Trainer takes it; returns its wall seconds."""
    import torch

    start = time.perf_counter()
    labelled = (batch["labels"] != -100).sum()
    trainer.training_step(model, batch, num_items_in_batch=labelled)
    if trainer.args.max_grad_norm:
        torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main(argv=None) -> dict:
    import itertools

    import torch

    args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="job_step_") as tmp:
        sides = {"ours": build_side("ours", args, Path(tmp))}
        loader = sides["ours"][0].get_train_dataloader()  # one epoch of the job's batches, in its order
        batches = list(itertools.islice(iter(loader), args.warmup + args.steps))
        if len(batches) < args.warmup + args.steps:
            raise ValueError(f"the training set gives {len(batches)} batches, fewer than --warmup + --steps = "
                             f"{args.warmup + args.steps}")
        sides["marian"] = build_side("marian", args, Path(tmp))
        seconds = {side: [] for side in SIDES}
        for index, batch in enumerate(batches):
            for side in (SIDES if index % 2 == 0 else SIDES[::-1]):
                elapsed = step(*sides[side], batch)
                if index >= args.warmup:
                    seconds[side].append(elapsed)
    counted = batches[args.warmup:]
    tokens = sum(int(b["attention_mask"].sum()) + int((b["labels"] != -100).sum()) for b in counted)
    padded = sum(b["input_ids"].numel() + b["labels"].numel() for b in counted)
    figures = {side: {"mean_ms": 1000 * statistics.mean(ts), "median_ms": 1000 * statistics.median(ts),
                      "tokens_per_s": tokens / sum(ts)} for side, ts in seconds.items()}
    job_args = sides["ours"][0].args  # the job's arguments: the precision it resolved (`--precision auto` or given)
    precision, reason = job_args.precision, job_args.precision_reason
    result = {
        "date": datetime.date.today().isoformat(), "commit": git_commit(), "machine": machine(),
        "threads": torch.get_num_threads(), "precision": precision, "precision_reason": reason,
        "command": "python -m benchmarks.job_step " + " ".join(argv if argv is not None else sys.argv[1:]),
        "steps": args.steps, "warmup": args.warmup, "tokens": tokens, "padding_fraction": 1 - tokens / padded,
        "figures": figures, "seconds": seconds,
        "ours_over_marian": figures["marian"]["mean_ms"] / figures["ours"]["mean_ms"],
    }
    print(report(result))
    out = Path(args.output_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(f"[job_step] wrote {out}")
    if args.record:
        path = record.record("job_step", [record.stamped(result)],
                             key=lambda run: (record.cpu_of(run), run["precision"]))
        print(f"[job_step] recorded in {path}")
    return result


def report(result: dict) -> str:
    m = result["machine"]
    lines = [f"CPU: {m['cpu_model']} (native bf16: {'yes' if m['native_bf16'] else 'no'}), {result['threads']} "
             f"threads; precision {result['precision']} ({result['precision_reason']}); commit {result['commit']}.",
             f"The main job's first {result['steps']} training batches after {result['warmup']} of warm-up, both "
             f"models alternating; {result['tokens']:,} source + target tokens, "
             f"{100 * result['padding_fraction']:.1f}% padding.", "",
             "| model | mean ms/step | median ms/step | tokens/s |", "|---|---:|---:|---:|"]
    for side, f in result["figures"].items():
        lines.append(f"| {side} | {f['mean_ms']:.0f} | {f['median_ms']:.0f} | {f['tokens_per_s']:,.0f} |")
    lines += ["", f"ours over Marian (ratio of mean step times, > 1: ours is faster): {result['ours_over_marian']:.2f}"]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
