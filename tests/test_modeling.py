"""Model tests, in transformers' ModelTester style: a tiny config, an input factory, value checks."""

import math
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

from scratch_transformer import (
    ScratchTransformerConfig,
    ScratchTransformerForConditionalGeneration,
    ScratchTransformerModel,
)
from scratch_transformer.modeling_scratch_transformer import (
    CACHE_FIELD,
    ScratchTransformerDecoderLayer,
    ScratchTransformerEncoderLayer,
    eager_attention_forward,
    sinusoidal_position_encoding,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS


def causal_mask(length: int) -> torch.Tensor:
    """Additive (1, 1, n, n): 0 on and below the diagonal, float32's minimum above it."""
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    return torch.zeros(length, length).masked_fill(future, torch.finfo(torch.float32).min)[None, None]


class _Attention(nn.Module):
    """Stands in for the calling attention module of the attention interface."""

    def __init__(self, is_causal: bool = False):
        super().__init__()
        self.is_causal = is_causal


def eager_attention(q, k, v, mask=None, is_causal=False):
    """Ours, with (b, h, t, k) output like the tests below read it."""
    out, weights = eager_attention_forward(_Attention(is_causal), q, k, v, mask)
    return out.transpose(1, 2), weights


def sdpa_attention(q, k, v, mask=None, is_causal=False):
    """transformers' sdpa from its attention interface, (b, h, t, k) output."""
    out, weights = ALL_ATTENTION_FUNCTIONS["sdpa"](_Attention(is_causal), q, k, v, mask)
    return out.transpose(1, 2), weights


class ModelTester:
    """A tiny config and input factory shared by the tests."""

    vocab_size = 40
    batch_size = 3
    src_len = 9
    tgt_len = 7

    def config(self, **overrides) -> ScratchTransformerConfig:
        values = dict(
            vocab_size=self.vocab_size, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64,
            dropout=0.0, max_position_embeddings=64,
        )
        values.update(overrides)
        return ScratchTransformerConfig(**values)

    def model(self, **overrides) -> ScratchTransformerForConditionalGeneration:
        torch.manual_seed(0)
        return ScratchTransformerForConditionalGeneration(self.config(**overrides)).eval()

    def inputs(self, seed: int = 0):
        """Source ids (b, s) with unequal lengths (right padding), mask, labels (b, t)."""
        g = torch.Generator().manual_seed(seed)
        input_ids = torch.randint(4, self.vocab_size, (self.batch_size, self.src_len), generator=g)
        attention_mask = torch.ones_like(input_ids)
        for row, length in enumerate([self.src_len, self.src_len - 3, 4][: self.batch_size]):
            input_ids[row, length:] = 0
            attention_mask[row, length:] = 0
        labels = torch.randint(4, self.vocab_size, (self.batch_size, self.tgt_len), generator=g)
        return input_ids, attention_mask, labels


tester = ModelTester()


# ---------------------------------------------------------------- building blocks


def test_attention_matches_formula_and_sdpa():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 6, 8), torch.randn(2, 4, 6, 8)
    mask = torch.zeros(2, 1, 1, 6)
    mask[1, ..., 4:] = torch.finfo(torch.float32).min
    out, weights = eager_attention(q, k, v, mask)
    # independent computation: per batch/head, softmax over allowed keys only
    expected = torch.empty_like(out)
    for b in range(2):
        allowed = 6 if b == 0 else 4
        scores = q[b] @ k[b, :, :allowed].transpose(-1, -2) / math.sqrt(8)
        expected[b] = torch.softmax(scores, -1) @ v[b, :, :allowed]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 5))
    assert weights[1, ..., 4:].abs().max() == 0
    sdpa_out, _ = sdpa_attention(q, k, v, mask)
    torch.testing.assert_close(sdpa_out, out, atol=1e-5, rtol=1e-5)


