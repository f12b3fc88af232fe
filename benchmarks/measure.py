"""Measurement: matmul throughput, timing in alternation (here or in a fresh child process), memory.

Child processes come from a multiprocessing "forkserver" that has imported the libraries but run no
model, one child per task, so that one figure's leftover allocations (glibc's heap state) do not
change the next one's timings. The child tasks are the module-level functions `timing_child` and
`memory_child`, importable as `benchmarks.measure` in the child (the forkserver inherits sys.path,
which `python -m benchmarks` from the repository root starts with).
"""

from __future__ import annotations

import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import torch

from benchmarks.contenders import (
    FIGURES,
    TRAIN_FIGURES,
    Contender,
    build,
    build_all,
    contender_class,
    make_batch,
)

PRELOAD = [
    "torch",
    "transformers",
    "transformers.generation.utils",
    "transformers.models.marian.modeling_marian",
    "scratch_transformer",
    "benchmarks.naive_transformer",
    "benchmarks.contenders",
    "benchmarks.measure",
]


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def figure_tokens(sizes: dict, figure: str) -> int:
    b = sizes["batch_size"]
    if figure in TRAIN_FIGURES:
        return b * (sizes["src_len"] + sizes["tgt_len"])
    return b * sizes["tgt_len"]  # new tokens; beam-4 counted as batch * M


# --------------------------------------------------------------------------------------
# Matmul throughput
# --------------------------------------------------------------------------------------


def matmul_gflops(m: int, k: int, n: int, min_seconds: float = 0.2) -> float:
    a, b = torch.randn(m, k), torch.randn(k, n)
    torch.mm(a, b)
    reps, elapsed = 1, 0.0
    while True:
        start = time.perf_counter()
        for _ in range(reps):
            torch.mm(a, b)
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            break
        reps = max(reps * 2, int(reps * min_seconds / max(elapsed, 1e-9) * 1.2))
    return 2.0 * m * k * n * reps / elapsed / 1e9


def measure_matmul(sizes: dict, min_seconds: float) -> dict:
    rows = sizes["batch_size"] * sizes["src_len"]
    return {
        "square_1024": matmul_gflops(1024, 1024, 1024, min_seconds),
        "model_shaped": matmul_gflops(rows, sizes["d_model"], sizes["d_ff"], min_seconds),
        "model_shaped_dims": [rows, sizes["d_model"], sizes["d_ff"]],
    }


def matmul_summary(runs: list[dict]) -> dict:
    """The start and end measurements together; the reference is the median of the square ones."""
    square = [m["square_1024"] for m in runs]
    return {
        "square_1024": square,
        "model_shaped": [m["model_shaped"] for m in runs],
        "model_shaped_dims": runs[0]["model_shaped_dims"],
        "reference_gflops": statistics.median(square),
        "when": ["start", "end"],
    }


# --------------------------------------------------------------------------------------
# Child processes
# --------------------------------------------------------------------------------------


def fresh_process_pool() -> ProcessPoolExecutor:
    """One child per task, forked from a server that has imported the libraries but run no model."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ProcessPoolExecutor(max_workers=1, mp_context=ctx, max_tasks_per_child=1)


def _child_setup(threads: int):
    torch.set_num_threads(threads)
    import transformers

    transformers.logging.set_verbosity_error()


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


def time_figure(contenders: list[Contender], figure: str, warmup: int, repeats: int) -> tuple[dict, dict]:
    """Seconds per call for each contender, and for those that split generate() the seconds inside
    the model's forward calls."""
    active = [c for c in contenders if c.supports(figure)]
    for c in active:
        for _ in range(warmup):
            c.run(figure)
    seconds = {c.name: [] for c in active}
    model_seconds = {c.name: [] for c in active if c.splits_generate}
    for _ in range(repeats):
        for c in active:  # A B C A B C ...
            c.model_seconds = 0.0
            start = time.perf_counter()
            c.run(figure)
            seconds[c.name].append(time.perf_counter() - start)
            if c.name in model_seconds:
                model_seconds[c.name].append(c.model_seconds)
    return seconds, model_seconds


def final_losses(contenders: list[Contender], figure: str = "train") -> dict:
    """One more training step of this figure per contender that has it, for a sanity look at the loss."""
    return {c.name: c.run(figure) for c in contenders if c.supports(figure)}


def timing_child(names, sizes, figure, seed, threads, warmup, repeats) -> tuple[dict, dict, dict]:
    """time_figure for one figure in a fresh process; for a training figure also one more step's loss per
    contender."""
    _child_setup(threads)
    contenders = build_all(names, sizes, seed)
    seconds, model_seconds = time_figure(contenders, figure, warmup, repeats)
    losses = final_losses(contenders, figure) if figure in TRAIN_FIGURES else {}
    return seconds, model_seconds, losses


def time_figure_in_child(names, sizes, figure, seed, threads, warmup, repeats) -> tuple[dict, dict, dict]:
    with fresh_process_pool() as pool:
        return pool.submit(timing_child, names, sizes, figure, seed, threads, warmup, repeats).result()


# --------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------


def _proc_status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_child(name: str, sizes: dict, figure: str, seed: int, threads: int, runs: int) -> dict:
    _child_setup(threads)
    rss_start = _proc_status_kb("VmRSS")
    c = build(name, sizes, seed)
    c.set_batch(make_batch(sizes, seed))
    if figure in TRAIN_FIGURES:
        c.make_optimizer()
    rss_before = _proc_status_kb("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")  # reset VmHWM (and ru_maxrss) to the current RSS
    for _ in range(runs):
        c.run(figure)
    hwm = _proc_status_kb("VmHWM")
    return {
        "peak_delta_mb": (hwm - rss_before) / 1024,
        "peak_rss_mb": hwm / 1024,
        "model_build_rss_mb": (rss_before - rss_start) / 1024,
        "runs": runs,
    }


def memory_method(runs: int) -> str:
    return ("per contender and figure, a fresh child process (multiprocessing forkserver with the "
            "libraries preloaded) builds the model, inputs (and optimizer object), reads VmRSS, "
            "resets the peak by writing 5 to /proc/self/clear_refs, runs the figure "
            f"{runs}x, and reports VmHWM - VmRSS(before) as peak_delta_mb; includes "
            "grads and AdamW moments for train, KV cache and logits for decoding, and one-time "
            "costs (first-touched library pages, allocator caches)")


def measure_memory(names, sizes, seed, threads, runs) -> dict:
    results = {}
    with fresh_process_pool() as pool:
        for name in names:
            results[name] = {}
            for figure in FIGURES:
                if not contender_class(name).supports(figure):
                    continue
                results[name][figure] = pool.submit(memory_child, name, sizes, figure, seed, threads, runs).result()
    return results
