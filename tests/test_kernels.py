"""Kernels of kernels_scratch_transformer.py, each against the torch op it replaces (ScratchTransformerLinear
against nn.Linear / F.linear): same values, same autograd, and the plain op wherever the fast path must not run."""

import pytest
import torch
from torch import nn

from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer.kernels_scratch_transformer import _ONEDNN_LINEAR, ScratchTransformerLinear

TINY = ScratchTransformerConfig(vocab_size=40, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64,
                                dropout=0.0, max_position_embeddings=64)


def test_linear_inference_kernel_matches_nn_linear_and_respects_autograd_and_autocast():
    """ScratchTransformerLinear: oneDNN's kernel at fp32 CPU inference, F.linear otherwise."""
    torch.manual_seed(0)
    layer, head = ScratchTransformerLinear(32, 48), ScratchTransformerLinear(32, 80, bias=False)
    assert isinstance(layer, nn.Linear)  # HF init, tying and resizing see an nn.Linear
    for x in (torch.randn(5, 32), torch.randn(3, 4, 32), torch.randn(3, 4, 64)[..., ::2]):
        for module in (layer, head):
            with torch.no_grad():
                fast = module(x)
            expected = nn.functional.linear(x, module.weight, module.bias)
            assert fast.shape == expected.shape
            torch.testing.assert_close(fast, expected, atol=1e-5, rtol=1e-5)
    # with autograd on it is exactly F.linear, and differentiable
    x = torch.randn(3, 4, 32, requires_grad=True)
    y = layer(x)
    assert y.grad_fn is not None and torch.equal(y, nn.functional.linear(x, layer.weight, layer.bias))
    # bf16 autocast still casts the product (the oneDNN path must not bypass it)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(torch.randn(3, 32)).dtype == torch.bfloat16
    if _ONEDNN_LINEAR:  # the fast path is the one taken at inference, for products big enough to gain
        layer.min_onednn_macs = 3 * 32 * 48
        with torch.no_grad():
            assert layer(torch.randn(3, 32)).grad_fn is None
            calls = []
            original = torch.ops.mkldnn._linear_pointwise
            try:
                torch.ops.mkldnn._linear_pointwise = lambda *a: calls.append(1) or original(*a)
                layer(torch.randn(3, 32))
                layer(torch.randn(2, 32))  # 2 x 32 x 48 multiply-adds: below the threshold, F.linear
            finally:
                torch.ops.mkldnn._linear_pointwise = original
            assert calls == [1]
    torch.manual_seed(0)
    model = ScratchTransformerForConditionalGeneration(TINY).eval()
    assert isinstance(model.lm_head, ScratchTransformerLinear)
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight  # still tied (paper 3.4)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")  # torch.jit / mkldnn.flags notices
def test_linear_inference_kernel_leaves_other_uses_to_f_linear():
    """Cases found by review: a strided bias, forward-mode AD and tracing under no_grad, oneDNN switched off."""
    torch.manual_seed(0)
    layer = ScratchTransformerLinear(8, 6)
    layer.min_onednn_macs = 0
    x, tangent = torch.randn(3, 8), torch.randn(3, 8)
    layer.bias = nn.Parameter(torch.arange(12.0)[::2])  # not contiguous: oneDNN would read it packed
    with torch.no_grad():
        torch.testing.assert_close(layer(x), nn.functional.linear(x, layer.weight, layer.bias))
    fresh = ScratchTransformerLinear(8, 6)
    fresh.min_onednn_macs = 0  # would take oneDNN at plain inference
    with torch.no_grad():
        _, jvp_out = torch.func.jvp(fresh, (x,), (tangent,))  # torch.func transform
        with torch.autograd.forward_ad.dual_level():  # forward-mode AD by hand
            dual_out = fresh(torch.autograd.forward_ad.make_dual(x, tangent))
            dual_tangent = torch.autograd.forward_ad.unpack_dual(dual_out).tangent
    torch.testing.assert_close(jvp_out, tangent @ fresh.weight.t())
    torch.testing.assert_close(dual_tangent, tangent @ fresh.weight.t())
    traceable = ScratchTransformerLinear(8, 6)
    traceable.min_onednn_macs = 0
    traced = torch.jit.trace(traceable, x)  # the trace check reruns under no_grad
    assert traced(x).shape == (3, 6)
    if _ONEDNN_LINEAR:
        calls = []
        original = torch.ops.mkldnn._linear_pointwise
        try:
            torch.ops.mkldnn._linear_pointwise = lambda *a: calls.append(1) or original(*a)
            plain = ScratchTransformerLinear(8, 6)
            plain.min_onednn_macs = 0
            with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
                plain(x)
            assert calls == []
            with torch.no_grad():
                plain(x)
            assert calls == [1]
        finally:
            torch.ops.mkldnn._linear_pointwise = original
