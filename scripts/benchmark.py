#!/usr/bin/env python
"""Side-by-side CPU speed benchmark: our Transformer vs transformers' Marian vs a naive baseline.

Contenders, all at identical sizes, from the same seed, fp32 on CPU:
    ours-eager   ScratchTransformerForConditionalGeneration, config._attn_implementation = "eager"
    ours-sdpa    the same with "sdpa" (F.scaled_dot_product_attention)
    marian       MarianMTModel from a MarianConfig matching ours (post-LN, ReLU, sinusoidal positions,
                 scaled, shared + tied embeddings, same dropouts and special ids), attn "sdpa"
    naive        benchmarks/naive_transformer.py (tutorial-style; greedy decoding without a cache)
    marian-eager (optional, not in the default set) Marian with attn "eager"
Ours is built with share_encoder_decoder_embeddings=True so that its trainable parameters equal
Marian's (Marian's sinusoid tables are frozen parameters and are not counted).

Figures, each timed in a fresh child process (forkserver, libraries preloaded; --same-process to
time them here), contenders in alternation (A B C A B C ...) after warm-up, median [min-max] over
repeats. Fresh processes because leftovers change the next figure: after a training figure in the
same process, beam-4 ours/Marian went from 1.20 to 1.01 (glibc's heap state, see BENCHMARKS.md).
    train    forward + backward + AdamW step in train mode with labels; (source + target) tokens/s
    greedy   new tokens/s of model.generate(do_sample=False, num_beams=1, min_new_tokens=M,
             max_new_tokens=M, attention_mask=...); for naive, naive_greedy_decode (M steps, no cache)
    beam4    model.generate(num_beams=4, same M); new tokens/s counted as batch * M
    split    for generate() calls (greedy, beam4; ours and Marian): the seconds spent inside the model's
             forward calls (forward hooks on the encoder and the whole model) and the rest, which is
             generate()'s own work: the same transformers code for both models except the model's own
             cache reordering in beam search, so it shows how far the model alone can move the ratios
    memory   in a fresh child process per contender and figure (multiprocessing "forkserver", which has
             imported the libraries once): VmHWM - VmRSS from /proc/self/status, i.e. the peak resident
             set size reached while running the figure twice, minus the RSS just before (model and
             inputs built, optimizer object created); the peak is reset first by writing 5 to
             /proc/self/clear_refs. For training it therefore includes gradients and AdamW moments
             as well as activations; for decoding the KV cache, logits and activations. One-time costs
             (library pages touched for the first time, allocator caches) are included too, so read it
             as a comparison between contenders, not as exact tensor bytes.
    matmul   the machine's fp32 torch.mm throughput in this run (1024^3 square, and a model-shaped
             (batch*src_len x d_model) @ (d_model x d_ff)), measured at the start and at the end; the
             reference is the median of the square measurements.

FLOPs are counted analytically (matmuls only: projections, attention scores and weighted sums as
computed, i.e. the full causal square in training, the output projection; 2 FLOPs per
multiply-add; backward = 2 x forward). Decoding FLOPs are those of cached incremental decoding
(the useful work); the naive loop's executed FLOPs (whole prefix every step) are reported beside.

Usage:
    python scripts/benchmark.py --size small --repeats 3
    python scripts/benchmark.py --size tiny --repeats 1 --warmup 0 --output_json /tmp/b.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SIZES = {
    # tests only
    "tiny": dict(vocab_size=128, d_model=32, num_heads=2, encoder_layers=1, decoder_layers=1, d_ff=64,
                 batch_size=4, src_len=6, tgt_len=6),
    "small": dict(vocab_size=8000, d_model=256, num_heads=4, encoder_layers=3, decoder_layers=3, d_ff=1024,
                  batch_size=64, src_len=24, tgt_len=24),
    "base": dict(vocab_size=10000, d_model=512, num_heads=8, encoder_layers=6, decoder_layers=6, d_ff=2048,
                 batch_size=32, src_len=32, tgt_len=32),
}
COMMON = dict(dropout=0.1, attention_dropout=0.1, max_position_embeddings=1024,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
FIRST_ORDINARY_ID = 4  # random tokens avoid pad/bos/eos and one spare special

ALL_CONTENDERS = ("ours-eager", "ours-sdpa", "marian", "naive", "marian-eager")
DEFAULT_CONTENDERS = ("ours-eager", "ours-sdpa", "marian", "naive")
FIGURES = ("train", "greedy", "beam4")
RATIO_KEYS = (
    "train_ours_sdpa_over_marian",
    "greedy_ours_sdpa_over_marian",
    "beam4_ours_sdpa_over_marian",
    "greedy_ours_sdpa_over_naive",
    "greedy_ours_eager_over_naive",
    "train_ours_eager_over_marian",
    "train_ours_sdpa_over_naive",
    "greedy_ours_eager_over_marian",
    "beam4_ours_eager_over_marian",
)
PRELOAD = [
    "__main__",  # this script: puts the repo root on sys.path for the imports below
    "torch",
    "transformers",
    "transformers.generation.utils",
    "transformers.models.marian.modeling_marian",
    "scratch_transformer",
    "benchmarks.naive_transformer",
]


# --------------------------------------------------------------------------------------
# Contenders
# --------------------------------------------------------------------------------------


def ours_config(sizes: dict):
    from scratch_transformer import ScratchTransformerConfig

    keys = ("vocab_size", "d_model", "num_heads", "encoder_layers", "decoder_layers", "d_ff")
    return ScratchTransformerConfig(
        **{k: sizes[k] for k in keys}, **COMMON,
        activation_function="relu", pre_layer_norm=False, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, layer_norm_eps=1e-5,
    )


def marian_config(sizes: dict):
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=sizes["vocab_size"], d_model=sizes["d_model"],
        encoder_attention_heads=sizes["num_heads"], decoder_attention_heads=sizes["num_heads"],
        encoder_layers=sizes["encoder_layers"], decoder_layers=sizes["decoder_layers"],
        encoder_ffn_dim=sizes["d_ff"], decoder_ffn_dim=sizes["d_ff"],
        activation_function="relu", activation_dropout=0.0, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        forced_eos_token_id=None, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
        **COMMON,
    )


def count_params(model) -> dict:
    unique = {id(p): p for p in model.parameters()}.values()
    return {
        "trainable": sum(p.numel() for p in unique if p.requires_grad),
        "frozen": sum(p.numel() for p in unique if not p.requires_grad),
    }


class Contender:
    """One model plus the three workloads on a fixed batch."""

    def __init__(self, name: str, sizes: dict, seed: int, lr: float = 1e-4):
        self.name = name
        self.sizes = sizes
        torch.manual_seed(seed)
        if name.startswith("ours"):
            from scratch_transformer import ScratchTransformerForConditionalGeneration

            self.kind = "hf"
            self.model = ScratchTransformerForConditionalGeneration(ours_config(sizes))
            impl = name.split("-", 1)[1]
            # our model refuses set_attn_implementation (it reads config._attn_implementation itself)
            self.model.config._attn_implementation = impl
        elif name.startswith("marian"):
            from transformers import MarianMTModel

            self.kind = "hf"
            self.model = MarianMTModel(marian_config(sizes))
            impl = "eager" if name == "marian-eager" else "sdpa"
            self.model.set_attn_implementation(impl)
        elif name == "naive":
            from benchmarks.naive_transformer import NaiveTransformer

            self.kind = "naive"
            self.model = NaiveTransformer.from_config(ours_config(sizes))
            impl = "naive (matmul + masked_fill + softmax)"
        else:
            raise ValueError(f"unknown contender {name!r}; choose from {ALL_CONTENDERS}")
        self.attn_implementation = impl
        if self.kind == "hf":
            configs = {m.config._attn_implementation for m in self.model.modules() if hasattr(m, "config")}
            if configs != {impl}:
                raise RuntimeError(f"{name}: attention implementation not applied everywhere: {configs}")
            self.model.generation_config.forced_eos_token_id = None
        self.params = count_params(self.model)
        self.model_seconds = 0.0  # time inside the model's forward calls (encoder + whole model), see _time_model
        if self.kind == "hf":
            self._time_model(self.model)
            self._time_model(self.model.get_encoder())
        self.optimizer = None
        self.lr = lr
        self.batch = None

    def _time_model(self, module):
        """Add the wall time of each forward call of `module` to self.model_seconds (forward hooks).

        generate() calls the encoder once and the whole model once per step; the rest of a decoding
        call (logits processors, token selection, stopping checks, beam bookkeeping, cache reordering)
        is generate()'s own work."""
        def pre(*_):
            self._model_start = time.perf_counter()

        def post(*_):
            self.model_seconds += time.perf_counter() - self._model_start

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def set_batch(self, batch: dict):
        self.batch = batch

    def make_optimizer(self):
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=self.lr)

    # ---- workloads -------------------------------------------------------------------

    def train_step(self) -> float:
        if self.optimizer is None:
            self.make_optimizer()
        b = self.batch
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        if self.kind == "hf":
            loss = self.model(input_ids=b["src"], attention_mask=b["src_mask"], labels=b["labels"]).loss
        else:
            logits = self.model(b["src"], b["tgt_in"], b["naive_src_mask"], b["naive_tgt_mask"])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), b["labels"].reshape(-1))
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def greedy(self) -> torch.Tensor:
        b, m = self.batch, self.sizes["tgt_len"]
        self.model.eval()
        if self.kind == "hf":
            out = self.model.generate(
                input_ids=b["src"], attention_mask=b["src_mask"], do_sample=False, num_beams=1,
                min_new_tokens=m, max_new_tokens=m,
            )
        else:
            from benchmarks.naive_transformer import naive_greedy_decode

            out = naive_greedy_decode(self.model, b["src"], b["naive_src_mask"], m, COMMON["decoder_start_token_id"])
        return out

    def beam4(self) -> torch.Tensor:
        if self.kind != "hf":
            raise NotImplementedError("the naive baseline has no beam search")
        b, m = self.batch, self.sizes["tgt_len"]
        self.model.eval()
        return self.model.generate(
            input_ids=b["src"], attention_mask=b["src_mask"], do_sample=False, num_beams=4,
            min_new_tokens=m, max_new_tokens=m,
        )

    def run(self, figure: str):
        if figure == "train":
            return self.train_step()
        out = self.greedy() if figure == "greedy" else self.beam4()
        expected = (self.sizes["batch_size"], 1 + self.sizes["tgt_len"])
        if tuple(out.shape) != expected:
            raise RuntimeError(f"{self.name} {figure}: output shape {tuple(out.shape)}, expected {expected}")
        return None

    def supports(self, figure: str) -> bool:
        return not (figure == "beam4" and self.kind == "naive")


