"""The model's Hugging Face API, group by group as transformers checks its own models: tuple vs ModelOutput,
inputs_embeds, logits_to_keep, resize_token_embeddings, get_encoder, save/load with tied weights, init from
the meta device, determinism, batching equivalence, hidden states and attentions, and clear errors for
1-D or empty inputs. A tiny config, fixed seeds, CPU."""

from contextlib import nullcontext

import pytest
import torch

from scratch_transformer import (
    ScratchTransformerConfig,
    ScratchTransformerForConditionalGeneration,
    ScratchTransformerModel,
)
from scratch_transformer.modeling_scratch_transformer import CACHE_FIELD

VOCAB = 40


def make_config(**overrides) -> ScratchTransformerConfig:
    values = dict(vocab_size=VOCAB, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=3, d_ff=64,
                  dropout=0.0, max_position_embeddings=64, init_std=0.3)
    values.update(overrides)
    return ScratchTransformerConfig(**values)


def make_model(cls=ScratchTransformerForConditionalGeneration, **overrides):
    torch.manual_seed(0)
    return cls(make_config(**overrides)).eval()


def make_inputs(seed: int = 0, batch: int = 3, src_len: int = 8, tgt_len: int = 6):
    """Source ids (b, s) right-padded to unequal lengths, their mask, and target ids (b, t)."""
    g = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, VOCAB, (batch, src_len), generator=g)
    attention_mask = torch.ones_like(input_ids)
    for row in range(1, batch):
        attention_mask[row, src_len - 2 * row:] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    decoder_input_ids = torch.randint(3, VOCAB, (batch, tgt_len), generator=g)
    return input_ids, attention_mask, decoder_input_ids


# ---------------------------------------------------------------- tuple vs ModelOutput


@pytest.mark.parametrize("cls", [ScratchTransformerModel, ScratchTransformerForConditionalGeneration])
def test_return_dict_false_and_config_return_dict_give_the_same_values_as_a_tuple(cls):
    model = make_model(cls)
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                  output_hidden_states=True, output_attentions=True)
    with torch.no_grad():
        as_dict = model(**kwargs)
        as_tuple = model(**kwargs, return_dict=False)
        model.config.return_dict = False
        from_config = model(**kwargs)
    expected = as_dict.to_tuple()
    for got in (as_tuple, from_config):
        assert type(got) is tuple and len(got) == len(expected)
        flat_got = [t for item in got for t in (item if isinstance(item, tuple) else [item])
                    if isinstance(t, torch.Tensor)]
        flat_expected = [t for item in expected for t in (item if isinstance(item, tuple) else [item])
                         if isinstance(t, torch.Tensor)]
        assert len(flat_got) == len(flat_expected) > 10
        for a, b in zip(flat_got, flat_expected):
            torch.testing.assert_close(a, b)


def test_labels_put_the_loss_first_in_the_tuple():
    model = make_model()
    input_ids, attention_mask, labels = make_inputs()
    with torch.no_grad():
        output = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
        loss, logits = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, return_dict=False)[:2]
    torch.testing.assert_close(loss, output.loss)
    torch.testing.assert_close(logits, output.logits)


def test_encoder_alone_returns_a_tuple_when_asked():
    model = make_model()
    input_ids, attention_mask, _ = make_inputs()
    with torch.no_grad():
        output = model.get_encoder()(input_ids, attention_mask, output_hidden_states=True)
        as_tuple = model.get_encoder()(input_ids, attention_mask, output_hidden_states=True, return_dict=False)
    torch.testing.assert_close(as_tuple[0], output.last_hidden_state)
    assert len(as_tuple[1]) == 3  # embeddings + 2 layers


# ---------------------------------------------------------------- inputs_embeds


