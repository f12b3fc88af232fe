"""Speed code of the Transformer, kept out of the modeling file: each kernel here is a drop-in replacement
for a torch op, with the same parameters and the same result, and is tested against that op
(tests/test_kernels.py).

It sits flat beside modeling_scratch_transformer.py and is imported relatively, so `save_pretrained` copies it
beside the weights and `from_pretrained(..., trust_remote_code=True)` loads it without this package.

- `ScratchTransformerLinear`: nn.Linear, running oneDNN's linear kernel at plain fp32 CPU inference
  (replaces `F.linear`; used by every projection of the model, so by translate.py and the pipeline).
"""

import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F
from torch import nn


def _onednn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_LINEAR = _onednn_linear_available()


def _plain_cpu_inference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """True when nothing needs nn.Linear's own op: no autograd (backward, forward-mode AD, torch.func
    transforms), no tracing/compiling/export (they should record aten.linear), no autocast, oneDNN enabled,
    fp32 CPU tensors and a packed bias (the oneDNN op reads the bias as contiguous)."""
    return (
        _ONEDNN_LINEAR
        and not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
        and not torch.is_autocast_enabled("cpu")
        and torch.backends.mkldnn.enabled
        and forward_ad._current_level < 0
        and not torch._C._are_functorch_transforms_active()
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


class ScratchTransformerLinear(nn.Linear):
    """y = x W^T + b: nn.Linear, with its parameters, init and state-dict names, and a faster inference kernel.

    Shapes: x (..., in_features) -> (..., out_features). At plain inference on CPU (autograd off, fp32,
    no autocast; see `_plain_cpu_inference`), products of at least `min_onednn_macs` multiply-adds
    (rows x in_features x out_features) run through oneDNN's linear kernel
    (`torch.ops.mkldnn._linear_pointwise`, the kernel torch.compile picks for CPU linears) instead of
    nn.Linear's MKL sgemm: for the 64-row inputs of decoding on 2 cores it is 1.3-1.6x faster (output
    projection 256 -> 8000: 2.6 -> 1.6 ms; 256 -> 1024: 263 -> 200 us; `benchmarks/micro_kernels.py`
    prints these, `scripts/benchmark.py` the end-to-end effect). Same values up to float rounding
    (summation order; about 1e-6 relative).
    Everything else (training, torch.func / forward AD, tracing and export, other dtypes and devices,
    builds without oneDNN, `torch.backends.mkldnn.flags(enabled=False)`) uses F.linear.
    torch.ao's `quantize_dynamic` matches exact types and leaves these layers in fp32: turn them into
    plain nn.Linear first (`module.__class__ = nn.Linear` for each; same attributes), then quantize.
    """

    # oneDNN has a fixed cost of up to ~11 us more per call than F.linear: they break even near 2^22
    # multiply-adds and oneDNN wins from 2^24 (benchmarks/micro_kernels.py, 2 threads: 4 x 32 x 64: 15
    # against 5 us; 64 x 256 x 256: 63 against 62 us; 64 x 256 x 1024: 200 against 263 us)
    min_onednn_macs = 2**23

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() * self.out_features >= self.min_onednn_macs and _plain_cpu_inference(x, self.weight, self.bias):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