def test_eager_and_sdpa_models_agree():
    input_ids, attention_mask, labels = tester.inputs()
    model = tester.model()
    assert model.config._attn_implementation == "sdpa"  # HF's default when _supports_sdpa
    sdpa_logits = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    model.set_attn_implementation("eager")
    assert model.config._attn_implementation == "eager"
    eager_logits = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    torch.testing.assert_close(sdpa_logits, eager_logits, atol=1e-5, rtol=1e-5)


def test_positional_encoding_matches_paper_formula():
    d_model = 16
    table = sinusoidal_position_encoding(50, d_model)
    for pos in (0, 1, 7, 49):
        for i in (0, 3, 7):
            angle = pos / 10000 ** (2 * i / d_model)
            assert table[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-5)
            assert table[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-5)


def _copy_attention(ours, theirs: nn.MultiheadAttention):
    q, k, v = theirs.in_proj_weight.chunk(3)
    qb, kb, vb = theirs.in_proj_bias.chunk(3)
    with torch.no_grad():
        for proj, w, b in ((ours.q_proj, q, qb), (ours.k_proj, k, kb), (ours.v_proj, v, vb)):
            proj.weight.copy_(w)
            proj.bias.copy_(b)
        ours.out_proj.weight.copy_(theirs.out_proj.weight)
        ours.out_proj.bias.copy_(theirs.out_proj.bias)


def _copy_common(ours, theirs):
    with torch.no_grad():
        ours.ffn.fc1.load_state_dict(theirs.linear1.state_dict())
        ours.ffn.fc2.load_state_dict(theirs.linear2.state_dict())
        ours.self_attn_layer_norm.load_state_dict(theirs.norm1.state_dict())
    _copy_attention(ours.self_attn, theirs.self_attn)


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_encoder_layer_matches_torch_reference(pre_layer_norm):
    config = tester.config(pre_layer_norm=pre_layer_norm)
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=pre_layer_norm).eval()
    ours = ScratchTransformerEncoderLayer(config).eval()
    _copy_common(ours, theirs)
    ours.final_layer_norm.load_state_dict(theirs.norm2.state_dict())
    x = torch.randn(2, 6, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    additive = torch.zeros(2, 1, 1, 6).masked_fill(pad[:, None, None, :], torch.finfo(torch.float32).min)
    expected = theirs(x, src_key_padding_mask=pad)
    got, _ = ours(x, additive)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_decoder_layer_matches_torch_reference(pre_layer_norm):
    config = tester.config(pre_layer_norm=pre_layer_norm)
    torch.manual_seed(0)
    theirs = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=pre_layer_norm).eval()
    ours = ScratchTransformerDecoderLayer(config, layer_idx=0).eval()
    _copy_common(ours, theirs)
    _copy_attention(ours.encoder_attn, theirs.multihead_attn)
    ours.encoder_attn_layer_norm.load_state_dict(theirs.norm2.state_dict())
    ours.final_layer_norm.load_state_dict(theirs.norm3.state_dict())
    tgt, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    expected = theirs(tgt, memory, tgt_mask=nn.Transformer.generate_square_subsequent_mask(5), tgt_is_causal=True)
    got, _, _ = ours(tgt, memory, causal_mask(5), None)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- masks


def test_causality_future_tokens_do_not_change_earlier_logits():
    input_ids, attention_mask, labels = tester.inputs()
    model = tester.model()
    changed = labels.clone()
    changed[:, 4:] = (changed[:, 4:] + 7) % tester.vocab_size
    a = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=labels).logits
    b = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=changed).logits
    torch.testing.assert_close(a[:, :4], b[:, :4], atol=1e-6, rtol=1e-6)
    assert (a[:, 4:] - b[:, 4:]).abs().max() > 1e-3


def test_source_padding_does_not_change_outputs():
    model = tester.model()
    src = torch.randint(4, tester.vocab_size, (1, 5))
    tgt = torch.randint(4, tester.vocab_size, (1, 4))
    plain = model(input_ids=src, decoder_input_ids=tgt).logits
    padded_src = torch.cat([src, torch.zeros(1, 4, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1] * 5 + [0] * 4])
    padded = model(input_ids=padded_src, attention_mask=mask, decoder_input_ids=tgt).logits
    torch.testing.assert_close(plain, padded, atol=1e-5, rtol=1e-5)


