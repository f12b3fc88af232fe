"""Speed code of the Transformer, kept out of the modeling file: each kernel here gives the same result as the
torch op it stands in for, and is tested against that op (tests/test_kernels.py).

It sits flat beside modeling_scratch_transformer.py and is imported relatively, so `save_pretrained` copies it
beside the weights and `from_pretrained(..., trust_remote_code=True)` loads it without this package.

- `linear(layer, x)`: `layer(x)` for the model's projections, which are plain `nn.Linear` modules; at plain
  fp32 CPU inference a big enough product runs through oneDNN's linear kernel instead of MKL's sgemm.
  The modules stay exactly `nn.Linear`, so tools that match that type work on the model as on any HF model:
  `torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)` turns every projection
  into `torch.ao.nn.quantized.dynamic.Linear`, which `linear` then simply calls (int8 inference; generate()
  works on the result), and so do pruning, PEFT target modules and converters that read nn.Linear weights.
- `dropout(layer, x)` and `dropout_values(x, p)`: `layer(x)` for the model's `nn.Dropout` modules and
  `F.dropout(x, p)` for the attention weights; in CPU training the keep/drop mask is drawn 4 values from one
  64-bit random number instead of torch's one Bernoulli draw per value, which runs serially on CPU.
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import forward_ad
from torch.nn.modules import module as _module


def _onednn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_LINEAR = _onednn_linear_available()

# oneDNN has a fixed cost of up to ~11 us more per call than F.linear: they break even near 2^22 multiply-adds
# and oneDNN wins from 2^24 (benchmarks/micro_kernels.py, 2 threads: 4 x 32 x 64: 15 against 5 us;
# 64 x 256 x 256: 63 against 62 us; 64 x 256 x 1024: 200 against 263 us)
MIN_ONEDNN_MACS = 2**23


def _plain_module(layer: nn.Module, kind: type = nn.Linear) -> bool:
    """True when calling `layer` would do nothing but kind.forward (nn.Linear's by default): its type is exactly
    `kind` (not a quantized, parametrized, LoRA or other subclass) and no hook or replaced forward (pruning's mask,
    accelerate's offload hooks, a user's forward hook) would run around it."""
    return (
        type(layer) is kind
        and not layer._forward_pre_hooks
        and not layer._forward_hooks
        and "forward" not in layer.__dict__
        and not _module._global_forward_pre_hooks
        and not _module._global_forward_hooks
    )


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


def linear(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """y = layer(x) = x W^T + b for a projection of the model, faster at plain fp32 CPU inference.

    Args:
        layer: the projection, an nn.Linear (or whatever tooling replaced it with: a quantized, LoRA or
            hooked module is simply called).
        x: (..., in_features).
    Returns:
        (..., out_features). When `layer` is exactly an nn.Linear with nothing around its forward
        (`_plain_module`), the call is plain inference on CPU (autograd off, fp32, no autocast;
        `_plain_cpu_inference`) and the product has at least `MIN_ONEDNN_MACS` multiply-adds
        (rows x in_features x out_features), it runs through oneDNN's linear kernel
        (`torch.ops.mkldnn._linear_pointwise`, the kernel torch.compile picks for CPU linears) instead of
        nn.Linear's MKL sgemm: for the 64-row inputs of decoding on 2 AMD EPYC cores 1.3-1.6x faster (output
        projection 256 -> 8000: 2.6 -> 1.6 ms; `python -m benchmarks.micro_kernels`), same values up to float
        rounding (summation order; about 1e-6 relative). Everything else is `layer(x)`: training, torch.func /
        forward AD, tracing and export, other dtypes and devices, builds without oneDNN,
        `torch.backends.mkldnn.flags(enabled=False)`, quantized and other non-nn.Linear modules, hooks.
    """
    if (
        _plain_module(layer)
        and _plain_cpu_inference(x, layer.weight, layer.bias)
        and x.numel() * layer.out_features >= MIN_ONEDNN_MACS  # last: under tracing numel() is a tensor
    ):
        return torch.ops.mkldnn._linear_pointwise(x, layer.weight, layer.bias, "none", [], "")
    return layer(x)


# ======== Dropout (paper 5.4) in CPU training ========================================================
# torch's CPU dropout draws one Bernoulli number per value from its Mersenne Twister, one value after the other:
# for the main job's step at the small size that was 13% of the step's CPU time (26 calls, 54 ms a step;
# torch.profiler, 2 AMD EPYC cores, 2026-12-01). Here one 64-bit draw of the same generator gives four 16-bit
# uniform numbers, each compared with p: the draws 4.3x faster for a 64 x 24 x 1024 tensor (12.7 -> 3.0 ms), dropout
# forward + backward 2.8x (bf16: 15.1 -> 5.3 ms).


def _fast_dropout_applies(x: torch.Tensor, p: float) -> bool:
    """True for a CPU floating-point tensor, 0 < p < 1, and no tracing, compiling or torch.func transform (which
    must see torch's own dropout op)."""
    return (
        0.0 < p < 1.0
        and x.device.type == "cpu"
        and x.is_floating_point()
        and not torch._C._are_functorch_transforms_active()
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


def dropout_values(x: torch.Tensor, p: float) -> torch.Tensor:
    """F.dropout(x, p, training=True): each value zeroed with probability p, the others scaled by 1 / (1 - p).

    Args:
        x: any shape, floating point.
        p: drop probability in [0, 1].
    Returns:
        A tensor of x's shape and dtype. On CPU (`_fast_dropout_applies`) the mask comes from
        `torch.empty(ceil(n / 4), dtype=int64).random_(-2**63, 2**63 - 1)` read as n int16 numbers u, uniform on
        [-32768, 32767], a value kept where u >= round(p * 65536) - 32768: kept with probability 1 - p rounded to a
        multiple of 2^-16 (p 0.1: 0.899994 instead of 0.9), drawn from torch's default generator, so
        `torch.manual_seed` makes it repeatable. Kept values are x times (1 / (1 - p) in x's dtype), as torch's
        CPU dropout scales them; the gradient is the upstream gradient times the same mask. Elsewhere (other
        devices, p 0 or 1, tracing, compiling, torch.func) this is F.dropout itself.
    Raises:
        ValueError: p outside [0, 1] (F.dropout's error).
    """
    if not _fast_dropout_applies(x, p):
        return F.dropout(x, p, training=True)
    n = x.numel()
    words = torch.empty((n + 3) // 4, dtype=torch.int64, device=x.device).random_(-(2**63), 2**63 - 1)
    uniform = words.view(torch.int16)[:n].view(x.shape)  # (ceil(n / 4),) int64 -> x's shape of int16
    keep = uniform >= round(p * 65536) - 32768
    return x * keep.to(x.dtype).mul_(1.0 / (1.0 - p))


def dropout(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """y = layer(x) for the model's dropouts (paper 5.4), faster in CPU training.

    Args:
        layer: an nn.Dropout (or whatever replaced it: any other module, or one with hooks, is simply called).
        x: any shape.
    Returns:
        x's shape. In training, for exactly an nn.Dropout with nothing around its forward and not in place,
        `dropout_values(x, layer.p)`; otherwise `layer(x)` (in eval mode: x itself).
    """
    if layer.training and _plain_module(layer, nn.Dropout) and not layer.inplace:
        return dropout_values(x, layer.p)
    return layer(x)
