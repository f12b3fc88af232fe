"""Kernels of kernels_scratch_transformer.py, each against the torch op it stands in for (`linear(layer, x)` against
`layer(x)` / F.linear): same values, same autograd, and the module's own call wherever the fast path must not run;
the model's projections are plain nn.Linear, so torch's int8 `quantize_dynamic` converts them all."""

import copy
import re
import warnings
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from torch.nn.utils import prune

import scratch_transformer.kernels_scratch_transformer as kernels
from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer.kernels_scratch_transformer import _ONEDNN_LINEAR, linear

TINY = ScratchTransformerConfig(vocab_size=40, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64,
                                dropout=0.0, max_position_embeddings=64)
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "out_proj", "fc1", "fc2", "lm_head")
# torch.ao.quantization's deprecation notices, and torch.jit / mkldnn.flags notices
QUIET = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")


@pytest.fixture
def onednn_calls(monkeypatch):
    """Counts the calls of oneDNN's linear op; every product is big enough for it (threshold 0)."""
    monkeypatch.setattr(kernels, "MIN_ONEDNN_MACS", 0)
    calls = []
    if _ONEDNN_LINEAR:
        original = torch.ops.mkldnn._linear_pointwise
        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", lambda *a: calls.append(1) or original(*a))
    return calls


class Projection(nn.Module):
    """linear(layer, x) as a module, as the model calls it (for torch.jit.trace)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(self.layer, x)


def projections(model):
    return [(name, module) for name, module in model.named_modules() if name.rsplit(".", 1)[-1] in PROJECTIONS]


def test_model_projections_are_plain_nn_linear_with_unchanged_names():
    """Every projection is exactly nn.Linear (type matchers see it), the state-dict names are the old ones, and
    the output projection is still tied to the target embedding (paper 3.4)."""
    torch.manual_seed(0)
    model = ScratchTransformerForConditionalGeneration(TINY).eval()
    found = projections(model)
    assert len(found) == 2 * 6 + 2 * 10 + 1  # per encoder layer 4 attention + 2 ffn, decoder 8 + 2; lm_head
    assert all(type(module) is nn.Linear for _, module in found)
    keys = set(model.state_dict())
    assert {"model.encoder.layers.0.self_attn.q_proj.weight", "model.decoder.layers.1.encoder_attn.out_proj.bias",
            "model.decoder.layers.0.ffn.fc1.weight", "lm_head.weight"} <= keys
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight


def test_linear_matches_f_linear_and_respects_autograd_and_autocast(onednn_calls):
    """linear(layer, x): oneDNN's kernel at fp32 CPU inference, the same values as F.linear; layer(x) otherwise."""
    torch.manual_seed(0)
    layer, head = nn.Linear(32, 48), nn.Linear(32, 80, bias=False)
    for x in (torch.randn(5, 32), torch.randn(3, 4, 32), torch.randn(3, 4, 64)[..., ::2]):
        for module in (layer, head):
            with torch.no_grad():
                fast = linear(module, x)
            expected = nn.functional.linear(x, module.weight, module.bias)
            assert fast.shape == expected.shape and fast.grad_fn is None
            torch.testing.assert_close(fast, expected, atol=1e-5, rtol=1e-5)
    assert len(onednn_calls) == (6 if _ONEDNN_LINEAR else 0)  # the fast path is the one taken
    # with autograd on it is exactly layer(x), and differentiable
    x = torch.randn(3, 4, 32, requires_grad=True)
    y = linear(layer, x)
    assert y.grad_fn is not None and torch.equal(y, layer(x))
    # bf16 autocast still casts the product (the oneDNN path must not bypass it)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert linear(layer, torch.randn(3, 32)).dtype == torch.bfloat16
    assert len(onednn_calls) == (6 if _ONEDNN_LINEAR else 0)


