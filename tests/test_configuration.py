"""ScratchTransformerConfig: HF's generic names (attribute_map) get the same checks as the paper names."""

import json

import pytest

from scratch_transformer import ScratchTransformerConfig


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"hidden_size": 250, "num_attention_heads": 4},
         r"d_model \(given as hidden_size\)=250 must be divisible by num_heads \(given as num_attention_heads\)=4"),
        ({"hidden_size": 250}, r"d_model \(given as hidden_size\)=250 must be divisible by num_heads=8"),
        ({"hidden_size": -8}, r"d_model \(given as hidden_size\) must be a positive integer, got -8"),
        ({"num_hidden_layers": 0}, r"decoder_layers \(given as num_hidden_layers\) must be a positive integer, got 0"),
        ({"intermediate_size": 0}, r"d_ff \(given as intermediate_size\) must be a positive integer, got 0"),
        ({"encoder_ffn_dim": -1}, r"d_ff \(given as encoder_ffn_dim\) must be a positive integer, got -1"),
        ({"num_attention_heads": 0}, r"num_heads \(given as num_attention_heads\) must be a positive integer, got 0"),
        ({"decoder_attention_heads": 3}, r"d_model=512 must be divisible by num_heads \(given as decoder_attention_heads\)=3"),
    ],
)
def test_hf_generic_names_are_checked_like_paper_names(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ScratchTransformerConfig(**kwargs)


def test_hf_generic_names_set_the_paper_fields():
    config = ScratchTransformerConfig(hidden_size=256, num_attention_heads=4, num_hidden_layers=3,
                                      intermediate_size=1024)
    assert (config.d_model, config.num_heads, config.decoder_layers, config.d_ff) == (256, 4, 3, 1024)
    assert (config.hidden_size, config.num_attention_heads, config.num_hidden_layers) == (256, 4, 3)
    assert config.encoder_layers == 6  # num_hidden_layers names the decoder stack only (the KV cache size)


def test_a_field_given_under_two_names_with_different_values_is_rejected():
    with pytest.raises(ValueError, match=r"d_model=256 and its HF name hidden_size=128 disagree"):
        ScratchTransformerConfig(d_model=256, hidden_size=128)
    with pytest.raises(ValueError, match=r"num_attention_heads=4 and encoder_attention_heads=8 set the same field "
                                         r"num_heads"):
        ScratchTransformerConfig(num_attention_heads=4, encoder_attention_heads=8)
    assert ScratchTransformerConfig(d_model=256, hidden_size=256).d_model == 256  # agreeing names are fine


def test_config_json_with_generic_names_is_checked(tmp_path):
    """A config.json written by other tools under HF's names goes through the same checks on load."""
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "scratch_transformer", "hidden_size": 250, "num_attention_heads": 4}))
    with pytest.raises(ValueError, match=r"d_model \(given as hidden_size\)=250 must be divisible"):
        ScratchTransformerConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "scratch_transformer", "hidden_size": 64, "num_attention_heads": 4}))
    config = ScratchTransformerConfig.from_pretrained(tmp_path)
    assert (config.d_model, config.num_heads) == (64, 4)
