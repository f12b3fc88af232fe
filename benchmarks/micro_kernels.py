#!/usr/bin/env python
"""Per-kernel timings behind two choices in modeling_scratch_transformer.py (prints figures, asserts nothing).

1. Linear layers at inference: F.linear (MKL sgemm) against oneDNN's `_linear_pointwise`, for the
   products of the small benchmark size (decoding step: 64 rows; beam 4: 256 rows; encoder: 1536 rows).
   `ScratchTransformerLinear` uses oneDNN from `min_onednn_macs` multiply-adds up.
2. The loss: F.cross_entropy against `SoftmaxCrossEntropy` (gradient written out, computed in place),
   forward + backward on (1536, 8000) logits; both timings include a copy of the logits (made fresh
   each time so the backward has a leaf to fill), which is timed alone too.

Usage: python benchmarks/micro_kernels.py [--threads 2]
"""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scratch_transformer.modeling_scratch_transformer import (  # noqa: E402
    _ONEDNN_LINEAR,
    ScratchTransformerLinear,
    cross_entropy_loss,
)


def median_us(fn, calls: int, rounds: int = 7) -> float:
    for _ in range(max(3, calls // 20)):
        fn()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls)
    return sorted(times)[rounds // 2] * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, oneDNN linear available: {_ONEDNN_LINEAR}")
    if not _ONEDNN_LINEAR:
        return
    onednn = torch.ops.mkldnn._linear_pointwise
    print(f"\nlinear, no_grad (threshold min_onednn_macs = {ScratchTransformerLinear.min_onednn_macs:,})")
    print("| rows x in -> out | multiply-adds | F.linear us | oneDNN us | F.linear / oneDNN |")
    print("|---|---:|---:|---:|---:|")
    shapes = [(4, 32, 64), (64, 256, 256), (64, 256, 1024), (64, 1024, 256), (64, 256, 8000),
              (256, 256, 256), (256, 256, 1024), (256, 256, 8000), (1536, 256, 256), (1536, 256, 1024)]
    with torch.no_grad():
        for rows, d_in, d_out in shapes:
            x, w = torch.randn(rows, d_in), torch.randn(d_out, d_in) * d_in**-0.5
            b = None if d_out == 8000 else torch.randn(d_out)
            calls = max(20, int(2e9 / (rows * d_in * d_out * 2 + 2e5)))
            plain = median_us(lambda: F.linear(x, w, b), calls)
            fast = median_us(lambda: onednn(x, w, b, "none", [], ""), calls)
            print(f"| {rows} x {d_in} -> {d_out} | {rows * d_in * d_out:,} | {plain:,.1f} | {fast:,.1f} "
                  f"| {plain / fast:.2f} |")

    logits = torch.randn(1536, 8000)
    labels = torch.randint(4, 8000, (1536,))
    labels[:50] = -100
    labelled = int((labels != -100).sum())

    def reference():
        x = logits.clone().requires_grad_()
        (F.cross_entropy(x, labels, ignore_index=-100, reduction="sum") / labelled).backward()

    def ours():
        x = logits.clone().requires_grad_()
        cross_entropy_loss(x[None], labels[None], labelled).backward()

    copy = median_us(lambda: logits.clone(), 10) / 1000
    ref_ms, ours_ms = median_us(reference, 5) / 1000, median_us(ours, 5) / 1000
    print("\nloss forward + backward on (1536, 8000) logits, 50 rows unlabelled")
    print(f"F.cross_entropy: {ref_ms:.1f} ms; SoftmaxCrossEntropy: {ours_ms:.1f} ms; "
          f"of each, the copy of the logits: {copy:.1f} ms")


if __name__ == "__main__":
    main()