def test_fully_padded_row_gives_finite_outputs_and_grads():
    model = tester.model()
    model.train()
    input_ids, attention_mask, labels = tester.inputs()
    attention_mask[2] = 0  # a row that is nothing but padding
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.logits).all() and torch.isfinite(out.loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------- decoding


def test_cached_incremental_decoding_equals_full_forward():
    model = tester.model()
    input_ids, attention_mask, labels = tester.inputs()
    full = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=labels, use_cache=False).logits
    encoder_outputs = model.get_encoder()(input_ids, attention_mask)
    cache, steps = None, []
    for t in range(labels.size(1)):
        out = model(
            encoder_outputs=encoder_outputs, attention_mask=attention_mask, decoder_input_ids=labels[:, t : t + 1],
            cache=cache, use_cache=True,
        )
        cache = getattr(out, CACHE_FIELD)  # `cache` from transformers 5.24, `past_key_values` before
        steps.append(out.logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == labels.size(1)


def _manual_greedy(model, input_ids, attention_mask, steps):
    """Greedy decoding without any cache: re-run the decoder on the whole prefix each step."""
    config = model.config
    decoded = torch.full((input_ids.size(0), 1), config.decoder_start_token_id)
    finished = torch.zeros(input_ids.size(0), dtype=torch.bool)
    for _ in range(steps):
        logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoded,
                       use_cache=False).logits
        next_token = logits[:, -1].argmax(-1)
        next_token = torch.where(finished, torch.full_like(next_token, config.pad_token_id), next_token)
        decoded = torch.cat([decoded, next_token[:, None]], dim=1)
        finished |= next_token == config.eos_token_id
        if finished.all():
            break
    return decoded


@pytest.mark.parametrize("use_cache", [True, False])
def test_generate_greedy_equals_manual_loop(use_cache):
    model = tester.model()
    input_ids, attention_mask, _ = tester.inputs()
    manual = _manual_greedy(model, input_ids, attention_mask, steps=8)
    generated = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8,
                               do_sample=False, num_beams=1, use_cache=use_cache)
    assert torch.equal(generated, manual)


def test_beam_search_with_and_without_cache_agree():
    model = tester.model()
    input_ids, attention_mask, _ = tester.inputs()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=8, num_beams=4,
                  num_return_sequences=2)
    with_cache = model.generate(**kwargs, use_cache=True)
    without_cache = model.generate(**kwargs, use_cache=False)
    assert with_cache.shape[0] == 2 * tester.batch_size
    assert torch.equal(with_cache, without_cache)


def test_batched_generation_of_unequal_lengths_equals_one_by_one():
    model = tester.model()
    input_ids, attention_mask, _ = tester.inputs()
    for beams in (1, 3):
        batched = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=6,
                                 num_beams=beams, min_new_tokens=6)
        for row in range(input_ids.size(0)):
            length = int(attention_mask[row].sum())
            single = model.generate(input_ids=input_ids[row : row + 1, :length], max_new_tokens=6,
                                    num_beams=beams, min_new_tokens=6)
            assert torch.equal(batched[row], single[0]), (beams, row)


def test_sampling_is_seeded_and_output_attentions_returns_weights():
    model = tester.model()
    input_ids, attention_mask, _ = tester.inputs()
    torch.manual_seed(1)
    a = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True, top_k=10,
                       max_new_tokens=6)
    torch.manual_seed(1)
    b = model.generate(input_ids=input_ids, attention_mask=attention_mask, do_sample=True, top_k=10,
                       max_new_tokens=6)
    assert torch.equal(a, b)
    out = model.generate(input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=3,
                         output_attentions=True, return_dict_in_generate=True)
    assert len(out.encoder_attentions) == 2
    assert out.encoder_attentions[0].shape == (3, 4, tester.src_len, tester.src_len)
    cross = out.cross_attentions[0][0]  # step 0, layer 0: (b, h, 1, s)
    assert cross.shape == (3, 4, 1, tester.src_len)
    torch.testing.assert_close(cross.sum(-1), torch.ones(3, 4, 1))
    assert cross[2, ..., 4:].abs().max() == 0  # padding gets no attention


