"""Long-run dropout (--long_run_dropout): stronger dropout for a run planned or projected to make many passes over
the training data, the decision, its journey through a checkpoint, what it refuses, and the main job with it."""

import json
from types import SimpleNamespace

import pytest
import torch

from helpers import steps_of_known_length, tiny_run_flags, train_translation
from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer.arguments import ModelArguments
from scratch_transformer.training import LongRunDropoutCallback


def tiny_model(dropout=0.1):
    config = ScratchTransformerConfig(vocab_size=50, d_model=16, num_heads=2, encoder_layers=2, decoder_layers=1,
                                      d_ff=32, dropout=dropout, attention_dropout=0.05)
    return ScratchTransformerForConditionalGeneration(config)


def dropout_ps(model):
    return [m.p for m in model.modules() if isinstance(m, torch.nn.Dropout)]


class FakeBudget:
    def __init__(self):
        self.fraction = 0.0

    def progress(self):
        return self.fraction


def state(epoch=0.0, step=0, num_train_epochs=0, saved=None):
    return SimpleNamespace(epoch=epoch, global_step=step, num_train_epochs=num_train_epochs,
                           stateful_callbacks=saved or {})


@pytest.mark.parametrize("epoch_at_an_eighth, expected", [(2.0, 0.2), (1.75, 0.2), (1.625, 0.1)])
def test_with_a_budget_it_decides_from_the_projected_epochs(epoch_at_an_eighth, expected):
    """Under a tenth of the budget nothing is decided; an eighth gone after 2 / 1.75 / 1.625 epochs projects
    16 / 14 / 13 for the whole of it."""
    model, budget = tiny_model(), FakeBudget()
    callback = LongRunDropoutCallback(model, 0.2, 14, budget)
    callback.on_train_begin(None, state(), None)
    budget.fraction = 0.09
    callback.on_step_end(None, state(epoch=epoch_at_an_eighth * 0.7, step=90), None)
    assert callback.projected_epochs is None and dropout_ps(model) == [0.1] * 5  # not yet decided
    budget.fraction = 0.125
    callback.on_step_end(None, state(epoch=epoch_at_an_eighth, step=100), None)
    assert callback.projected_epochs == epoch_at_an_eighth * 8
    assert dropout_ps(model) == pytest.approx([expected] * 5)
    budget.fraction = 0.5  # later steps go faster: the decision stands
    callback.on_step_end(None, state(epoch=epoch_at_an_eighth * 9, step=500), None)
    assert dropout_ps(model) == pytest.approx([expected] * 5) and callback.decided_at_step == 100
    callback.on_train_end(None, None, None)
    assert dropout_ps(model) == [0.1] * 5 and model.config.dropout == 0.1
    assert callback.summary() == {"long_run_dropout": 0.2, "long_run_min_epochs": 14.0,
                                  "projected_epochs": epoch_at_an_eighth * 8, "final_dropout": expected}


@pytest.mark.parametrize("planned, expected", [(20, 0.3), (14, 0.3), (5, 0.1), (2**63 - 1, 0.1)])
def test_without_a_budget_it_decides_from_the_planned_epochs_at_the_start(planned, expected):
    model = tiny_model()
    callback = LongRunDropoutCallback(model, 0.3, 14)
    callback.on_train_begin(None, state(num_train_epochs=planned), None)
    assert dropout_ps(model) == pytest.approx([expected] * 5)  # sys.maxsize: a dataset without a length


def test_a_resumed_run_keeps_the_decision_from_its_checkpoint():
    """The decision travels in trainer_state.json (stateful_callbacks): a run resumed after it takes it up,
    even where its own projection would now say otherwise."""
    model, budget = tiny_model(), FakeBudget()
    first = LongRunDropoutCallback(model, 0.2, 14, budget)
    first.on_train_begin(None, state(), None)
    budget.fraction = 0.1
    first.on_step_end(None, state(epoch=2.0, step=120), None)
    saved = json.loads(json.dumps({"LongRunDropoutCallback": first.state()}))  # as trainer_state.json holds it
    first.on_train_end(None, None, None)

    resumed_model = tiny_model()
    resumed = LongRunDropoutCallback(resumed_model, 0.2, 14, FakeBudget())
    resumed.on_train_begin(None, state(epoch=3.0, step=200, saved=saved), None)
    assert dropout_ps(resumed_model) == pytest.approx([0.2] * 5)
    budget_now = resumed.budget
    budget_now.fraction = 0.9  # a slow second segment would project 3.3 epochs: not asked again
    resumed.on_step_end(None, state(epoch=3.0, step=201), None)
    assert resumed.summary()["projected_epochs"] == 20.0 and resumed.decided_at_step == 120
    assert dropout_ps(resumed_model) == pytest.approx([0.2] * 5)


