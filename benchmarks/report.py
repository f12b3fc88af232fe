"""Reporting: the JSON entries (figures, machine, ratios), the file, and the printed Markdown tables."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

import torch

from benchmarks.contenders import TRAIN_FIGURES, Contender
from benchmarks.measure import figure_tokens, summarize

# ratio name -> (first contender, second contender, figure); median tokens/s, > 1 = first is faster
RATIO_SPEC = {
    "train_ours_sdpa_over_marian": ("ours-sdpa", "marian", "train"),
    "greedy_ours_sdpa_over_marian": ("ours-sdpa", "marian", "greedy"),
    "beam4_ours_sdpa_over_marian": ("ours-sdpa", "marian", "beam4"),
    "greedy_ours_sdpa_over_naive": ("ours-sdpa", "naive", "greedy"),
    "greedy_ours_eager_over_naive": ("ours-eager", "naive", "greedy"),
    "train_ours_eager_over_marian": ("ours-eager", "marian", "train"),
    "train_ours_sdpa_over_naive": ("ours-sdpa", "naive", "train"),
    "greedy_ours_eager_over_marian": ("ours-eager", "marian", "greedy"),
    "beam4_ours_eager_over_marian": ("ours-eager", "marian", "beam4"),
    "train_main_job_ours_sdpa_over_marian": ("ours-sdpa", "marian", "train_main_job"),
    "train_main_job_ours_eager_over_marian": ("ours-eager", "marian", "train_main_job"),
    # both with the main job's attention: its config's attn_implementation "eager" is Marian's too in
    # benchmarks.quality (n/a unless marian-eager is among the contenders)
    "train_main_job_ours_eager_over_marian_eager": ("ours-eager", "marian-eager", "train_main_job"),
}
RATIO_KEYS = tuple(RATIO_SPEC)
FLOP_KEYS = {"train": "train_per_step", "train_main_job": "train_per_step", "greedy": "greedy_per_call", "beam4": "beam4_per_call"}


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name with its family and model numbers, e.g. "AMD EPYC (family 25 model 17)".

    The name alone does not tell CPU kinds apart (virtual machines report several AMD EPYC generations, with and
    without native bf16, as "AMD EPYC"); the family and model numbers do. Read from /proc/cpuinfo (or `cpuinfo`,
    its text); the processor's platform name where there is none.
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                cpuinfo = fh.read()
        except OSError:
            cpuinfo = ""
    fields = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            break  # the first processor's block is enough
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    name = fields.get("model name") or platform.processor() or "unknown"
    if fields.get("cpu family") and fields.get("model"):
        return f"{name} (family {fields['cpu family']} model {fields['model']})"
    return name


def _fmt_rate(fig: dict | None) -> str:
    if not fig:
        return "n/a"
    t = fig["tokens_per_s"]
    return f"{t['median']:,.0f} [{t['min']:,.0f}-{t['max']:,.0f}]"


def _fmt_ms(fig: dict | None) -> str:
    return "n/a" if not fig else f"{1000 * fig['seconds']['median']:.0f}"


def _fmt_frac(fig: dict | None) -> str:
    return "n/a" if not fig else f"{100 * fig['fraction_of_matmul']:.1f}%"


def _fmt_mem(mem: dict | None, figure: str) -> str:
    if not mem or figure not in mem:
        return "n/a"
    return f"{mem[figure]['peak_delta_mb']:,.0f}"


def markdown_report(result: dict) -> str:
    sz = result["sizes"]
    mm = result["matmul"]
    lines = [
        f"## Benchmark: size {result['size']} (d_model {sz['d_model']}, {sz['num_heads']} heads, "
        f"{sz['encoder_layers']}+{sz['decoder_layers']} layers, d_ff {sz['d_ff']}, vocab {sz['vocab_size']}, "
        f"batch {sz['batch_size']} x {sz['src_len']}/{sz['tgt_len']})",
        "",
        f"CPU: {result['machine']['cpu_model']}; native bf16: {'yes' if result['machine']['native_bf16'] else 'no'} "
        f"({result['machine']['native_bf16_evidence']}); the main job trains here in "
        f"{result['settings']['train_main_job']['precision']}.",
        "",
        f"Machine: {result['machine']['cpu_model']}, {result['machine']['threads']} threads, "
        f"torch {result['machine']['torch']}, transformers {result['machine']['transformers']}. "
        f"fp32 matmul: {mm['reference_gflops']:.1f} GFLOP/s (1024^3 mm, median of "
        f"{len(mm['square_1024'])}: {', '.join(f'{x:.1f}' for x in mm['square_1024'])}); model-shaped "
        f"{'x'.join(map(str, mm['model_shaped_dims']))}: {', '.join(f'{x:.1f}' for x in mm['model_shaped'])}.",
        f"Timed in {result['settings']['timing_process']}, contenders alternating. "
        f"Repeats {result['settings']['repeats']} after {result['settings']['warmup']} warm-up, "
        "median [min-max]. Tokens/s: train = (source+target) tokens; greedy/beam-4 = batch x new tokens. "
        "% = achieved analytic matmul FLOP/s / measured 1024^3 mm FLOP/s. "
        "Mem = peak RSS growth (MB) in a fresh process over the built model (see JSON 'memory_method').",
        "",
        "| contender | attn | params | train tok/s | train % | greedy new tok/s | greedy % | beam-4 new tok/s "
        "| beam-4 % | mem train | mem greedy | mem beam-4 |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, c in result["contenders"].items():
        f = c["figures"]
        mem = c.get("memory")
        lines.append(
            f"| {name} | {c['attn_implementation'].split(' ')[0]} | {c['params']['trainable']:,} "
            f"| {_fmt_rate(f.get('train'))} | {_fmt_frac(f.get('train'))} "
            f"| {_fmt_rate(f.get('greedy'))} | {_fmt_frac(f.get('greedy'))} "
            f"| {_fmt_rate(f.get('beam4'))} | {_fmt_frac(f.get('beam4'))} "
            f"| {_fmt_mem(mem, 'train')} | {_fmt_mem(mem, 'greedy')} | {_fmt_mem(mem, 'beam4')} |"
        )
    lines += main_job_table(result)
    naive_greedy = result["contenders"].get("naive", {}).get("figures", {}).get("greedy")
    if naive_greedy:
        lines += ["", f"naive greedy % counts the useful (cached-decoding) FLOPs; counting what the no-cache loop "
                      f"executes it is {100 * naive_greedy['executed_fraction_of_matmul']:.1f}%."]
    split_rows = []
    for name, c in result["contenders"].items():
        for figure in ("greedy", "beam4"):
            fig = c["figures"].get(figure)
            if fig and "model_seconds" in fig:
                total, inside = fig["seconds"]["median"], fig["model_seconds"]["median"]
                own = fig["generate_own_seconds"]["median"]
                split_rows.append(f"| {name} | {figure} | {1000 * total:.0f} | {1000 * inside:.0f} | {1000 * own:.0f} "
                                  f"| {100 * own / total:.0f}% |")
    if split_rows:
        lines += ["", "Decoding time split (median ms per generate() call): inside the model's forward calls "
                      "(encoder once, whole model per step) and generate()'s own work (logits processors, token "
                      "selection, stopping checks, beam bookkeeping, cache reordering).", "",
                  "| contender | figure | total ms | model ms | generate's own ms | own share |",
                  "|---|---|---:|---:|---:|---:|", *split_rows]
    lines += ["", "| ratio (median tokens/s; > 1 = first is faster) | value |", "|---|---:|"]
    for key, value in result["ratios"].items():
        lines.append(f"| {key} | {'n/a' if value is None else f'{value:.2f}'} |")
    return "\n".join(lines)


def main_job_table(result: dict) -> list[str]:
    """The training figure of record: the main job's step (label smoothing, its precision) beside the fp32
    plain cross-entropy step, per contender that has both or either."""
    main = result["settings"]["train_main_job"]
    rows = []
    for name, c in result["contenders"].items():
        plain, job = c["figures"].get("train"), c["figures"].get("train_main_job")
        if not job:
            continue
        rows.append(f"| {name} | {c['attn_implementation'].split(' ')[0]} | {_fmt_rate(job)} | {_fmt_ms(job)} "
                    f"| {_fmt_rate(plain)} | {_fmt_ms(plain)} | {_fmt_mem(c.get('memory'), 'train_main_job')} |")
    if not rows:
        return []
    return ["", f"Training step as the main job runs it (figure train_main_job, the training figure of record): "
                f"label smoothing {main['label_smoothing']} as the main job's Trainer computes it (ours: the "
                f"model's fused loss; Marian: HF's LabelSmoother on float32 logits), forward in "
                f"{main['precision']} ({main['precision_reason']}), backward and AdamW step; beside it the fp32 "
                "plain cross-entropy step (figure train). Tokens/s = (source+target) tokens.", "",
            "| contender | attn | main-job step tok/s | main-job ms | fp32 CE tok/s | fp32 CE ms | mem main-job |",
            "|---|---|---:|---:|---:|---:|---:|", *rows]


def machine_info() -> dict:
    import transformers

    from scratch_transformer.training import native_bf16_cpu

    native_bf16, evidence = native_bf16_cpu()
    return {
        "cpu_model": cpu_model(),
        "native_bf16": native_bf16,
        "native_bf16_evidence": evidence,
        "logical_cpus": os.cpu_count(),
        "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_end": list(os.getloadavg()),
    }


def figure_entry(c: Contender, sizes: dict, figure: str, secs: list[float], inside: list[float] | None,
                 flops: dict, ref_flops: float) -> dict:
    """One contender's figure: seconds, tokens/s, achieved FLOP/s against the matmul reference, the
    generate() split where measured, and the executed FLOPs where they differ from the useful ones."""
    tokens = figure_tokens(sizes, figure)
    med = statistics.median(secs)
    achieved = flops[FLOP_KEYS[figure]] / med
    entry = {
        "seconds": summarize(secs),
        "tokens_per_call": tokens,
        "tokens_per_s": summarize([tokens / s for s in secs]),
        "useful_gflops_per_s": achieved / 1e9,
        "fraction_of_matmul": achieved / ref_flops,
    }
    if figure not in TRAIN_FIGURES and inside is not None:
        entry["model_seconds"] = summarize(inside)
        entry["generate_own_seconds"] = summarize([t - m for t, m in zip(secs, inside)])
    if figure in c.executed_flops:
        executed = flops[c.executed_flops[figure]] / med
        entry["executed_gflops_per_s"] = executed / 1e9
        entry["executed_fraction_of_matmul"] = executed / ref_flops
    return entry


def contender_entries(contenders: list[Contender], sizes: dict, figures: list[str], seconds: dict,
                      model_seconds: dict, flops: dict, matmul: dict, losses: dict, memory: dict) -> dict:
    ref_flops = matmul["reference_gflops"] * 1e9
    result = {}
    for c in contenders:
        entries = {}
        for figure in figures:
            secs = seconds[figure].get(c.name)
            if secs:
                entries[figure] = figure_entry(c, sizes, figure, secs, model_seconds[figure].get(c.name),
                                               flops, ref_flops)
        result[c.name] = {
            "attn_implementation": c.attn_implementation,
            "params": c.params,
            "figures": entries,
            "final_train_loss": losses.get("train", {}).get(c.name),
            "final_train_main_job_loss": losses.get("train_main_job", {}).get(c.name),
            "memory": memory.get(c.name),
        }
    return result


def compute_ratios(contenders: dict) -> dict:
    def rate(name, figure):
        fig = contenders.get(name, {}).get("figures", {}).get(figure)
        return fig["tokens_per_s"]["median"] if fig else None

    def ratio(a, b):
        return a / b if a is not None and b else None

    return {k: ratio(rate(a, fig), rate(b, fig)) for k, (a, b, fig) in RATIO_SPEC.items()}


def write_json(result: dict, path: str | Path) -> Path:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return out