@pytest.mark.parametrize("share", [False, True])
def test_inputs_embeds_give_the_logits_of_the_ids(share):
    model = make_model(share_encoder_decoder_embeddings=share)
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    with torch.no_grad():
        expected = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        inputs_embeds = model.get_input_embeddings()(input_ids)
        decoder_inputs_embeds = model.get_decoder().embed_tokens(decoder_input_ids)
        mixed = model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                      decoder_input_ids=decoder_input_ids).logits
        both = model(inputs_embeds=inputs_embeds, attention_mask=attention_mask,
                     decoder_inputs_embeds=decoder_inputs_embeds).logits
    torch.testing.assert_close(mixed, expected)
    torch.testing.assert_close(both, expected)
    assert expected.abs().max() > 0.1


def test_inputs_embeds_and_ids_together_are_refused_by_name():
    model = make_model()
    input_ids, _, decoder_input_ids = make_inputs()
    embeds = model.get_input_embeddings()(input_ids)
    with pytest.raises(ValueError, match="exactly one of input_ids .* or inputs_embeds"):
        model(input_ids=input_ids, inputs_embeds=embeds, decoder_input_ids=decoder_input_ids)
    with pytest.raises(ValueError, match="exactly one of decoder_input_ids .* or decoder_inputs_embeds"):
        model(input_ids=input_ids, decoder_input_ids=decoder_input_ids,
              decoder_inputs_embeds=model.get_decoder().embed_tokens(decoder_input_ids))
    with pytest.raises(ValueError, match="inputs_embeds must have 3 dimensions"):
        model(inputs_embeds=embeds[0], decoder_input_ids=decoder_input_ids)


def test_inputs_embeds_can_be_trained_through():
    model = make_model()
    input_ids, attention_mask, labels = make_inputs()
    embeds = model.get_input_embeddings()(input_ids).detach().requires_grad_()
    model(inputs_embeds=embeds, attention_mask=attention_mask, labels=labels).loss.backward()
    assert embeds.grad.abs().sum() > 0
    assert embeds.grad[2, 4:].abs().max() == 0  # padding positions reach nothing


# ---------------------------------------------------------------- logits_to_keep


def test_logits_to_keep_gives_the_last_positions_or_the_ones_asked():
    model = make_model()
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    kwargs = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    with torch.no_grad():
        full = model(**kwargs).logits
        last = model(**kwargs, logits_to_keep=1).logits
        last_two = model(**kwargs, logits_to_keep=2).logits
        picked = model(**kwargs, logits_to_keep=torch.tensor([0, 3])).logits
    assert full.shape == (3, 6, VOCAB) and last.shape == (3, 1, VOCAB) and picked.shape == (3, 2, VOCAB)
    torch.testing.assert_close(last, full[:, -1:])
    torch.testing.assert_close(last_two, full[:, -2:])
    torch.testing.assert_close(picked, full[:, [0, 3]])


def test_logits_to_keep_with_labels_is_refused():
    model = make_model()
    input_ids, _, labels = make_inputs()
    with pytest.raises(ValueError, match="labels need the logits at every position"):
        model(input_ids=input_ids, labels=labels, logits_to_keep=1)


# ---------------------------------------------------------------- resize_token_embeddings


@pytest.mark.parametrize("share", [False, True])
@pytest.mark.parametrize("new_size", [53, 31])
def test_resize_token_embeddings_grows_or_shrinks_both_stacks_and_the_tied_projection(share, new_size):
    model = make_model(share_encoder_decoder_embeddings=share)
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    input_ids, decoder_input_ids = input_ids.clamp(max=30), decoder_input_ids.clamp(max=30)
    with torch.no_grad():
        before = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
    old_rows = model.get_input_embeddings().weight[:31].clone()
    model.resize_token_embeddings(new_size, mean_resizing=False)
    encoder_table = model.model.encoder.embed_tokens
    decoder_table = model.model.decoder.embed_tokens
    assert model.config.vocab_size == new_size
    assert encoder_table.num_embeddings == decoder_table.num_embeddings == new_size
    assert model.lm_head.weight.shape == (new_size, 32)
    assert model.lm_head.weight is decoder_table.weight  # still tied (paper 3.4)
    assert (encoder_table is decoder_table) == share
    torch.testing.assert_close(encoder_table.weight[:31], old_rows)  # kept rows keep their values
    # ids up to the new size run, and the first 31 columns of the logits are unchanged
    with torch.no_grad():
        after = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        assert after.shape[-1] == new_size
        torch.testing.assert_close(after[..., :31], before[..., :31])
        top = torch.full_like(decoder_input_ids, new_size - 1)
        model(input_ids=top, decoder_input_ids=top, labels=top)
    with pytest.raises(ValueError, match=f"vocab_size={new_size}"):
        model(input_ids=top + 1, decoder_input_ids=top)