def make_batch(sizes: dict, seed: int) -> dict:
    from benchmarks.naive_transformer import make_masks

    g = torch.Generator().manual_seed(seed + 1)
    bsz, s, t, v = sizes["batch_size"], sizes["src_len"], sizes["tgt_len"], sizes["vocab_size"]
    src = torch.randint(FIRST_ORDINARY_ID, v, (bsz, s), generator=g)
    labels = torch.randint(FIRST_ORDINARY_ID, v, (bsz, t), generator=g)
    tgt_in = torch.full_like(labels, COMMON["decoder_start_token_id"])
    tgt_in[:, 1:] = labels[:, :-1]
    naive_src_mask, naive_tgt_mask = make_masks(src, tgt_in, COMMON["pad_token_id"])
    return dict(src=src, src_mask=torch.ones_like(src), labels=labels, tgt_in=tgt_in,
                naive_src_mask=naive_src_mask, naive_tgt_mask=naive_tgt_mask)


# --------------------------------------------------------------------------------------
# FLOPs (analytic, matmuls only) and matmul throughput
# --------------------------------------------------------------------------------------


def analytic_flops(sizes: dict) -> dict:
    d, f, v = sizes["d_model"], sizes["d_ff"], sizes["vocab_size"]
    le, ld = sizes["encoder_layers"], sizes["decoder_layers"]
    b, s, t = sizes["batch_size"], sizes["src_len"], sizes["tgt_len"]

    def encoder(rows):
        # per token: Q,K,V,O projections 8d^2, FFN 4df, scores + weighted sum 4sd
        return le * rows * s * (8 * d * d + 4 * d * f + 4 * s * d)

    def decoder_token(ctx):
        # self-attn projections 8d^2 + scores 4*ctx*d; cross Q,O 4d^2 + scores 4sd; FFN 4df
        return ld * (8 * d * d + 4 * ctx * d + 4 * d * d + 4 * s * d + 4 * d * f)

    cross_kv = ld * s * 4 * d * d  # per row: encoder output through cross K, V
    head = 2 * d * v

    train_fwd = encoder(b) + b * (t * decoder_token(t) + cross_kv + t * head)
    train = 3 * train_fwd

    def cached_decode(rows, m):
        steps = sum(decoder_token(i) + head for i in range(1, m + 1))
        return encoder(b) + rows * (cross_kv + steps)

    def naive_decode(rows, m):  # whole prefix of i tokens at step i, cross K/V recomputed, head on last only
        steps = sum(i * decoder_token(i) + cross_kv + head for i in range(1, m + 1))
        return encoder(b) + rows * steps

    return {
        "method": "analytic matmul FLOPs (2 per multiply-add): projections, attention scores and weighted sums "
                  "(full causal square in training), FFN, output projection; backward = 2 x forward; "
                  "decoding counted as cached incremental decoding",
        "train_per_step": train,
        "train_per_token": train / (b * (s + t)),
        "greedy_per_call": cached_decode(b, t),
        "beam4_per_call": cached_decode(4 * b, t),
        "naive_greedy_executed_per_call": naive_decode(b, t),
        "six_times_params_per_token_note": "for comparison, 6 x trainable params per (src+tgt) token",
    }


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


