"""The benchmark's flags and run: `python -m benchmarks` from the repository root.

Usage:
    python -m benchmarks --size small --repeats 3
    python -m benchmarks --size tiny --repeats 1 --warmup 0 --output_json /tmp/b.json
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import torch

import benchmarks
from benchmarks import measure, record, report
from benchmarks.contenders import (
    ALL_CONTENDERS,
    COMMON,
    DEFAULT_CONTENDERS,
    FIGURES,
    MAIN_JOB_LABEL_SMOOTHING,
    SIZES,
    TRAIN_FIGURES,
    build_all,
    main_job_precision,
)
from benchmarks.flops import analytic_flops

BENCHMARKS_DIR = Path(__file__).resolve().parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=benchmarks.__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=tuple(SIZES), default="small")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="torch.set_num_threads (default: os.cpu_count())")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per contender and figure")
    p.add_argument("--warmup", type=int, default=1, help="untimed runs per contender and figure before timing")
    p.add_argument("--contenders", default=",".join(DEFAULT_CONTENDERS),
                   help=f"comma-separated subset of {','.join(ALL_CONTENDERS)}")
    p.add_argument("--figures", default=",".join(FIGURES), help=f"comma-separated subset of {','.join(FIGURES)}")
    p.add_argument("--same-process", action="store_true",
                   help="time every figure in this process (default: each figure in a fresh child process, so "
                        "that one figure's leftover allocations do not change the next one's timings)")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the memory child processes")
    p.add_argument("--memory-runs", type=int, default=2, help="runs of each figure inside a memory child")
    p.add_argument("--matmul-seconds", type=float, default=0.3, help="minimum seconds per matmul measurement")
    p.add_argument("--seq_len", type=int, default=None,
                   help="source and target tokens per sentence of the batch instead of the size's (small: 24); "
                        "Multi30k's training pairs average 15.9 tokens on the longer side with the main job's 8000 BPE")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output_json", default=None, help="default: outputs/speed_<size>.json")
    p.add_argument("--record", action="store_true", help=record.RECORD_HELP.format(name="speed", more=" and size"))
    args = p.parse_args(argv)
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    for c in args.contenders:
        if c not in ALL_CONTENDERS:
            p.error(f"unknown contender {c!r}; choose from {ALL_CONTENDERS}")
    args.figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    for f in args.figures:
        if f not in FIGURES:
            p.error(f"unknown figure {f!r}; choose from {FIGURES}")
    if args.repeats < 1 or args.warmup < 0 or args.threads < 1:
        p.error("--repeats and --threads must be >= 1, --warmup >= 0")
    if args.seq_len is not None and args.seq_len < 2:
        p.error(f"--seq_len must be >= 2 (a token and the end of sentence), got {args.seq_len}")
    if args.output_json is None:
        suffix = "" if args.seq_len is None else f"_len{args.seq_len}"
        args.output_json = str(BENCHMARKS_DIR.parent / "outputs" / f"speed_{args.size}{suffix}.json")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    sizes = dict(SIZES[args.size])
    if args.seq_len is not None:
        sizes.update(src_len=args.seq_len, tgt_len=args.seq_len)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    log(f"[benchmark] size={args.size} threads={torch.get_num_threads()} contenders={args.contenders}")
    precision, precision_reason = main_job_precision()
    log(f"[benchmark] {report.cpu_model()}; the main job's precision here: {precision} ({precision_reason})")
    matmul_runs = [measure.measure_matmul(sizes, args.matmul_seconds)]

    contenders = build_all(args.contenders, sizes, args.seed)
    for c in contenders:
        log(f"[benchmark] {c.name:13s} attn={c.attn_implementation:8s} trainable params={c.params['trainable']:,} "
            f"(frozen {c.params['frozen']:,})")
    trainable = {c.params["trainable"] for c in contenders}
    if len(trainable) != 1:
        log(f"[benchmark] WARNING: trainable parameter counts differ: {sorted(trainable)}")

    flops = analytic_flops(sizes)
    flops["six_times_params_per_token"] = 6 * max(trainable)
    seconds, model_seconds, losses = {}, {}, {}
    for figure in args.figures:
        log(f"[benchmark] timing {figure} ...")
        if args.same_process:
            seconds[figure], model_seconds[figure] = measure.time_figure(contenders, figure, args.warmup, args.repeats)
            if figure in TRAIN_FIGURES:
                losses[figure] = measure.final_losses(contenders, figure)
        else:
            seconds[figure], model_seconds[figure], losses[figure] = measure.time_figure_in_child(
                args.contenders, sizes, figure, args.seed, args.threads, args.warmup, args.repeats)

    matmul_runs.append(measure.measure_matmul(sizes, args.matmul_seconds))
    matmul = measure.matmul_summary(matmul_runs)

    memory = {}
    if args.memory:
        log("[benchmark] measuring memory in child processes ...")
        memory = measure.measure_memory(args.contenders, sizes, args.seed, args.threads, args.memory_runs)

    result_contenders = report.contender_entries(contenders, sizes, args.figures, seconds, model_seconds,
                                                 flops, matmul, losses, memory)
    result = {
        "command": shlex.join([sys.executable, "-m", "benchmarks", *(sys.argv[1:] if argv is None else argv)]),
        "size": args.size,
        "sizes": sizes,
        "common": COMMON,
        "machine": report.machine_info(),
        "settings": {"repeats": args.repeats, "warmup": args.warmup, "seed": args.seed,
                     "timing_process": "this process" if args.same_process else "a fresh child process per figure",
                     "contenders": args.contenders, "figures": args.figures, "memory_runs": args.memory_runs,
                     "dtype": "float32", "padding": "none (all positions are tokens; attention masks of ones passed)",
                     "train_main_job": {
                         "label_smoothing": MAIN_JOB_LABEL_SMOOTHING, "precision": precision,
                         "precision_reason": precision_reason,
                         "loss": "as TranslationTrainer with label_smoothing_factor, forward in bf16 autocast "
                                 "when precision is bf16: ours computes the smoothed loss in its forward (fused "
                                 "cross-entropy, label_smoothing=epsilon); Marian: HF's LabelSmoother(epsilon) on "
                                 "the float32 logits of a forward pass; then backward and AdamW",
                     }},
        "matmul": matmul,
        "flops": flops,
        "memory_method": measure.memory_method(args.memory_runs),
        "contenders": result_contenders,
    }
    result["ratios"] = report.compute_ratios(result_contenders)

    out = report.write_json(result, args.output_json)
    print(report.markdown_report(result))
    log(f"[benchmark] wrote {out}")
    if args.record:
        path = record.record("speed", [record.stamped(result)], key=lambda run: (record.cpu_of(run), run["size"]))
        log(f"[benchmark] recorded in {path}")
    return result
