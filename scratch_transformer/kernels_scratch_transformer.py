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
  The oneDNN op is private to torch: where it is missing, raises, or at its first use disagrees with F.linear
  (a torch that changed it), the projections use F.linear, with one RuntimeWarning; and
  SCRATCH_TRANSFORMER_ONEDNN_LINEAR=0 in the environment (read at import) keeps them on F.linear from the start.
- `dropout(layer, x)` and `dropout_values(x, p)`: `layer(x)` for the model's `nn.Dropout` modules and
  `F.dropout(x, p)` for the attention weights; in CPU training the keep/drop mask is drawn 4 values from one
  64-bit random number instead of torch's one Bernoulli draw per value, which runs serially on CPU.
"""

import numbers
import os
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd import forward_ad
from torch.nn.modules import module as _module


ONEDNN_LINEAR_VARIABLE = "SCRATCH_TRANSFORMER_ONEDNN_LINEAR"  # 0: F.linear everywhere; 1 (the default): oneDNN


def _onednn_linear_available() -> bool:
    """True when this torch has oneDNN's linear op and SCRATCH_TRANSFORMER_ONEDNN_LINEAR is not 0.
    Raises ValueError for a value of that variable other than 0/1 (false/true, no/yes, off/on)."""
    setting = os.environ.get(ONEDNN_LINEAR_VARIABLE, "1").strip().lower()
    if setting not in ("0", "false", "no", "off", "1", "true", "yes", "on", ""):
        raise ValueError(f"{ONEDNN_LINEAR_VARIABLE} must be 0 (F.linear everywhere) or 1 (oneDNN's linear where it "
                         f"is faster, the default), got {os.environ[ONEDNN_LINEAR_VARIABLE]!r}")
    if setting in ("0", "false", "no", "off"):
        return False
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_LINEAR = _onednn_linear_available()  # switched off for the process if the op fails (`_onednn_linear`)
_ONEDNN_LINEAR_CHECKED = False  # its first product has been checked against F.linear

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
        `torch.backends.mkldnn.flags(enabled=False)`, quantized and other non-nn.Linear modules, hooks; and, for
        the rest of the process, everything once the oneDNN op has raised or disagreed with F.linear
        (`_onednn_linear`: a torch that lacks or changed the private op), or with SCRATCH_TRANSFORMER_ONEDNN_LINEAR=0.
    Warns:
        RuntimeWarning, once, when the oneDNN op fails and F.linear takes over.
    """
    if (
        _plain_module(layer)
        and _plain_cpu_inference(x, layer.weight, layer.bias)
        and x.numel() * layer.out_features >= MIN_ONEDNN_MACS  # last: under tracing numel() is a tensor
    ):
        y = _onednn_linear(layer, x)
        if y is not None:
            return y
    return layer(x)