def test_a_run_resumed_before_the_decision_takes_it_later():
    saved = {"LongRunDropoutCallback": {"args": {}, "attributes": {"projected_epochs": None, "dropout": 0.1,
                                                                   "decided_at_step": None}}}
    model, budget = tiny_model(), FakeBudget()
    callback = LongRunDropoutCallback(model, 0.2, 14, budget)
    callback.on_train_begin(None, state(saved=saved), None)
    assert callback.projected_epochs is None and dropout_ps(model) == [0.1] * 5
    budget.fraction = 0.2
    callback.on_step_end(None, state(epoch=4.0, step=300), None)
    assert callback.projected_epochs == pytest.approx(20.0) and dropout_ps(model) == pytest.approx([0.2] * 5)


@pytest.mark.parametrize("values, message", [({"long_run_dropout": 1.0}, "long_run_dropout must be in"),
                                             ({"long_run_dropout": -0.2}, "long_run_dropout must be in"),
                                             ({"long_run_min_epochs": 0}, "long_run_min_epochs must be positive"),
                                             ({"long_run_min_epochs": float("inf")}, "positive and finite")])
def test_bad_arguments_are_refused(values, message):
    with pytest.raises(ValueError, match=message):
        ModelArguments(**values)
    with pytest.raises(ValueError, match=message):
        LongRunDropoutCallback(tiny_model(), values.get("long_run_dropout", 0.2), values.get("long_run_min_epochs", 14))


def test_a_model_without_dropout_modules_is_refused():
    from transformers import MarianConfig, MarianMTModel

    marian = MarianMTModel(MarianConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                        decoder_ffn_dim=32, max_position_embeddings=32, pad_token_id=0,
                                        decoder_start_token_id=0))
    with pytest.raises(ValueError, match="MarianMTModel has none.*--long_run_dropout at 0"):
        LongRunDropoutCallback(marian, 0.2, 14)


def test_the_main_job_with_long_run_dropout(tmp_path):
    """Tiny runs of 4 steps of 8 pairs over 32 (one epoch): a run planned under the threshold trains exactly as
    without the option; one over it changes the training loss; all_results.json, the model card and each
    checkpoint's trainer_state.json say what was decided; the saved config keeps its own dropout."""
    def run(name, **extra):
        flags = tiny_run_flags(tmp_path / name, max_train_samples=32, per_device_train_batch_size=8, max_steps=4,
                               max_eval_samples=4, max_predict_samples=4, save_steps=2, **extra)
        return train_translation.main(flags)["all_results"]

    plain = run("plain")
    short = run("short", long_run_dropout=0.5, long_run_min_epochs=2)
    long = run("long", long_run_dropout=0.5, long_run_min_epochs=1)
    assert "long_run_dropout" not in plain
    assert short["train_loss"] == plain["train_loss"]
    assert long["train_loss"] != pytest.approx(plain["train_loss"], rel=1e-4)
    assert (short["projected_epochs"], short["final_dropout"]) == (1.0, 0.0)
    assert (long["projected_epochs"], long["final_dropout"], long["long_run_min_epochs"]) == (1.0, 0.5, 1.0)
    card = (tmp_path / "long" / "README.md").read_text()
    assert "dropout 0.5 (long-run dropout 0.5 from 1 epochs, else 0.0: 1 epochs projected)" in card
    saved = json.loads((tmp_path / "long" / "checkpoint-2" / "trainer_state.json").read_text())
    assert saved["stateful_callbacks"]["LongRunDropoutCallback"]["attributes"]["dropout"] == 0.5
    assert json.loads((tmp_path / "long" / "config.json").read_text())["dropout"] == 0.0


def test_the_main_job_decides_on_its_budget(tmp_path, monkeypatch):
    """A 6-second budget of 0.125-second steps (the budget's clock simulated, so the machine's speed does not
    matter) with max_steps far out of reach: 48 steps of 8 pairs over 32 (4 a pass, 12 passes); the decision is
    taken at the first step past a tenth of the budget (step 5: 1.25 epochs in 0.625 s, 12 epochs projected)."""
    steps_of_known_length(monkeypatch, 0.125)
    flags = tiny_run_flags(tmp_path / "run", max_train_samples=32, per_device_train_batch_size=8, max_steps=100000,
                           max_train_minutes=0.1, warmup_steps=0.2, save_steps=100000, do_eval=False,
                           do_predict=False, long_run_dropout=0.5, long_run_min_epochs=10)
    results = train_translation.main(flags)["all_results"]
    assert json.loads((tmp_path / "run" / "trainer_state.json").read_text())["global_step"] == 48
    assert results["final_dropout"] == 0.5 and results["projected_epochs"] == pytest.approx(12.0)
