"""Late dropout (--late_dropout): dropout that rises with the epochs, its values, the modules it sets, what it
refuses, and the main job with it."""

from types import SimpleNamespace

import pytest
import torch

from helpers import TINY, tiny_run_flags, train_translation
from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer.arguments import ModelArguments
from scratch_transformer.training import LateDropoutCallback


def tiny_model(dropout=0.1, attention_dropout=0.05):
    config = ScratchTransformerConfig(vocab_size=50, d_model=16, num_heads=2, encoder_layers=2, decoder_layers=1,
                                      d_ff=32, dropout=dropout, attention_dropout=attention_dropout)
    return ScratchTransformerForConditionalGeneration(config)


def dropout_ps(model):
    return [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]


@pytest.mark.parametrize("epoch, expected", [(0.0, 0.1), (4.0, 0.1), (5.0, 0.1), (7.5, 0.15), (10.0, 0.2),
                                             (15.0, 0.3), (40.0, 0.3)])
def test_dropout_rises_linearly_between_the_two_epochs(epoch, expected):
    callback = LateDropoutCallback(tiny_model(), 0.3, 5, 15)
    assert callback.dropout_at(epoch) == pytest.approx(expected)


def test_equal_epochs_make_a_step():
    callback = LateDropoutCallback(tiny_model(), 0.3, 6, 6)
    assert [callback.dropout_at(e) for e in (5.99, 6.0, 9.0)] == pytest.approx([0.1, 0.3, 0.3])


def test_it_sets_the_embedding_and_sublayer_dropouts_and_puts_the_config_value_back():
    model = tiny_model()
    # the embeddings of both sides, and one per layer (used around each of its sublayers): 2 + 1 layers
    assert dropout_ps(model) == [0.1] * (2 + 2 + 1)
    callback = LateDropoutCallback(model, 0.3, 5, 15)
    callback.on_train_begin(None, SimpleNamespace(epoch=12.5), None)  # a run resumed at epoch 12.5
    assert dropout_ps(model) == pytest.approx([0.25] * 5)
    callback.on_step_begin(None, SimpleNamespace(epoch=20.0), None)
    assert dropout_ps(model) == pytest.approx([0.3] * 5)
    attention = [m.attention_dropout for m in model.modules() if hasattr(m, "attention_dropout")
                 and isinstance(m.attention_dropout, float)]
    assert attention and set(attention) == {0.05}  # attention dropout is left alone
    callback.on_train_end(None, SimpleNamespace(epoch=20.0), None)
    assert dropout_ps(model) == [0.1] * 5 and model.config.dropout == 0.1
    assert callback.summary(12.5) == {"late_dropout": 0.3, "late_dropout_epochs": [5.0, 15.0],
                                      "final_dropout": 0.25}


def test_the_rise_changes_what_training_computes():
    """At p 0.9 the same forward pass in training mode gives another loss than at the config's 0: the modules
    the callback sets are the ones the model uses."""
    model = tiny_model(dropout=0.0, attention_dropout=0.0).train()
    batch = {"input_ids": torch.randint(4, 50, (2, 7)), "labels": torch.randint(4, 50, (2, 5))}
    torch.manual_seed(0)
    before = model(**batch).loss
    callback = LateDropoutCallback(model, 0.9, 0, 1)
    callback.on_step_begin(None, SimpleNamespace(epoch=1.0), None)
    torch.manual_seed(0)
    after = model(**batch).loss
    assert not torch.isclose(before, after)
    callback.on_train_end(None, None, None)
    torch.manual_seed(0)
    torch.testing.assert_close(model(**batch).loss, before)


def test_a_model_without_dropout_modules_is_refused():
    from transformers import MarianConfig, MarianMTModel

    marian = MarianMTModel(MarianConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                        decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=0,
                                        decoder_start_token_id=0))
    with pytest.raises(ValueError, match="MarianMTModel has none"):
        LateDropoutCallback(marian, 0.3, 5, 15)


@pytest.mark.parametrize("values, message", [({"late_dropout": 1.0}, "late_dropout must be in"),
                                             ({"late_dropout": -0.1}, "late_dropout must be in"),
                                             ({"late_dropout": 0.3, "late_dropout_start_epoch": 9,
                                               "late_dropout_end_epoch": 3}, "0 <= start <= end"),
                                             ({"late_dropout": 0.3, "late_dropout_start_epoch": -1}, "0 <= start"),
                                             ({"late_dropout_end_epoch": float("inf")}, "finite")])
def test_bad_arguments_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        ModelArguments(**values)
    if "late_dropout" in values and not 0 <= values["late_dropout"] < 1:
        with pytest.raises(ValueError, match=message):
            LateDropoutCallback(tiny_model(), values["late_dropout"], 5, 15)


def test_the_main_job_with_late_dropout(tmp_path):
    """Tiny runs of 4 steps (half an epoch): a rise that begins beyond reach trains exactly as without it; one
    from epoch 0 changes the training loss, and all_results.json and the model card say what was reached."""
    def run(name, **extra):
        flags = tiny_run_flags(tmp_path / name, max_steps=4, max_eval_samples=4, max_predict_samples=4, **extra)
        return train_translation.main(flags)["all_results"]

    plain = run("plain")
    unreached = run("unreached", late_dropout=0.5, late_dropout_start_epoch=100, late_dropout_end_epoch=200)
    at_once = run("at_once", late_dropout=0.5, late_dropout_start_epoch=0, late_dropout_end_epoch=0)
    assert "dropout=0.0" in TINY and "late_dropout" not in plain
    assert unreached["train_loss"] == plain["train_loss"]
    assert at_once["train_loss"] != pytest.approx(plain["train_loss"], rel=1e-4)
    assert (unreached["final_dropout"], at_once["final_dropout"]) == (0.0, 0.5)
    card = (tmp_path / "at_once" / "README.md").read_text()
    assert "late dropout: 0.0 rising to 0.5 over epochs 0-0, 0.5 reached" in card