def test_resized_model_saves_and_reloads_tied(tmp_path):
    model = make_model()
    model.resize_token_embeddings(48, mean_resizing=False)
    model.save_pretrained(tmp_path)
    loaded = ScratchTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    assert loaded.lm_head.weight is loaded.model.decoder.embed_tokens.weight
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits,
            model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits)


# ---------------------------------------------------------------- get_encoder / get_decoder


def test_get_encoder_is_the_base_class_lookup():
    model = make_model()
    assert model.get_encoder() is model.model.encoder
    assert model.model.get_encoder() is model.model.encoder
    assert model.get_decoder() is model.model.decoder
    # a text model has no image encoder: transformers' rule answers with the model itself
    assert model.get_encoder(modality="image") is model
    assert "get_encoder" not in vars(ScratchTransformerForConditionalGeneration)


# ---------------------------------------------------------------- save/load, tied weights, meta init


@pytest.mark.parametrize("share", [False, True])
def test_save_and_load_keep_values_and_ties(tmp_path, share):
    model = make_model(share_encoder_decoder_embeddings=share)
    model.save_pretrained(tmp_path)
    loaded = ScratchTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, msg=name)
    assert loaded.lm_head.weight is loaded.model.decoder.embed_tokens.weight
    assert (loaded.model.encoder.embed_tokens is loaded.model.decoder.embed_tokens) == share


def test_from_config_on_the_meta_device_then_loaded_weights_give_the_same_logits(tmp_path):
    model = make_model()
    model.save_pretrained(tmp_path)
    with torch.device("meta"):
        empty = ScratchTransformerForConditionalGeneration(model.config)
    assert empty.lm_head.weight.is_meta
    # from_pretrained builds on meta too and must recompute the non-persistent sinusoid table
    loaded = ScratchTransformerForConditionalGeneration.from_pretrained(tmp_path).eval()
    torch.testing.assert_close(loaded.model.encoder.embed.embed_positions.table,
                               model.model.encoder.embed.embed_positions.table)
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            loaded(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits,
            model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits)


# ---------------------------------------------------------------- determinism, batching


def test_eval_forward_is_deterministic_and_training_dropout_is_seeded():
    model = make_model(dropout=0.3)
    input_ids, attention_mask, labels = make_inputs()
    with torch.no_grad():
        a = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
        b = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    assert torch.equal(a, b)
    model.train()
    losses = []
    for seed in (1, 1, 2):
        torch.manual_seed(seed)
        losses.append(model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss)
    assert torch.equal(losses[0], losses[1]) and not torch.equal(losses[0], losses[2])


def test_a_padded_batch_gives_each_row_what_it_gives_alone():
    model = make_model()
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    with torch.no_grad():
        batched = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).logits
        for row in range(3):
            length = int(attention_mask[row].sum())
            alone = model(input_ids=input_ids[row:row + 1, :length], decoder_input_ids=decoder_input_ids[row:row + 1])
            torch.testing.assert_close(batched[row], alone.logits[0], atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- hidden states and attentions


def test_hidden_states_and_attentions_have_one_entry_per_layer_and_rows_sum_to_one():
    model = make_model()
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
                    output_hidden_states=True, output_attentions=True)
    assert len(out.encoder_hidden_states) == 3 and len(out.decoder_hidden_states) == 4  # embeddings + layers
    assert len(out.encoder_attentions) == 2 and len(out.decoder_attentions) == len(out.cross_attentions) == 3
    assert out.encoder_attentions[0].shape == (3, 4, 8, 8)
    assert out.decoder_attentions[0].shape == (3, 4, 6, 6) and out.cross_attentions[0].shape == (3, 4, 6, 8)
    for weights in out.encoder_attentions + out.decoder_attentions + out.cross_attentions:
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert out.decoder_attentions[1][..., 0, 1:].abs().max() == 0  # the first target token sees only itself
    assert out.cross_attentions[2][2, ..., 4:].abs().max() == 0  # row 2's source padding gets no weight
    torch.testing.assert_close(out.decoder_hidden_states[-1], model.model(
        input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids).last_hidden_state)