# ---------------------------------------------------------------- HF contract


def test_config_hf_names_and_bad_values():
    config = tester.config()
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers, config.intermediate_size) == (
        32, 4, 2, 64)
    default = ScratchTransformerConfig()
    assert (default.d_model, default.num_heads, default.encoder_layers, default.decoder_layers, default.d_ff,
            default.dropout, default.pre_layer_norm, default.activation_function) == (512, 8, 6, 6, 2048, 0.1, False,
                                                                                      "relu")
    bad = {
        "d_model": dict(d_model=30, num_heads=4),
        "num_heads": dict(num_heads=0),
        "activation_function": dict(activation_function="swish"),
        "dropout": dict(dropout=1.0),
        "attention_dropout": dict(attention_dropout=-0.1),
        "d_ff": dict(d_ff=-5),
        "vocab_size": dict(vocab_size=0),
        "encoder_layers": dict(encoder_layers=0),
    }
    for field, values in bad.items():
        with pytest.raises(ValueError, match=field):
            tester.config(**values)


def test_out_of_range_token_ids_raise():
    model = tester.model()
    with pytest.raises(ValueError, match="vocab_size"):
        model(input_ids=torch.tensor([[5, 99]]), decoder_input_ids=torch.tensor([[1]]))


def test_labels_are_shifted_right_and_loss_ignores_minus_100():
    model = tester.model()
    input_ids, attention_mask, labels = tester.inputs()
    labels[0, -2:] = -100
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    assert decoder_input_ids[0, 0] == model.config.decoder_start_token_id
    assert torch.equal(decoder_input_ids[1, 1:], labels[1, :-1])
    assert decoder_input_ids[0, -1] == model.config.pad_token_id
    logits = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    keep = labels != -100
    expected = nn.functional.cross_entropy(logits[keep], labels[keep])
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("shared", [False, True])
def test_save_load_round_trip_keeps_ties(tmp_path, shared):
    from transformers import AutoModel, AutoModelForSeq2SeqLM

    model = tester.model(share_encoder_decoder_embeddings=shared)
    input_ids, attention_mask, labels = tester.inputs()
    model.save_pretrained(tmp_path)
    files = set(os.listdir(tmp_path))
    assert {"config.json", "model.safetensors", "generation_config.json", "configuration_scratch_transformer.py",
            "modeling_scratch_transformer.py", "kernels_scratch_transformer.py"} <= files
    assert set(model.config.auto_map) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    loaded, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert isinstance(loaded, ScratchTransformerForConditionalGeneration)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert loaded.lm_head.weight.data_ptr() == loaded.model.decoder.embed_tokens.weight.data_ptr()
    if shared:
        assert loaded.model.encoder.embed_tokens.weight.data_ptr() == loaded.lm_head.weight.data_ptr()
    torch.testing.assert_close(loaded.model.decoder.embed.embed_positions.table,
                               model.model.decoder.embed.embed_positions.table)
    expected = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    torch.testing.assert_close(loaded.eval()(input_ids=input_ids, attention_mask=attention_mask,
                                             labels=labels).logits, expected)
    base = AutoModel.from_pretrained(tmp_path)
    assert isinstance(base, ScratchTransformerModel)