def test_linear_threshold_leaves_small_products_to_the_module(monkeypatch, onednn_calls):
    """Products below MIN_ONEDNN_MACS multiply-adds (rows x in x out) run nn.Linear's own op."""
    if not _ONEDNN_LINEAR:
        pytest.skip("this torch build has no oneDNN linear")
    monkeypatch.setattr(kernels, "MIN_ONEDNN_MACS", 3 * 32 * 48)
    layer = nn.Linear(32, 48)
    with torch.no_grad():
        linear(layer, torch.randn(3, 32))
        linear(layer, torch.randn(2, 32))  # 2 x 32 x 48 multiply-adds: below the threshold
    assert onednn_calls == [1]


@QUIET
def test_linear_leaves_other_uses_to_the_module(onednn_calls):
    """Cases where only the module's own call is right: a strided bias, forward-mode AD and tracing under no_grad,
    oneDNN switched off, a subclass, a forward hook, pruning's mask hook, a quantized module."""
    torch.manual_seed(0)
    x, tangent = torch.randn(3, 8), torch.randn(3, 8)
    layer = nn.Linear(8, 6)
    layer.bias = nn.Parameter(torch.arange(12.0)[::2])  # not contiguous: oneDNN would read it packed
    with torch.no_grad():
        torch.testing.assert_close(linear(layer, x), nn.functional.linear(x, layer.weight, layer.bias))
    fresh = nn.Linear(8, 6)
    with torch.no_grad():
        _, jvp_out = torch.func.jvp(lambda v: linear(fresh, v), (x,), (tangent,))  # torch.func transform
        with torch.autograd.forward_ad.dual_level():  # forward-mode AD by hand
            dual_out = linear(fresh, torch.autograd.forward_ad.make_dual(x, tangent))
            dual_tangent = torch.autograd.forward_ad.unpack_dual(dual_out).tangent
    torch.testing.assert_close(jvp_out, tangent @ fresh.weight.t())
    torch.testing.assert_close(dual_tangent, tangent @ fresh.weight.t())
    assert onednn_calls == []
    traced = torch.jit.trace(Projection(fresh), x)  # records aten::linear (its check reruns the Python code)
    assert traced(x).shape == (3, 6) and "aten::linear" in str(traced.inlined_graph)
    onednn_calls.clear()
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        linear(fresh, x)
    assert onednn_calls == []

    class Doubled(nn.Linear):
        def forward(self, v):
            return 2 * super().forward(v)

    hooked = nn.Linear(8, 6)
    hooked.register_forward_hook(lambda module, args, out: out + 1)
    pruned = prune.l1_unstructured(nn.Linear(8, 6), "weight", amount=0.5)
    with torch.no_grad():
        pruned.weight_orig.mul_(3)  # pruning's pre-hook recomputes weight = weight_orig * mask at each call
        doubled = Doubled(8, 6)
        torch.testing.assert_close(linear(doubled, x), 2 * nn.functional.linear(x, doubled.weight, doubled.bias))
        torch.testing.assert_close(linear(hooked, x), nn.functional.linear(x, hooked.weight, hooked.bias) + 1)
        torch.testing.assert_close(linear(pruned, x), nn.functional.linear(
            x, pruned.weight_orig * pruned.weight_mask, pruned.bias))
        quantized = torch.ao.quantization.quantize_dynamic(nn.Sequential(nn.Linear(8, 6)), {nn.Linear},
                                                           dtype=torch.qint8)[0]
        assert type(quantized) is torch.ao.nn.quantized.dynamic.Linear
        assert torch.equal(linear(quantized, x), quantized(x))  # its own int8 forward
    assert onednn_calls == []
    with torch.no_grad():
        linear(fresh, x)  # and the fast path is still there for a plain layer
    assert len(onednn_calls) == (1 if _ONEDNN_LINEAR else 0)


# -------- the private oneDNN op degrades to F.linear, never breaks


@pytest.fixture
def onednn_state(monkeypatch):
    """The oneDNN path's process-wide state, given back after the test (a failing op switches it off); every
    product big enough for it (threshold 0)."""
    monkeypatch.setattr(kernels, "_ONEDNN_LINEAR", kernels._ONEDNN_LINEAR)
    monkeypatch.setattr(kernels, "_ONEDNN_LINEAR_CHECKED", False)
    monkeypatch.setattr(kernels, "MIN_ONEDNN_MACS", 0)