def test_hidden_states_keep_gradients_for_inspection():
    model = make_model()
    input_ids, attention_mask, labels = make_inputs()
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, output_hidden_states=True,
                output_attentions=True)
    out.encoder_hidden_states[0].retain_grad()
    out.decoder_attentions[0].retain_grad()
    out.loss.backward()
    assert out.encoder_hidden_states[0].grad.abs().sum() > 0
    assert out.decoder_attentions[0].grad.abs().sum() > 0


# ---------------------------------------------------------------- bad input shapes


@pytest.mark.parametrize("bad, message", [
    (torch.tensor([5, 6, 7]), r"input_ids must have 2 dimensions \(batch, length\), got shape \(3,\)"),
    (torch.zeros(1, 0, dtype=torch.long), r"input_ids is empty \(shape \(1, 0\)\)"),
    (torch.zeros(0, 4, dtype=torch.long), r"input_ids is empty \(shape \(0, 4\)\)"),
])
def test_generate_on_1d_or_empty_input_ids_raises_a_value_error_naming_it(bad, message):
    model = make_model()
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids=bad, max_new_tokens=3)
    with pytest.raises(ValueError, match=message):
        model.generate(bad, max_new_tokens=3)
    with pytest.raises(ValueError, match=message):
        model(input_ids=bad, decoder_input_ids=torch.ones(1, 1, dtype=torch.long))


def test_a_decoder_mask_of_the_wrong_length_is_refused_by_name():
    model = make_model()
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    with pytest.raises(ValueError, match=r"decoder_attention_mask has shape \(3, 4\)"):
        model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
              decoder_attention_mask=torch.ones(3, 4))


@pytest.mark.parametrize("cls", [ScratchTransformerModel, ScratchTransformerForConditionalGeneration])
def test_the_v4_cache_name_warns_and_is_read_as_the_cache(cls):
    """past_key_values= (the v4 name) is the cache, with a deprecation warning, as in transformers' own models; it
    was swallowed by **kwargs, and the decoder ran without the cache's past (positions restarted at 0)."""
    from transformers.cache_utils import DynamicCache, EncoderDecoderCache

    model = make_model(cls)
    input_ids, attention_mask, decoder_input_ids = make_inputs()
    prefix = model(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, :4],
                   use_cache=True)[CACHE_FIELD]
    caches = [EncoderDecoderCache(DynamicCache(), DynamicCache()) for _ in range(2)]
    for cache in caches:
        for layer in range(len(prefix.self_attention_cache.layers)):
            cache.self_attention_cache.update(prefix.self_attention_cache.layers[layer].keys.clone(),
                                              prefix.self_attention_cache.layers[layer].values.clone(), layer)
    step = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids[:, 4:5],
                use_cache=True)
    new = model(**step, cache=caches[0])
    # the warning where `cache` is the installed transformers' name (5.24+); before, generate() passes the old name
    warns = pytest.warns(FutureWarning, match="`past_key_values` is deprecated") if CACHE_FIELD == "cache" else nullcontext()
    with warns:
        old = model(**step, past_key_values=caches[1])
    assert getattr(old, CACHE_FIELD).get_seq_length() == getattr(new, CACHE_FIELD).get_seq_length() == 5
    assert torch.equal(old.last_hidden_state if cls is ScratchTransformerModel else old.logits,
                       new.last_hidden_state if cls is ScratchTransformerModel else new.logits)
