#!/usr/bin/env python
"""Per-kernel timings behind the kernel of kernels_scratch_transformer.py (prints figures, asserts nothing).

Linear layers at inference: F.linear (MKL sgemm) against oneDNN's `_linear_pointwise`, for the
products of the small benchmark size (decoding step: 64 rows; beam 4: 256 rows; encoder: 1536 rows).
`linear(layer, x)` uses oneDNN from `MIN_ONEDNN_MACS` multiply-adds up.

Usage: python -m benchmarks.micro_kernels [--threads 2]   (the package installed, as README's set-up does)
"""

import argparse
import time

import torch
import torch.nn.functional as F

from scratch_transformer.kernels_scratch_transformer import _ONEDNN_LINEAR, MIN_ONEDNN_MACS


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
    print(f"\nlinear, no_grad (threshold MIN_ONEDNN_MACS = {MIN_ONEDNN_MACS:,})")
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


if __name__ == "__main__":
    main()