def test_remote_code_load_without_the_package(tmp_path):
    model = tester.model()
    input_ids, attention_mask, labels = tester.inputs()
    model.save_pretrained(tmp_path / "ckpt")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread on both sides: bit-identical matmul reductions
    try:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    finally:
        torch.set_num_threads(threads)
    torch.save({"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels, "logits": logits},
               tmp_path / "io.pt")
    script = textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "scratch_transformer":
                    raise ImportError("blocked: " + name)
        sys.meta_path.insert(0, Block())
        sys.path = [p for p in sys.path if p not in ("", {os.getcwd()!r})]
        try:
            import scratch_transformer
            raise SystemExit("package importable")
        except ImportError:
            pass
        import torch
        torch.set_num_threads(1)
        from transformers import AutoModelForSeq2SeqLM, AutoModel
        io = torch.load({str(tmp_path / "io.pt")!r})
        model = AutoModelForSeq2SeqLM.from_pretrained({str(tmp_path / "ckpt")!r}, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        logits = model(input_ids=io["input_ids"], attention_mask=io["attention_mask"], labels=io["labels"]).logits
        assert torch.equal(logits, io["logits"]), (logits - io["logits"]).abs().max()
        base = AutoModel.from_pretrained({str(tmp_path / "ckpt")!r}, trust_remote_code=True)
        print("REMOTE_OK", type(model).__name__, type(base).__name__)
    """)
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "PYTHONPATH": ""}
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=300)
    assert "REMOTE_OK ScratchTransformerForConditionalGeneration ScratchTransformerModel" in result.stdout, (
        result.stdout + result.stderr)


# ---------------------------------------------------------------- training


def test_gradient_accumulation_matches_full_batch_in_trainer(tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    g = torch.Generator().manual_seed(3)
    rows = []
    for i in range(8):  # unequal source and target lengths, so token counts differ per micro-batch
        src_len, tgt_len = 3 + i % 5, 2 + (i * i) % 7
        rows.append({"input_ids": torch.randint(4, 40, (src_len,), generator=g).tolist(),
                     "labels": torch.randint(4, 40, (tgt_len,), generator=g).tolist()})
    dataset = Dataset.from_list(rows)

    class GradCapture(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
            self.grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}

    def run(batch, accumulation):
        model = tester.model()
        capture = GradCapture()
        args = TrainingArguments(output_dir=str(tmp_path / f"b{batch}"), per_device_train_batch_size=batch,
                                 gradient_accumulation_steps=accumulation, max_steps=1, learning_rate=1e-3,
                                 report_to=[], logging_steps=1, save_strategy="no", use_cpu=True, seed=0,
                                 train_sampling_strategy="sequential", dataloader_drop_last=False)
        collator = _PadCollator(model)
        trainer = Trainer(model=model, args=args, train_dataset=dataset, data_collator=collator,
                          callbacks=[capture])
        result = trainer.train()
        return result.training_loss, capture.grads

    loss_full, grads_full = run(8, 1)
    loss_accum, grads_accum = run(2, 4)
    assert loss_full == pytest.approx(loss_accum, rel=1e-5)
    assert grads_full.keys() == grads_accum.keys() and len(grads_full) > 10
    for name in grads_full:
        torch.testing.assert_close(grads_full[name], grads_accum[name], atol=1e-6, rtol=1e-4)


class _PadCollator:
    """Right-pads input_ids (pad 0) and labels (-100), and builds decoder_input_ids from labels."""

    def __init__(self, model):
        self.model = model

    def __call__(self, features):
        def pad(key, value):
            width = max(len(f[key]) for f in features)
            return torch.tensor([f[key] + [value] * (width - len(f[key])) for f in features])

        input_ids, labels = pad("input_ids", 0), pad("labels", -100)
        return {"input_ids": input_ids, "attention_mask": (input_ids != 0).long(), "labels": labels,
                "decoder_input_ids": self.model.prepare_decoder_input_ids_from_labels(labels)}


def test_bf16_autocast_forward_backward_with_padding():
    model = tester.model(dropout=0.1)
    model.train()
    input_ids, attention_mask, labels = tester.inputs()
    labels[1, 3:] = -100
    attention_mask[2] = 0
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    assert out.logits.dtype == torch.bfloat16
    out.loss.backward()
    assert torch.isfinite(out.loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads)


def _residual_dropout():
    """The model's residual dropout (paper 5.4): torch's nn.Dropout, in training mode."""
    dropout = tester.model(dropout=0.1).model.encoder.layers[0].dropout
    assert type(dropout) is nn.Dropout and dropout.p == 0.1
    return dropout.train()


def test_dropout_keeps_one_minus_p_and_scales():
    dropout = _residual_dropout()
    torch.manual_seed(0)
    x = torch.ones(400_000, requires_grad=True)
    y = dropout(x)
    kept = y > 0
    assert kept.float().mean().item() == pytest.approx(0.9, abs=0.003)
    torch.testing.assert_close(y[kept], torch.full_like(y[kept], 1 / 0.9))
    y.sum().backward()
    assert torch.equal(x.grad > 0, kept)
    assert dropout.eval()(x) is x
    dropout.train()
    torch.manual_seed(1)
    a = dropout(x.detach())
    torch.manual_seed(1)
    assert torch.equal(a, dropout(x.detach()))  # seeded


def test_dropout_scales_kept_values_exactly_as_x_over_one_minus_p():
    """Kept values are x * (1 / (1 - p)) rounded once, in the forward and the backward (fp32; torch's CPU
    dropout rounds the scale into a mask of x's dtype, so in bf16 it scales by 1.109375, not 1.1111)."""
    dropout = _residual_dropout()
    torch.manual_seed(0)
    x = torch.randn(64, 24, 256).requires_grad_()
    grad = torch.randn(64, 24, 256)
    y = dropout(x)
    y.backward(grad)
    kept = y != 0
    expected = torch.where(kept, x.detach() * (1 / 0.9), 0.0)
    assert torch.equal(y.detach(), expected)
    assert torch.equal(x.grad, torch.where(kept, grad * (1 / 0.9), 0.0))


def test_is_causal_path_equals_explicit_mask():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
    explicit, _ = eager_attention(q, k, v, causal_mask(5))
    implicit, _ = eager_attention(q, k, v, is_causal=True)
    fused, _ = sdpa_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(implicit, explicit)
    torch.testing.assert_close(fused, explicit, atol=1e-5, rtol=1e-5)


def test_cross_entropy_loss_matches_torch_in_value_and_gradient():
    from scratch_transformer.modeling_scratch_transformer import cross_entropy_loss

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64)
    labels = torch.randint(0, 11, (3, 5))
    labels[0, 3:] = -100
    labels[2, 0] = -100
    for num_items in (None, 17, torch.tensor(17)):
        mine = logits.clone().requires_grad_()
        reference = logits.clone().requires_grad_()
        loss = cross_entropy_loss(mine, labels, num_items)
        if num_items is None:
            expected = nn.functional.cross_entropy(reference.reshape(-1, 11), labels.reshape(-1))
        else:
            expected = nn.functional.cross_entropy(reference.reshape(-1, 11), labels.reshape(-1), reduction="sum") / 17
        (loss * 3).backward()
        (expected * 3).backward()
        torch.testing.assert_close(loss, expected)
        torch.testing.assert_close(mine.grad, reference.grad)
        assert mine.grad[0, 3:].abs().max() == 0  # rows labelled -100 get no gradient
    # bf16 logits: loss in float32, gradient back in bf16
    half = logits.to(torch.bfloat16).requires_grad_()
    loss = cross_entropy_loss(half, labels)
    loss.backward()
    assert loss.dtype == torch.float32 and half.grad.dtype == torch.bfloat16


def test_cross_entropy_loss_with_label_smoothing_is_hf_label_smoother():
    """The fused label-smoothed loss (paper 5.4) equals HF's LabelSmoother on the same logits, in value and
    gradient, with -100 labels and with Trainer's num_items_in_batch; eps outside [0, 1) is refused."""
    from transformers.trainer_pt_utils import LabelSmoother

    from scratch_transformer.modeling_scratch_transformer import cross_entropy_loss

    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11, dtype=torch.float64) * 3
    labels = torch.randint(0, 11, (3, 5))
    labels[0, 3:] = -100
    labels[2, 0] = -100
    for eps in (0.1, 0.3):
        for num_items in (None, 17):
            mine = logits.clone().requires_grad_()
            reference = logits.clone().requires_grad_()
            loss = cross_entropy_loss(mine, labels, num_items, label_smoothing=eps)
            expected = LabelSmoother(epsilon=eps)({"logits": reference}, labels, num_items_in_batch=num_items)
            loss.backward()
            expected.backward()
            torch.testing.assert_close(loss, expected)
            torch.testing.assert_close(mine.grad, reference.grad)
            plain = cross_entropy_loss(logits, labels, num_items)
            assert abs(loss.item() - plain.item()) > 0.01  # smoothing changed the value: the argument is used
    for bad in (-0.1, 1.0):
        with pytest.raises(ValueError, match="label_smoothing must be a number in"):
            cross_entropy_loss(logits, labels, label_smoothing=bad)


def test_cross_entropy_loss_edge_cases_raise_or_stay_finite():
    from scratch_transformer.modeling_scratch_transformer import cross_entropy_loss

    logits = torch.randn(2, 3, 7, requires_grad=True)
    nothing = torch.full((2, 3), -100)
    loss = cross_entropy_loss(logits, nothing)  # F.cross_entropy gives NaN here
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))
    for bad in (7, -1):
        labels = torch.zeros(2, 3, dtype=torch.long)
        labels[1, 2] = bad
        with pytest.raises(ValueError, match="labels must be in"):
            cross_entropy_loss(logits, labels)