def model_outputs(model, inputs):
    """Logits (b, t, v) of a teacher-forced pass, and greedy and beam ids, at fp32 CPU inference."""
    input_ids, attention_mask, decoder_input_ids = inputs
    with torch.no_grad():
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    settings = {"attention_mask": attention_mask, "max_new_tokens": 8, "do_sample": False}
    return logits, model.generate(input_ids, **settings), model.generate(input_ids, num_beams=3, **settings)


def test_forced_fallback_gives_the_kernel_paths_outputs(onednn_calls, onednn_state, monkeypatch):
    """Switched off (what SCRATCH_TRANSFORMER_ONEDNN_LINEAR=0 does at import), no projection runs oneDNN's op and
    the model gives the kernel path's logits, up to float rounding (summation order), and its generate() ids."""
    from helpers import make_tiny_lm, make_tiny_lm_inputs

    if not _ONEDNN_LINEAR:
        pytest.skip("this torch build has no oneDNN linear: there is no kernel path to compare with")
    model, inputs = make_tiny_lm(), make_tiny_lm_inputs()
    kernel_logits, kernel_greedy, kernel_beam = model_outputs(model, inputs)
    assert len(onednn_calls) > 100  # every projection of every step took the kernel path
    onednn_calls.clear()
    monkeypatch.setattr(kernels, "_ONEDNN_LINEAR", False)
    logits, greedy, beam = model_outputs(model, inputs)
    assert onednn_calls == []
    torch.testing.assert_close(logits, kernel_logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(greedy, kernel_greedy) and torch.equal(beam, kernel_beam)
    assert len({tuple(row) for row in greedy.tolist()}) > 1  # ids that depend on the source: a real comparison


def test_onednn_switch_is_read_from_the_environment(monkeypatch):
    """SCRATCH_TRANSFORMER_ONEDNN_LINEAR=0 (off, false, no) switches the oneDNN path off; 1 or nothing leaves it as
    the build allows; any other value is refused, in one line naming the variable."""
    monkeypatch.delenv(kernels.ONEDNN_LINEAR_VARIABLE, raising=False)
    available = kernels._onednn_linear_available()
    for value in ("1", "on", " TRUE ", ""):
        monkeypatch.setenv(kernels.ONEDNN_LINEAR_VARIABLE, value)
        assert kernels._onednn_linear_available() == available
    for value in ("0", "off", "False", "no"):
        monkeypatch.setenv(kernels.ONEDNN_LINEAR_VARIABLE, value)
        assert kernels._onednn_linear_available() is False
    monkeypatch.setenv(kernels.ONEDNN_LINEAR_VARIABLE, "fast")
    with pytest.raises(ValueError, match=r"^SCRATCH_TRANSFORMER_ONEDNN_LINEAR must be 0 \(F.linear everywhere\) or 1 "
                                         r"\(oneDNN's linear where it is faster, the default\), got 'fast'$"):
        kernels._onednn_linear_available()


@QUIET
def test_linear_falls_back_to_f_linear_when_the_private_op_is_missing_raises_or_changes(onednn_state, monkeypatch):
    """A torch without the op, with a changed signature (it raises) or changed semantics (its first product
    disagrees with F.linear): linear() gives F.linear's product, warns once, and leaves the op alone from then on;
    the whole model then gives exactly the forced fallback's logits."""
    from helpers import make_tiny_lm, make_tiny_lm_inputs

    torch.manual_seed(0)
    layer, x = nn.Linear(32, 48), torch.randn(3, 4, 32)
    calls = []

    def raising(*args):
        calls.append(1)
        raise RuntimeError("mkldnn::_linear_pointwise() expected at most 5 argument(s) but received 6 argument(s)")

    def without_bias(x, weight, bias, *args):
        calls.append(1)
        return nn.functional.linear(x, weight)

    for op, problem in ((raising, r"raised RuntimeError: mkldnn::_linear_pointwise\(\) expected at most 5"),
                        (without_bias, "gave another product than F.linear")):
        monkeypatch.setattr(kernels, "_ONEDNN_LINEAR", True)
        monkeypatch.setattr(kernels, "_ONEDNN_LINEAR_CHECKED", False)
        monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise", op)
        calls.clear()
        message = (rf"^torch {re.escape(torch.__version__)}: oneDNN's linear op \(torch.ops.mkldnn._linear_pointwise\) "
                   rf"{problem}.*; the model's projections use F.linear from now on")
        with torch.no_grad(), pytest.warns(RuntimeWarning, match=message):
            y = linear(layer, x)
        assert torch.equal(y, nn.functional.linear(x, layer.weight, layer.bias)) and calls == [1]
        assert kernels._ONEDNN_LINEAR is False
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("error")  # no second warning
            assert torch.equal(linear(layer, x), layer(x))
        assert calls == [1]  # the op is left alone from then on

    monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace())  # a torch without the op at all
    assert kernels._onednn_linear_available() is False
    monkeypatch.setattr(kernels, "_ONEDNN_LINEAR", True)
    with torch.no_grad(), pytest.warns(RuntimeWarning, match="raised AttributeError"):
        assert torch.equal(linear(layer, x), layer(x))

    model, inputs = make_tiny_lm(), make_tiny_lm_inputs()
    monkeypatch.setattr(kernels, "_ONEDNN_LINEAR", False)
    forced, _, _ = model_outputs(model, inputs)
    monkeypatch.setattr(kernels, "_ONEDNN_LINEAR", True)
    monkeypatch.setattr(torch.ops, "mkldnn", SimpleNamespace(_linear_pointwise=raising))
    with pytest.warns(RuntimeWarning, match="raised RuntimeError"):
        logits, _, _ = model_outputs(model, inputs)
    assert torch.equal(logits, forced)