# --------------------------------------------------------------------------------------
# Memory (child processes)
# --------------------------------------------------------------------------------------


def _proc_status_kb(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _memory_child(name: str, sizes: dict, figure: str, seed: int, threads: int, runs: int) -> dict:
    torch.set_num_threads(threads)
    import transformers

    transformers.logging.set_verbosity_error()
    rss_start = _proc_status_kb("VmRSS")
    c = Contender(name, sizes, seed)
    c.set_batch(make_batch(sizes, seed))
    if figure == "train":
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


def fresh_process_pool() -> ProcessPoolExecutor:
    """One child per task, forked from a server that has imported the libraries but run no model."""
    import multiprocessing as mp

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ProcessPoolExecutor(max_workers=1, mp_context=ctx, max_tasks_per_child=1)


def measure_memory(names, sizes, seed, threads, runs) -> dict:
    results = {}
    with fresh_process_pool() as pool:
        for name in names:
            results[name] = {}
            for figure in FIGURES:
                if figure == "beam4" and name == "naive":
                    continue
                results[name][figure] = pool.submit(_memory_child, name, sizes, figure, seed, threads, runs).result()
    return results


# --------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------


def summarize(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "values": values}


def time_figure(contenders: list[Contender], figure: str, warmup: int, repeats: int) -> tuple[dict, dict]:
    """Seconds per call for each contender, and for the HF ones the seconds inside the model's forward."""
    active = [c for c in contenders if c.supports(figure)]
    for c in active:
        for _ in range(warmup):
            c.run(figure)
    seconds = {c.name: [] for c in active}
    model_seconds = {c.name: [] for c in active if c.kind == "hf"}
    for _ in range(repeats):
        for c in active:  # A B C A B C ...
            c.model_seconds = 0.0
            start = time.perf_counter()
            c.run(figure)
            seconds[c.name].append(time.perf_counter() - start)
            if c.name in model_seconds:
                model_seconds[c.name].append(c.model_seconds)
    return seconds, model_seconds


def _timing_child(names, sizes, figure, seed, threads, warmup, repeats) -> tuple[dict, dict, dict]:
    """time_figure for one figure in a fresh process; also one more training step's loss per contender."""
    torch.set_num_threads(threads)
    import transformers

    transformers.logging.set_verbosity_error()
    contenders = [Contender(name, sizes, seed) for name in names]
    batch = make_batch(sizes, seed)
    for c in contenders:
        c.set_batch(batch)
    seconds, model_seconds = time_figure(contenders, figure, warmup, repeats)
    losses = {c.name: c.train_step() for c in contenders} if figure == "train" else {}
    return seconds, model_seconds, losses


def figure_tokens(sizes: dict, figure: str) -> int:
    b = sizes["batch_size"]
    if figure == "train":
        return b * (sizes["src_len"] + sizes["tgt_len"])
    return b * sizes["tgt_len"]  # new tokens; beam-4 counted as batch * M


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def _fmt_rate(fig: dict | None) -> str:
    if not fig:
        return "n/a"
    t = fig["tokens_per_s"]
    return f"{t['median']:,.0f} [{t['min']:,.0f}-{t['max']:,.0f}]"


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


def compute_ratios(contenders: dict) -> dict:
    def rate(name, figure):
        fig = contenders.get(name, {}).get("figures", {}).get(figure)
        return fig["tokens_per_s"]["median"] if fig else None

    def ratio(a, b):
        return a / b if a is not None and b else None

    spec = {
        "train_ours_sdpa_over_marian": ("ours-sdpa", "marian", "train"),
        "greedy_ours_sdpa_over_marian": ("ours-sdpa", "marian", "greedy"),
        "beam4_ours_sdpa_over_marian": ("ours-sdpa", "marian", "beam4"),
        "greedy_ours_sdpa_over_naive": ("ours-sdpa", "naive", "greedy"),
        "greedy_ours_eager_over_naive": ("ours-eager", "naive", "greedy"),
        "train_ours_eager_over_marian": ("ours-eager", "marian", "train"),
        "train_ours_sdpa_over_naive": ("ours-sdpa", "naive", "train"),
        "greedy_ours_eager_over_marian": ("ours-eager", "marian", "greedy"),
        "beam4_ours_eager_over_marian": ("ours-eager", "marian", "beam4"),
    }
    assert tuple(spec) == RATIO_KEYS
    return {k: ratio(rate(a, fig), rate(b, fig)) for k, (a, b, fig) in spec.items()}


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
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
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output_json", default=None, help="default: benchmarks/results_<size>.json")
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
    if args.output_json is None:
        args.output_json = str(REPO_ROOT / "benchmarks" / f"results_{args.size}.json")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    import transformers

    transformers.logging.set_verbosity_error()
    sizes = SIZES[args.size]
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    log(f"[benchmark] size={args.size} threads={torch.get_num_threads()} contenders={args.contenders}")
    matmul_runs = [measure_matmul(sizes, args.matmul_seconds)]

    contenders = [Contender(name, sizes, args.seed) for name in args.contenders]
    batch = make_batch(sizes, args.seed)
    for c in contenders:
        c.set_batch(batch)
    for c in contenders:
        log(f"[benchmark] {c.name:13s} attn={c.attn_implementation:8s} trainable params={c.params['trainable']:,} "
            f"(frozen {c.params['frozen']:,})")
    trainable = {c.params["trainable"] for c in contenders}
    if len(trainable) != 1:
        log(f"[benchmark] WARNING: trainable parameter counts differ: {sorted(trainable)}")

    flops = analytic_flops(sizes)
    flops["six_times_params_per_token"] = 6 * max(trainable)
    seconds = {}
    model_seconds = {}
    losses = {}
    for figure in args.figures:
        log(f"[benchmark] timing {figure} ...")
        if args.same_process:
            seconds[figure], model_seconds[figure] = time_figure(contenders, figure, args.warmup, args.repeats)
            if figure == "train":
                losses = {c.name: c.train_step() for c in contenders}  # one more step, for a sanity look
        else:
            with fresh_process_pool() as pool:
                seconds[figure], model_seconds[figure], figure_losses = pool.submit(
                    _timing_child, args.contenders, sizes, figure, args.seed, args.threads, args.warmup,
                    args.repeats).result()
            losses.update(figure_losses)

    matmul_runs.append(measure_matmul(sizes, args.matmul_seconds))
    square = [m["square_1024"] for m in matmul_runs]
    matmul = {
        "square_1024": square,
        "model_shaped": [m["model_shaped"] for m in matmul_runs],
        "model_shaped_dims": matmul_runs[0]["model_shaped_dims"],
        "reference_gflops": statistics.median(square),
        "when": ["start", "end"],
    }

    memory = {}
    if args.memory:
        log("[benchmark] measuring memory in child processes ...")
        memory = measure_memory(args.contenders, sizes, args.seed, args.threads, args.memory_runs)

    ref_flops = matmul["reference_gflops"] * 1e9
    flop_key = {"train": "train_per_step", "greedy": "greedy_per_call", "beam4": "beam4_per_call"}
    result_contenders = {}
    for c in contenders:
        figures = {}
        for figure in args.figures:
            secs = seconds[figure].get(c.name)
            if not secs:
                continue
            tokens = figure_tokens(sizes, figure)
            med = statistics.median(secs)
            achieved = flops[flop_key[figure]] / med
            entry = {
                "seconds": summarize(secs),
                "tokens_per_call": tokens,
                "tokens_per_s": summarize([tokens / s for s in secs]),
                "useful_gflops_per_s": achieved / 1e9,
                "fraction_of_matmul": achieved / ref_flops,
            }
            if figure != "train" and c.name in model_seconds[figure]:
                inside = model_seconds[figure][c.name]
                entry["model_seconds"] = summarize(inside)
                entry["generate_own_seconds"] = summarize([t - m for t, m in zip(secs, inside)])
            if figure == "greedy" and c.kind == "naive":
                executed = flops["naive_greedy_executed_per_call"] / med
                entry["executed_gflops_per_s"] = executed / 1e9
                entry["executed_fraction_of_matmul"] = executed / ref_flops
            figures[figure] = entry
        result_contenders[c.name] = {
            "attn_implementation": c.attn_implementation,
            "params": c.params,
            "figures": figures,
            "final_train_loss": losses.get(c.name),
            "memory": memory.get(c.name),
        }

    result = {
        "command": shlex.join([sys.executable, *(sys.argv if argv is None else [__file__, *argv])]),
        "size": args.size,
        "sizes": sizes,
        "common": COMMON,
        "machine": {
            "cpu_model": cpu_model(),
            "logical_cpus": os.cpu_count(),
            "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "threads": torch.get_num_threads(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_at_end": list(os.getloadavg()),
        },
        "settings": {"repeats": args.repeats, "warmup": args.warmup, "seed": args.seed,
                     "timing_process": "this process" if args.same_process else "a fresh child process per figure",
                     "contenders": args.contenders, "figures": args.figures, "memory_runs": args.memory_runs,
                     "dtype": "float32", "padding": "none (all positions are tokens; attention masks of ones passed)"},
        "matmul": matmul,
        "flops": flops,
        "memory_method": "per contender and figure, a fresh child process (multiprocessing forkserver with the "
                         "libraries preloaded) builds the model, inputs (and optimizer object), reads VmRSS, "
                         "resets the peak by writing 5 to /proc/self/clear_refs, runs the figure "
                         f"{args.memory_runs}x, and reports VmHWM - VmRSS(before) as peak_delta_mb; includes "
                         "grads and AdamW moments for train, KV cache and logits for decoding, and one-time "
                         "costs (first-touched library pages, allocator caches)",
        "contenders": result_contenders,
    }
    result["ratios"] = compute_ratios(result_contenders)

    out = Path(args.output_json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown_report(result))
    log(f"[benchmark] wrote {out}")
    return result


if __name__ == "__main__":
    main()