def _onednn_linear(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's x W^T + b, or None when its op raises (missing in this torch, or called differently) or its first
    product disagrees with F.linear beyond float rounding: the op is private and may change with torch. Then the
    oneDNN path is switched off for the rest of the process, with one RuntimeWarning saying why."""
    global _ONEDNN_LINEAR, _ONEDNN_LINEAR_CHECKED
    try:
        y = torch.ops.mkldnn._linear_pointwise(x, layer.weight, layer.bias, "none", [], "")
    except Exception as error:  # any failure of the private op: the public one gives the same product
        problem = f"raised {type(error).__name__}: {(str(error).strip().splitlines() or [''])[0][:200]}"
    else:
        if _ONEDNN_LINEAR_CHECKED:
            return y
        expected = F.linear(x, layer.weight, layer.bias)
        if (isinstance(y, torch.Tensor) and y.shape == expected.shape and y.dtype == expected.dtype
                and torch.allclose(y, expected, rtol=1e-3, atol=1e-4, equal_nan=True)):
            _ONEDNN_LINEAR_CHECKED = True
            return y
        problem = "gave another product than F.linear"
    _ONEDNN_LINEAR = False
    warnings.warn(f"torch {torch.__version__}: oneDNN's linear op (torch.ops.mkldnn._linear_pointwise) {problem}; "
                  "the model's projections use F.linear from now on (the same results, slower at CPU inference)",
                  RuntimeWarning, stacklevel=3)
    return None


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


# ======== Cross-entropy with label smoothing (paper 5.4) over the vocabulary logits ==================
# F.cross_entropy on (b * t, v) logits makes several whole (b * t, v) float32 tensors: the upcast of bf16 logits, the
# log-softmax, and in backward the NLL gradient (zero-filled), the smoothing gradient, their sum and the
# log-softmax gradient, 45 MB each for a batch of 64 x 22 targets (8000 ids), and it takes the exponential of every
# logit twice (forward and backward). They were 27% of the main job's bf16 step (torch.profiler, 20 steps, 2 AMD
# EPYC cores family 25 model 17, 2026-12-04). Here the rows go through in chunks of CROSS_ENTROPY_CHUNK_ROWS in one
# float32 buffer that stays in the CPU's cache, and each logit's exponential is taken once: the loss is a scalar,
# so its gradient is d(loss)/d(logits) (softmax minus the smoothed target) times the scalar that backward brings,
# and forward writes that gradient, in the logits' own dtype, while it has the softmax at hand. Float32 logits (fp32
# training) skip the buffer: each chunk's gradient is computed in place in its rows of the gradient, read from the
# logits themselves, which saves two (b * t, v) copies a step (7 ms of a 295 ms fp32 step: torch.profiler, 20 steps,
# 2 Intel Xeon cores family 6 model 207, 2026-12-06).

CROSS_ENTROPY_CHUNK_ROWS = 128  # 128 x 8000 float32 = 4 MB: 2 MB, one L2, for each of 2 cores (AMD EPYC family 25 model 17)


class _ChunkedCrossEntropy(torch.autograd.Function):
    """sum over labelled rows of lse(x) - (1 - eps) x_y - eps mean_v(x), by chunks of rows; see cross_entropy."""

    @staticmethod
    def forward(ctx, logits, labels, label_smoothing: float, chunk_rows: int, with_grad: bool):
        rows, vocab_size = logits.shape
        eps = label_smoothing
        accumulate = torch.promote_types(logits.dtype, torch.float32)  # float32, or float64 for float64 logits
        total = torch.zeros((), dtype=accumulate, device=logits.device)
        grad = torch.empty_like(logits) if with_grad else None  # d(total) / d(logits), (n, v)
        # float32 (float64) logits with a gradient to keep: each chunk is worked on in place in its rows of `grad`, read
        # straight from the logits (no staging copy in, none out); otherwise in one float32 buffer
        in_grad = with_grad and logits.dtype == accumulate
        buffer = None if in_grad else torch.empty(min(chunk_rows, rows), vocab_size, dtype=accumulate,
                                                  device=logits.device)
        for start in range(0, rows, chunk_rows):
            y = labels[start : start + chunk_rows]  # (c,)
            if in_grad:
                source = logits[start : start + chunk_rows]  # (c, v) float32, read only
                x = grad[start : start + chunk_rows]  # (c, v) float32, overwritten below
            else:
                source = x = buffer[: y.size(0)].copy_(logits[start : start + chunk_rows])  # (c, v) float32
            kept = y != -100  # (c,): False on rows without loss
            picked = source.gather(1, y.clamp(min=0)[:, None]).squeeze(1)  # (c, v) -> (c,): x_y (any id on -100 rows)
            row_loss = -(1.0 - eps) * picked
            if eps:
                row_loss = row_loss - eps * source.mean(dim=-1)
            top = source.amax(dim=-1, keepdim=True)  # (c, 1)
            exp_sum = torch.sub(source, top, out=x).exp_().sum(dim=-1)  # x is now exp(x - max): (c, v); row sums (c,)
            row_loss = row_loss + top.squeeze(1) + exp_sum.log()  # + lse(x)
            total += torch.where(kept, row_loss, 0.0).sum()  # where, not * 0: an inf/NaN in a -100 row stays out
            if with_grad:  # softmax - eps / v - (1 - eps) [id == y], zero on rows without loss
                x.div_(exp_sum[:, None])
                if eps:
                    x.sub_(eps / vocab_size)
                x.scatter_add_(1, y.clamp(min=0)[:, None], x.new_full((y.size(0), 1), -(1.0 - eps)))
                unlabelled = (~kept).nonzero().squeeze(1)  # (u,): the rows without loss, padding mostly
                if unlabelled.numel():
                    x.index_fill_(0, unlabelled, 0.0)  # those rows only, not a pass over the whole chunk
                if not in_grad:
                    grad[start : start + chunk_rows] = x  # cast to the logits' dtype
        ctx.gradient = grad  # on ctx, not saved: backward scales it in place and lets it go (see backward)
        return total

    @staticmethod
    def backward(ctx, grad_total: torch.Tensor):
        if torch.is_grad_enabled():  # backward with create_graph=True: a gradient of this gradient is wanted
            # the kept gradient is a constant to autograd: a second-order term through it would silently be 0
            raise RuntimeError(
                "scratch_transformer's chunked cross-entropy has no second-order gradient (backward or autograd.grad "
                "with create_graph=True): use torch.nn.functional.cross_entropy for that (torch.func transforms "
                "already get it)"
            )
        grad, ctx.gradient = ctx.gradient, None
        if grad is None:  # retain_graph=True and a second backward: the kept gradient was scaled and handed on
            raise RuntimeError(
                "backward went through scratch_transformer's chunked cross-entropy a second time (retain_graph=True): "
                "its first backward scaled the kept (n, v) gradient in place; compute the loss again for a new backward"
            )
        # scaled in place, not copied: a fresh (n, v) tensor was 13 of the 17 ms of this backward for 1400 x 8000
        # float32 logits (2 Intel Xeon cores family 6 model 207, 2026-12-06); a 0-dim float32 factor: bf16 grad,
        # scale not rounded
        return grad.mul_(grad_total), None, None, None, None


def _chunked_cross_entropy_applies(logits: torch.Tensor) -> bool:
    """True on CPU, and with no tracing, compiling or torch.func transform (which must see torch's own op)."""
    return (
        logits.device.type == "cpu"
        and logits.is_floating_point()
        and logits.dim() == 2
        and logits.size(0) > 0
        and logits.size(1) > 0
        and not torch._C._are_functorch_transforms_active()
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


def check_labels(labels: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Target ids for a loss over vocab_size classes, checked: any shape, integer ids in [0, vocab_size) or -100.

    Returns:
        labels as int64 (the ids gather and F.cross_entropy take).
    Raises:
        ValueError: labels not of an integer dtype, or an id outside [0, vocab_size) other than -100 (the message
            gives the range found). Under a torch.func transform (vmap cannot index by a mask) the ids are left to
            torch's own op to check; so they are while torch.compile or torch.export traces the model (reading
            the ids' values is a data-dependent branch: a graph break, and a host sync at every step).
    """
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"labels must be integer ids, got dtype {labels.dtype}")
    labels = labels.long()
    if not torch._C._are_functorch_transforms_active() and not torch.compiler.is_compiling():
        labelled = labels[labels != -100]
        if labelled.numel() and (int(labelled.min()) < 0 or int(labelled.max()) >= vocab_size):
            raise ValueError(
                f"labels must be in [0, vocab_size={vocab_size}) or -100 (no loss), got range "
                f"[{int(labelled.min())}, {int(labelled.max())}]"
            )
    return labels


def _check_cross_entropy_inputs(logits: torch.Tensor, labels: torch.Tensor, label_smoothing) -> torch.Tensor:
    """labels as int64 after checking that logits are floating (n, v), labels n ids (`check_labels`) and
    label_smoothing a number in [0, 1); raises ValueError naming the problem."""
    if logits.dim() != 2 or not logits.is_floating_point():
        raise ValueError(f"cross_entropy: logits must be floating-point (rows, vocab_size), got shape "
                         f"{tuple(logits.shape)} of {logits.dtype}")
    if labels.dim() != 1 or labels.size(0) != logits.size(0):
        raise ValueError(f"cross_entropy: labels must be ({logits.size(0)},), one per logits row, got shape "
                         f"{tuple(labels.shape)}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real) or not (
        0.0 <= label_smoothing < 1.0
    ):
        raise ValueError(f"label_smoothing must be a number in [0, 1), got {label_smoothing!r}")
    return check_labels(labels, logits.size(1))


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Summed cross-entropy of the labelled rows, in float32 (float64 for float64 logits): F.cross_entropy(logits,
    labels, ignore_index=-100, reduction="sum", label_smoothing=label_smoothing) on logits upcast to float32.

    Args:
        logits: (n, v), any floating dtype (bf16 under autocast); the gradient comes back in that dtype.
        labels: (n,) integer ids in [0, v), or -100 for rows without loss.
        label_smoothing: eps in [0, 1) (paper 5.4): the target is (1 - eps) on the label plus eps / v on every id,
            so a row's loss is lse(x) - (1 - eps) x_y - eps mean_v(x), with lse the log-sum-exp over the v ids.
    Returns:
        A float32 (float64) scalar, the sum over rows with labels != -100 (0 with zero gradients when there are none).
        On CPU (`_chunked_cross_entropy_applies`) it is computed CROSS_ENTROPY_CHUNK_ROWS rows at a time in one
        float32 buffer (for float32 / float64 logits that require grad, in the gradient's own rows), and when the
        logits require grad their gradient is computed there too and kept (one (n, v) tensor of the logits' dtype)
        for backward, which scales it in place; elsewhere it is F.cross_entropy on the float32 logits. The two agree
        up to float32 rounding (summation order) and, for bf16 logits, the bf16 rounding of the gradient, which
        torch's own backward also returns in bf16.
    Raises:
        ValueError: logits not floating (n, v), labels not n integer ids, an id outside [0, v) other than -100 (-1
            would otherwise read as id 0 in the chunked path), label_smoothing not a number in [0, 1).
        RuntimeError (in backward, on CPU): a second backward through a retained graph, or create_graph=True (no
            second-order gradient); the message names which.
    """
    labels = _check_cross_entropy_inputs(logits, labels, label_smoothing)  # (n,) int64: gather / scatter take them
    label_smoothing = float(label_smoothing)
    if _chunked_cross_entropy_applies(logits):
        return _ChunkedCrossEntropy.apply(logits, labels, float(label_smoothing), CROSS_ENTROPY_CHUNK_ROWS,
                                          logits.requires_grad and torch.is_grad_enabled())
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return F.cross_entropy(logits, labels.long(), ignore_index=-100, reduction="sum", label_smoothing=label_smoothing)