def test_cross_entropy_loss_review_cases():
    from scratch_transformer.modeling_scratch_transformer import cross_entropy_loss

    torch.manual_seed(0)
    # labels of another shape than the logits' leading dims (old code raised too)
    with pytest.raises(ValueError, match="labels must have shape"):
        cross_entropy_loss(torch.randn(2, 4, 5), torch.zeros(2, 3, dtype=torch.long))
    # Trainer passes num_items_in_batch = 0 when no micro-batch has a label: 0 loss, zero gradients
    logits = torch.randn(2, 3, 5, requires_grad=True)
    loss = cross_entropy_loss(logits, torch.full((2, 3), -100), torch.tensor(0))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logits.grad, torch.zeros_like(logits))
    # an inf/NaN logit in an unlabelled row changes neither the loss nor the other rows' gradients
    # (F.cross_entropy's own backward gives that row itself a NaN gradient)
    raw = torch.randn(2, 3, 5)
    labels = torch.randint(0, 5, (2, 3))
    labels[1, 2] = -100
    clean = raw.clone().requires_grad_()
    dirty_values = raw.clone()
    dirty_values[1, 2, 0] = float("nan")
    dirty = dirty_values.requires_grad_()
    clean_loss, dirty_loss = cross_entropy_loss(clean, labels), cross_entropy_loss(dirty, labels)
    clean_loss.backward()
    dirty_loss.backward()
    torch.testing.assert_close(dirty_loss, clean_loss)
    torch.testing.assert_close(dirty.grad[labels != -100], clean.grad[labels != -100])


