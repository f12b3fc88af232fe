"""torch.compile(fullgraph=True), the static cache and torch.export: the model traces without a graph break,
generate(cache_implementation="static") gives the dynamic cache's tokens, and transformers' own seq2seq
exporter (transformers.integrations.executorch) decodes greedily as generate() does. Bad input keeps its
clear error where it does not break the graph. Compiling uses the "eager" backend: it runs dynamo's full
tracing (where graph breaks show) without inductor's CPU code generation."""

import pytest
import torch
from transformers import CompileConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache, StaticCache
from transformers.integrations.executorch import Seq2SeqLMExportableModule

from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration

from helpers import TINY_LM_VOCAB as VOCAB  # noqa: E402
from helpers import make_tiny_lm as make_model  # noqa: E402
from helpers import make_tiny_lm_inputs as make_inputs  # noqa: E402


GREEDY = dict(max_new_tokens=8, do_sample=False, no_repeat_ngram_size=1, suppress_tokens=[0, 1, 2])


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_the_model_declares_it_compiles_without_graph_breaks():
    assert ScratchTransformerForConditionalGeneration._can_compile_fullgraph


@pytest.mark.parametrize("implementation", [pytest.param("eager", marks=pytest.mark.slow), "sdpa"])  # ~10 s each
@torch.no_grad()
def test_compile_fullgraph_forward_gives_the_eager_logits(implementation):
    model = make_model()
    model.set_attn_implementation(implementation)
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    expected = model(**kwargs).logits
    compiled = torch.compile(model, fullgraph=True, backend="eager")  # a graph break would raise here
    torch.testing.assert_close(compiled(**kwargs).logits, expected)
    torch.testing.assert_close(compiled(**kwargs, return_dict=False)[0], expected)


def test_compile_fullgraph_training_step_gives_the_eager_gradients():
    model = make_model(dropout=0.0)
    model.train()
    input_ids, attention_mask, labels = make_inputs()
    model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    compiled(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    for name, grad in expected.items():
        torch.testing.assert_close(model.get_parameter(name).grad, grad, msg=name)


@torch.no_grad()
def test_a_compiled_decoding_step_over_a_static_cache_gives_the_dynamic_caches_logits():
    model = make_model()
    input_ids, attention_mask, _ = make_inputs()
    config = model.config
    encoder_outputs = model.get_encoder()(input_ids, attention_mask)
    static = EncoderDecoderCache(StaticCache(config=config, max_cache_len=16),
                                 StaticCache(config=config, max_cache_len=9))
    dynamic = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
    step = torch.compile(model, fullgraph=True, backend="eager")
    tokens = torch.full((3, 1), config.decoder_start_token_id)
    for position in range(5):
        want = model(encoder_outputs=encoder_outputs, attention_mask=attention_mask, decoder_input_ids=tokens,
                     cache=dynamic, use_cache=True).logits
        # the static cache's keys are (b, h, 16, k): the decoder mask covers the unwritten slots
        mask = torch.zeros(3, 1, 1, 16).masked_fill(torch.arange(16) > position, torch.finfo(torch.float32).min)
        got = step(encoder_outputs=encoder_outputs, attention_mask=attention_mask, decoder_input_ids=tokens,
                   decoder_attention_mask=mask, cache=static, use_cache=True).logits
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        tokens = want[:, -1].argmax(-1, keepdim=True)


@pytest.mark.parametrize("num_beams", [1, 3])
@torch.no_grad()
def test_static_cache_generates_the_dynamic_caches_tokens(num_beams):
    model = make_model()
    input_ids, attention_mask, _ = make_inputs()
    dynamic = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams, **GREEDY)
    static = model.generate(input_ids=input_ids, attention_mask=attention_mask, num_beams=num_beams,
                            cache_implementation="static", **GREEDY)
    assert dynamic.shape == (3, 9)
    assert torch.equal(static, dynamic)


@pytest.mark.slow  # ~15 s: dynamo traces the decoding step
@torch.no_grad()
def test_generate_compiles_the_static_cache_step_and_gives_the_same_tokens():
    model = make_model()
    input_ids, attention_mask, _ = make_inputs()
    expected = model.generate(input_ids=input_ids, attention_mask=attention_mask, **GREEDY)
    compile_config = CompileConfig(fullgraph=True, backend="eager")
    compile_config._compile_all_devices = True  # generate() compiles only on accelerators unless told
    got = model.generate(input_ids=input_ids, attention_mask=attention_mask, cache_implementation="static",
                         compile_config=compile_config, **GREEDY)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("strict", [False, True])
@torch.no_grad()
def test_torch_export_of_the_forward_gives_the_eager_logits(strict):
    model = make_model()
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                  use_cache=False, return_dict=False)
    program = torch.export.export(model, args=(), kwargs=kwargs, strict=strict)
    torch.testing.assert_close(program.module()(**kwargs)[0], model(**kwargs)[0])


@torch.no_grad()
def test_transformers_seq2seq_exporter_decodes_greedily_as_generate_does():
    model = make_model()
    input_ids, attention_mask, _ = make_inputs()
    exporter = Seq2SeqLMExportableModule(model, batch_size=1, max_hidden_seq_length=64, max_cache_length=16)
    exporter.export(encoder_input_ids=input_ids[:1], decoder_input_ids=torch.tensor([[1]]))
    encoder, decoder = exporter.exported_encoder.module(), exporter.exported_decoder.module()
    for row in range(3):
        source = input_ids[row:row + 1, : int(attention_mask[row].sum())]  # lengths 9, 6, 3: the dynamic dimension
        expected = model.generate(input_ids=source, max_new_tokens=8, do_sample=False)[0].tolist()
        hidden = encoder(source)
        tokens = [model.config.decoder_start_token_id]
        for position in range(8):
            logits = decoder(torch.tensor([[tokens[-1]]]), hidden, torch.tensor([position]))
            tokens.append(int(logits[0, -1].argmax()))
            if tokens[-1] == model.config.eos_token_id:
                break
        assert tokens == expected


def test_bad_ids_and_masks_keep_their_errors_outside_compilation_and_fail_the_trace_inside():
    model = make_model()
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    with pytest.raises(ValueError, match=r"token ids must be in \[0, vocab_size=40\), got range \[4, 40\]"):
        model(input_ids=input_ids.clamp(min=3) + 1, decoder_input_ids=decoder_input_ids)
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    # shape checks are static: they still raise while tracing, by name
    with pytest.raises(Exception, match=r"attention_mask has shape \(3, 5\)"):
        compiled(input_ids=input_ids, attention_mask=attention_mask[:, :5], decoder_input_ids=decoder_input_ids)