def trained_reverse_model(steps: int = 300) -> tuple[ScratchTransformerForConditionalGeneration, torch.Tensor]:
    """A tiny model trained to reverse 6 symbols (about 8 s on 2 cores), so that its predictions are confident, as a
    trained translator's are; and 64 held-out sources.

    Batches of 32 and a learning rate decayed linearly to 0 land it at 100% greedy accuracy on 1 thread and on 2
    (2026-12-02, AMD EPYC); batches of 16 at a constant rate landed between 88% and 97% depending on the thread
    count (the order of matmul reductions), too close to the test's 95% precondition."""
    torch.manual_seed(0)
    config = ScratchTransformerConfig(vocab_size=24, d_model=32, num_heads=2, encoder_layers=2, decoder_layers=2,
                                      d_ff=64, dropout=0.0, attention_dropout=0.0, max_position_embeddings=32,
                                      pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    model = ScratchTransformerForConditionalGeneration(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        src = torch.randint(4, 24, (32, 6), generator=generator)
        labels = torch.cat([src.flip(1), torch.full((32, 1), config.eos_token_id)], dim=1)
        loss = model(input_ids=src, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval(), torch.randint(4, 24, (64, 6), generator=generator)


@QUIET
def test_quantize_dynamic_converts_every_projection_and_generates_alike():
    """torch's own int8: `quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)` converts every projection, and
    generate() (greedy and beam) runs on the result with nearly the fp32 model's logits and tokens.

    Tolerances, measured on this model (seed 0, 300 steps; 1 and 2 threads, 2026-12-02, AMD EPYC): mean |logit
    difference| 0.036 of the logits' standard deviation; argmax, greedy and beam tokens equal at 100%. Dynamic int8
    rounds each weight matrix to 255 levels of its largest entry and each activation to 7-bit levels (fbgemm's
    reduce_range), about 1% per product, compounded over 4 layers and 7 products per path: asserted with about 3x
    margin (mean difference < 0.1 std) and 95% agreement, so a broken conversion (random or fp32-skipped layers)
    fails."""
    model, src = trained_reverse_model()
    quantized = torch.ao.quantization.quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    found = projections(quantized)
    assert len(found) == 2 * 6 + 2 * 10 + 1
    assert all(type(module) is torch.ao.nn.quantized.dynamic.Linear for _, module in found), found
    assert not any(type(module) is nn.Linear for module in quantized.modules())

    mask = torch.ones_like(src)
    labels = torch.cat([src.flip(1), torch.full((64, 1), 2)], dim=1)
    with torch.no_grad():
        expected = model(input_ids=src, attention_mask=mask, labels=labels).logits
        logits = quantized(input_ids=src, attention_mask=mask, labels=labels).logits
    assert (logits - expected).abs().mean() < 0.1 * expected.std()
    assert (logits.argmax(-1) == expected.argmax(-1)).float().mean() >= 0.95

    settings = {"attention_mask": mask, "do_sample": False, "max_new_tokens": 7, "min_new_tokens": 6}
    greedy = quantized.generate(input_ids=src, num_beams=1, **settings)
    fp32_greedy = model.generate(input_ids=src, num_beams=1, **settings)
    assert greedy.shape == fp32_greedy.shape == (64, 8)
    assert (greedy == fp32_greedy).float().mean() >= 0.95
    assert (fp32_greedy[:, 1:] == labels).float().mean() >= 0.95  # the fp32 model has learnt the task
    beam = quantized.generate(input_ids=src, num_beams=3, **settings)
    assert beam.shape == (64, 8)
    assert (beam == model.generate(input_ids=src, num_beams=3, **settings)).float().mean() >= 0.95


# -------- dropout in CPU training (paper 5.4)


def test_dropout_values_keeps_one_minus_p_scales_like_torch_and_masks_the_gradient():
    from scratch_transformer.kernels_scratch_transformer import dropout_values

    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        # not a multiple of 4; drawn in float32 and cast, since torch 2.11's bfloat16 randn gives exact zeros (0.6%)
        x = torch.randn(400_003).to(dtype).requires_grad_()
        assert not (x == 0).any()
        y = dropout_values(x, 0.1)
        assert y.dtype == dtype and y.shape == x.shape
        kept = y != 0
        assert kept.float().mean().item() == pytest.approx(1 - 6554 / 65536, abs=0.002)  # 1 - p on 2^-16
        scale = torch.tensor(1 / 0.9, dtype=dtype)  # torch's CPU dropout rounds the scale to x's dtype too
        assert torch.equal(y[kept], x.detach()[kept] * scale)
        grad = torch.randn_like(x)
        y.backward(grad)
        assert torch.equal(x.grad, torch.where(kept, grad * scale, torch.zeros((), dtype=dtype)))
    x = torch.randn(1000, 7)
    torch.manual_seed(3)
    a = dropout_values(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(a, dropout_values(x, 0.3))  # the default generator: seeded, repeatable
    assert not torch.equal(a, dropout_values(x, 0.3))
    assert (dropout_values(x, 0.3) == 0).float().mean().item() == pytest.approx(0.3, abs=0.02)
    assert torch.equal(dropout_values(x, 0.0), x) and torch.equal(dropout_values(x, 1.0), torch.zeros_like(x))
    with pytest.raises(ValueError, match="between 0 and 1"):
        dropout_values(x, 1.5)


def test_dropout_is_the_module_outside_cpu_training():
    from scratch_transformer.kernels_scratch_transformer import dropout

    x = torch.randn(50, 40)
    layer = nn.Dropout(0.5)
    assert dropout(layer.eval(), x) is x
    layer.train()
    torch.manual_seed(0)
    ours = dropout(layer, x)
    torch.manual_seed(0)
    assert not torch.equal(ours, layer(x))  # the fast mask, not torch's Bernoulli draws
    calls = []
    layer.register_forward_hook(lambda module, args, output: calls.append(1))
    torch.manual_seed(0)
    hooked = dropout(layer, x)
    torch.manual_seed(0)
    assert torch.equal(hooked, layer(x)) and len(calls) == 2  # a hooked module is called itself
    inplace = nn.Dropout(0.5, inplace=True).train()
    y = x.clone()
    assert dropout(inplace, y) is y


# -------- cross-entropy with label smoothing (paper 5.4)


def reference_cross_entropy(logits, labels, eps):
    return nn.functional.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum", label_smoothing=eps)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_cross_entropy_matches_torch_in_value_and_gradient_across_chunks(monkeypatch, dtype, eps):
    from scratch_transformer.kernels_scratch_transformer import cross_entropy

    monkeypatch.setattr(kernels, "CROSS_ENTROPY_CHUNK_ROWS", 7)  # 45 rows: 6 whole chunks and one of 3
    torch.manual_seed(0)
    raw = (torch.randn(45, 53) * 3).to(dtype)
    labels = torch.randint(0, 53, (45,))
    labels[[0, 8, 9, 44]] = -100
    labels[14:21] = -100  # a whole chunk without loss
    ours_in, torch_in = raw.clone().requires_grad_(), raw.clone().requires_grad_()
    ours, expected = cross_entropy(ours_in, labels, eps), reference_cross_entropy(torch_in, labels, eps)
    assert ours.dtype == torch.float32 and ours.shape == ()
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-4)
    upstream = torch.tensor(0.37)  # backward's scalar reaches every logit
    ours.backward(upstream)
    expected.backward(upstream)
    assert ours_in.grad.dtype == dtype
    tolerance = dict(rtol=0, atol=1e-6) if dtype == torch.float32 else dict(rtol=0.02, atol=2e-3)
    torch.testing.assert_close(ours_in.grad, torch_in.grad, **tolerance)
    assert torch.equal(ours_in.grad[labels == -100], torch.zeros(11, 53, dtype=dtype))
    assert torch.equal(ours_in.detach(), raw)  # the chunks are copies: the logits are left as they were
    row_sums = ours_in.grad.float().sum(dim=-1).abs()  # softmax minus a distribution sums to 0 (bf16: rounded)
    assert (row_sums < (1e-5 if dtype == torch.float32 else 1e-2)).all()


def test_cross_entropy_edge_cases():
    from scratch_transformer.kernels_scratch_transformer import cross_entropy

    torch.manual_seed(0)
    logits = torch.randn(6, 9, requires_grad=True)
    nothing = torch.full((6,), -100)
    loss = cross_entropy(logits, nothing, 0.1)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))  # not NaN
    # an inf / NaN in a row without loss leaves the loss and every gradient finite
    labels = torch.randint(0, 9, (6,))
    labels[2] = -100
    dirty = logits.detach().clone()
    dirty[2, 0], dirty[2, 1] = float("nan"), float("inf")
    dirty.requires_grad_()
    clean = logits.detach().clone().requires_grad_()
    torch.testing.assert_close(cross_entropy(dirty, labels, 0.1), cross_entropy(clean, labels, 0.1))
    cross_entropy(dirty, labels, 0.1).backward()
    assert torch.isfinite(dirty.grad).all() and torch.equal(dirty.grad[2], torch.zeros(9))
    # without grad (evaluation) the value is the same and no gradient is made
    with torch.no_grad():
        torch.testing.assert_close(cross_entropy(clean, labels, 0.1), reference_cross_entropy(clean, labels, 0.1))
    # a second-order gradient is refused, not silently wrong (the kept gradient would be a constant to autograd:
    # grad of (g ** 2).sum() + (x ** 2).sum() came out as 2 x, the cross-entropy's term dropped)
    with pytest.raises(RuntimeError, match="no second-order gradient"):
        torch.autograd.grad(cross_entropy(clean, labels, 0.1), clean, create_graph=True)
    # the first backward scales the kept gradient in place: a second one through a retained graph is refused
    retained = logits.detach().clone().requires_grad_()
    twice = cross_entropy(retained, labels, 0.1)
    twice.backward(torch.tensor(0.5), retain_graph=True)
    torch.testing.assert_close(retained.grad, 0.5 * torch.autograd.grad(reference_cross_entropy(clean, labels, 0.1),
                                                                        clean)[0])
    with pytest.raises(RuntimeError, match="second time"):
        twice.backward()
    # float32 logits are read in place, not copied: the logits stay as they were after forward and backward
    kept_logits = logits.detach().clone()
    source = kept_logits.clone().requires_grad_()
    cross_entropy(source, labels, 0.1).backward()
    assert torch.equal(source.detach(), kept_logits)
    # under a torch.func transform the kernel steps aside for torch's own op
    grad_fn = torch.func.grad(lambda x: cross_entropy(x, labels, 0.1))
    torch.testing.assert_close(grad_fn(clean.detach()),
                               torch.autograd.grad(reference_cross_entropy(clean, labels, 0.1), clean)[0])
    assert not kernels._chunked_cross_entropy_applies(torch.randn(0, 9))
    # backward's scalar (1 / tokens under Trainer) scales the bf16 gradient without being rounded to bf16 itself
    half = logits.detach().to(torch.bfloat16).requires_grad_()
    unit = torch.autograd.grad(cross_entropy(half, labels, 0.1), half)[0]
    scaled = torch.autograd.grad(cross_entropy(half, labels, 0.1) / 1408, half)[0]
    assert torch.equal(scaled, (unit.float() / 1408).to(torch.bfloat16))


@pytest.mark.parametrize("requires_grad", [False, True])
def test_cross_entropy_refuses_bad_input_by_name(requires_grad):
    """Called directly (not through the model), bad labels are refused: -1 would read as id 0 in the chunked path."""
    from scratch_transformer.kernels_scratch_transformer import cross_entropy

    logits = torch.randn(5, 7, requires_grad=requires_grad)
    for labels, match in [
        (torch.tensor([0, 1, -1, 2, -100]), r"labels must be in \[0, vocab_size=7\) or -100 .*got range \[-1, 2\]"),
        (torch.tensor([0, 1, 7, 2, -100]), r"got range \[0, 7\]"),
        (torch.tensor([0, 1, 2]), r"labels must be \(5,\), one per logits row, got shape \(3,\)"),
        (torch.zeros(5, 1, dtype=torch.long), r"got shape \(5, 1\)"),
        (torch.zeros(5), "labels must be integer ids, got dtype torch.float32"),
    ]:
        with pytest.raises(ValueError, match=match):
            cross_entropy(logits, labels, 0.1)
    with pytest.raises(ValueError, match=r"logits must be floating-point \(rows, vocab_size\), got shape \(1, 5, 7\)"):
        cross_entropy(logits[None], torch.zeros(5, dtype=torch.long))
    with pytest.raises(ValueError, match=r"logits must be floating-point .*of torch.int64"):
        cross_entropy(torch.randint(0, 5, (5, 7)), torch.zeros(5, dtype=torch.long))
    for eps in (-0.1, 1.0, float("nan"), True, "0.1", None):
        with pytest.raises(ValueError, match="label_smoothing must be a number in"):
            cross_entropy(logits, torch.zeros(5, dtype=torch.long), eps)
    # unsigned ids of any width are read as int64; a vocabulary of 0 with no labelled row is a loss of 0
    for dtype in (torch.uint8, torch.uint16):
        torch.testing.assert_close(cross_entropy(logits, torch.tensor([0, 6, 2, 3, 1], dtype=dtype), 0.1),
                                   reference_cross_entropy(logits, torch.tensor([0, 6, 2, 3, 1]), 0.1))
    assert cross_entropy(torch.randn(5, 0), torch.full((5,), -100)).item() == 0.0
    # under vmap, over the labels too (a mask cannot be batched: the ids are left to torch's op there)
    batched = torch.func.vmap(lambda x, y: cross_entropy(x, y, 0.1))(logits.detach()[None].expand(3, 5, 7),
                                                                      torch.tensor([0, 6, -100, 3, 1]).expand(3, 5))
    torch.testing.assert_close(batched, reference_cross_entropy(logits.detach(), torch.tensor([0, 6, -100, 3, 1]),
                                                                0.1).expand(3))
    # int32 ids and rows that are all -100 are accepted, with the int64 result
    ids = torch.tensor([0, 6, -100, 3, 1], dtype=torch.int32)
    torch.testing.assert_close(cross_entropy(logits, ids, 0.1), reference_cross_entropy(logits, ids.long(), 0.1))
    assert cross_entropy(logits, torch.full((5,), -100), 0.1).item() == 0.0
