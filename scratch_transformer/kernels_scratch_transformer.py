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
"""

import torch
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


def _plain_linear_module(layer: nn.Module) -> bool:
    """True when calling `layer` would do nothing but nn.Linear.forward: its type is exactly nn.Linear (not a
    quantized, parametrized, LoRA or other subclass) and no hook or replaced forward (pruning's mask, accelerate's
    offload hooks, a user's forward hook) would run around it."""
    return (
        type(layer) is nn.Linear
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
        (`_plain_linear_module`), the call is plain inference on CPU (autograd off, fp32, no autocast;
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
        _plain_linear_module(layer)
        and _plain_cpu_inference(x, layer.weight, layer.bias)
        and x.numel() * layer.out_features >= MIN_ONEDNN_MACS  # last: under tracing numel() is a tensor
    ):
        return torch.ops.mkldnn._linear_pointwise(x, layer.weight, layer.bias, "none", [], "")
    return layer(x)