# ---------------------------------------------------------------- backward compatibility


@pytest.mark.parametrize("variant", ["post_ln_separate", "post_ln_shared", "pre_ln_separate", "pre_ln_shared"])
def test_checkpoint_saved_by_older_code_loads_with_identical_logits(variant):
    """tests/fixtures/compat_checkpoints was written at commit d1a4988 (before the modeling file's
    reorganisation) by tests/fixtures/make_compat_checkpoints.py on an AMD EPYC: the same weights, state-dict
    names and ops must give the same logits (one thread, as when they were recorded). Bit-identical on the CPU
    kind that recorded them; another CPU's kernels round differently (on an Intel Xeon family 6 model 167 with
    AMX, SDPA's logits differ by up to 5.4e-7), so the bound is 1e-5, far below any changed op or weight."""
    from fixtures.make_compat_checkpoints import OUT, logits_of
    from safetensors.torch import load_file

    expected = load_file(OUT / "expected_logits.safetensors")
    batch = {key.removeprefix("input."): value for key, value in expected.items() if key.startswith("input.")}
    model, info = ScratchTransformerForConditionalGeneration.from_pretrained(OUT / variant, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        got = logits_of(model.eval(), batch)
    finally:
        torch.set_num_threads(threads)
    for path, logits in got.items():
        recorded = expected[f"{variant}.{path}"]
        torch.testing.assert_close(logits, recorded, rtol=0, atol=1e-5, msg=lambda m: f"{path}: {m}")


def test_init_std_none_is_the_papers_init_and_a_float_is_normal_everywhere():
    """None: Xavier-uniform linears (bounded by sqrt(6 / (fan_in + fan_out))) and N(0, d^-1/2) embeddings
    (paper 3.4); a float s: N(0, s) for every linear and embedding weight, biases zero, LayerNorms 1/0."""
    torch.manual_seed(0)
    d_model, d_ff = 128, 512
    tester = ModelTester()
    paper = ScratchTransformerForConditionalGeneration(tester.config(d_model=d_model, d_ff=d_ff, vocab_size=2000))
    fc1 = paper.model.encoder.layers[0].ffn.fc1.weight
    bound = math.sqrt(6 / (d_model + d_ff))
    assert fc1.abs().max().item() <= bound and fc1.abs().max().item() > 0.98 * bound
    assert fc1.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    assert paper.get_input_embeddings().weight.std().item() == pytest.approx(d_model**-0.5, rel=0.02)

    normal = ScratchTransformerForConditionalGeneration(
        tester.config(d_model=d_model, d_ff=d_ff, vocab_size=2000, init_std=0.02))
    for name, param in normal.named_parameters():
        if name.endswith(".weight") and param.dim() == 2:
            assert param.std().item() == pytest.approx(0.02, rel=0.05), name
            assert param.abs().max().item() > 3 * 0.02, name  # a normal's tail, not a uniform's bound
        elif name.endswith(".bias"):
            assert torch.count_nonzero(param).item() == 0, name
    norm = normal.model.encoder.layers[0].self_attn_layer_norm
    assert torch.equal(norm.weight, torch.ones_like(norm.weight)) and torch.count_nonzero(norm.bias).item() == 0
    assert normal.model.decoder.embed_tokens.weight.data_ptr() == normal.get_output_embeddings().weight.data_ptr()


@pytest.mark.parametrize("value", [0, -0.02, True, "0.02"])
def test_init_std_must_be_a_positive_number(value):
    with pytest.raises(ValueError, match="init_std must be a positive number"):
        ScratchTransformerConfig(init_std=value)


def test_bad_labels_are_refused_by_name_before_they_become_decoder_inputs():
    """Without decoder_input_ids the labels are shifted into the decoder's inputs: they are checked first, so a
    wrong shape or id is named as the labels' fault, not a deep IndexError or an input-ids message."""
    model = tester.model()
    input_ids, attention_mask, labels = tester.inputs()
    for bad, match in [
        (labels[0], r"labels must be \(batch, target length\), got shape \(7,\)"),
        (labels[None], r"got shape \(1, 3, 7\)"),
        (labels.float(), "labels must be integer ids, got dtype torch.float32"),
        (labels.bool(), "labels must be integer ids, got dtype torch.bool"),
    ]:
        with pytest.raises(ValueError, match=match):
            model(input_ids=input_ids, attention_mask=attention_mask, labels=bad)
    mid = labels.clone()
    mid[1, 3] = -5
    with pytest.raises(ValueError, match=r"labels must be in \[0, vocab_size=40\) or -100 .*got range \[-5,"):
        model(input_ids=input_ids, attention_mask=attention_mask, labels=mid)
    # int32 labels with -100 give the same loss as int64 ones
    padded = labels.clone()
    padded[2, 4:] = -100
    torch.testing.assert_close(model(input_ids=input_ids, attention_mask=attention_mask, labels=padded.int()).loss,
                               model(input_ids=input_ids, attention_mask=attention_mask, labels=padded).loss)
