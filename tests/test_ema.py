"""The moving average of the weights (--ema_decay): its values, its place in checkpoints and resumes, the choice
between the last checkpoint, the checkpoint average and it at the end of the main job, and its arguments."""

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from helpers import tiny_run_flags, train_translation
from scratch_transformer.arguments import ModelArguments
from scratch_transformer.training import EMA_WEIGHTS_NAME, ExponentialMovingAverageCallback
from scratch_transformer.translation import average


class Tied(torch.nn.Module):
    """Two parameters, one used twice (as a tied embedding / output projection), a buffer and a frozen weight."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(3, 2)
        self.out = torch.nn.Linear(2, 3, bias=True)
        self.out.weight = self.embed.weight
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)
        self.register_buffer("positions", torch.arange(4.0))


def run_steps(callback, model, args, values, start_step=0):
    """Set the weights to each of `values` in turn (as optimizer steps would) and call on_step_end after each."""
    for step, value in enumerate(values, start=start_step + 1):
        with torch.no_grad():
            for param in model.parameters():
                if param.requires_grad:
                    param.fill_(value)
        callback.on_step_end(args, SimpleNamespace(global_step=step), None, model=model)


def expected_average(initial, values, decay, start_step=0):
    average = initial
    for step, value in enumerate(values, start=start_step + 1):
        d = min(decay, (1 + step) / (10 + step))
        average = d * average + (1 - d) * value
    return average


def test_moving_average_follows_the_formula_with_its_warm_up(tmp_path):
    model, args = Tied(), SimpleNamespace(should_save=True, output_dir=str(tmp_path))
    with torch.no_grad():
        model.embed.weight.fill_(2.0)
        model.out.bias.fill_(2.0)
    callback = ExponentialMovingAverageCallback(0.9)
    callback.on_train_begin(args, None, None, model=model)
    assert set(callback.shadow) == {"embed.weight", "out.bias"}  # trainable, the tied weight once, no buffer
    values = [1.0, -3.0, 5.0, 0.5, 7.0, 1.0, 2.0, -1.0, 0.0, 4.0, 3.0, 9.0, -2.0, 6.0, 1.5, 0.0, 8.0, 2.5, -4.0, 1.0]
    run_steps(callback, model, args, values)
    expected = expected_average(2.0, values, 0.9)
    assert expected != pytest.approx(values[-1])  # the warm-up (d_t < 0.9 for t < 80) has not been skipped
    for tensor in callback.shadow.values():
        torch.testing.assert_close(tensor, torch.full_like(tensor, expected), rtol=1e-6, atol=1e-6)
    fresh = Tied()
    callback.load_into(fresh)
    torch.testing.assert_close(fresh.embed.weight, torch.full((3, 2), expected), rtol=1e-6, atol=1e-6)
    assert fresh.out.weight is fresh.embed.weight  # still tied
    torch.testing.assert_close(fresh.frozen, torch.ones(2))  # frozen weights and buffers are left alone
    torch.testing.assert_close(fresh.positions, torch.arange(4.0))


def test_moving_average_travels_in_the_checkpoint_and_a_resume_continues_it(tmp_path):
    model, args = Tied(), SimpleNamespace(should_save=True, output_dir=str(tmp_path))
    callback = ExponentialMovingAverageCallback(0.95)
    callback.on_train_begin(args, None, None, model=model)
    initial = callback.shadow["out.bias"].clone()
    run_steps(callback, model, args, [1.0, 2.0, 3.0])
    (tmp_path / "checkpoint-3").mkdir()
    callback.on_save(args, SimpleNamespace(global_step=3), None)
    assert (tmp_path / "checkpoint-3" / EMA_WEIGHTS_NAME).is_file()
    assert not (tmp_path / "checkpoint-3" / (EMA_WEIGHTS_NAME + ".tmp")).exists()
    run_steps(callback, model, args, [4.0, 5.0], start_step=3)

    resumed_model = Tied()  # weights of step 3 would be loaded by the Trainer; the average comes from the file
    resumed = ExponentialMovingAverageCallback(0.95, resume_from=str(tmp_path / "checkpoint-3"))
    resumed.on_train_begin(args, None, None, model=resumed_model)
    run_steps(resumed, resumed_model, args, [4.0, 5.0], start_step=3)
    torch.testing.assert_close(resumed.shadow["out.bias"], callback.shadow["out.bias"], rtol=0, atol=0)
    want = [expected_average(initial[i].item(), [1.0, 2.0, 3.0, 4.0, 5.0], 0.95) for i in range(3)]
    torch.testing.assert_close(resumed.shadow["out.bias"], torch.tensor(want), rtol=1e-6, atol=1e-6)


def test_a_checkpoint_without_the_average_restarts_it_and_a_wrong_one_is_refused(tmp_path, caplog):
    model, args = Tied(), SimpleNamespace(should_save=True, output_dir=str(tmp_path))
    (tmp_path / "checkpoint-1").mkdir()
    callback = ExponentialMovingAverageCallback(0.9, resume_from=str(tmp_path / "checkpoint-1"))
    callback.on_train_begin(args, None, None, model=model)
    assert "restarts from the resumed weights" in caplog.text
    torch.testing.assert_close(callback.shadow["embed.weight"], model.embed.weight.detach())
    save_file({"embed.weight": torch.zeros(4, 2), "out.bias": torch.zeros(3)},
              str(tmp_path / "checkpoint-1" / EMA_WEIGHTS_NAME))
    with pytest.raises(ValueError, match="does not hold the model's trainable weights"):
        ExponentialMovingAverageCallback(0.9, resume_from=str(tmp_path / "checkpoint-1")).on_train_begin(
            args, None, None, model=model)


@pytest.mark.parametrize("decay", [0.0, 1.0, -0.5, 1.5])
def test_moving_average_refuses_a_decay_outside_0_1(decay):
    with pytest.raises(ValueError, match="ema_decay must be in"):
        ExponentialMovingAverageCallback(decay)
    if decay != 0.0:  # 0 is "off" among the job's arguments
        with pytest.raises(ValueError, match="ema_decay must be in"):
            ModelArguments(ema_decay=decay)


class FakeTrainer:
    """What `average` uses of a Trainer: the model, evaluate() scoring it by its weights, save_model/save_metrics."""

    def __init__(self, tmp_path, model, score_of_weights):
        self.model, self.score_of_weights = model, score_of_weights
        self.args = SimpleNamespace(output_dir=str(tmp_path))
        self.accelerator = SimpleNamespace(wait_for_everyone=lambda: None)
        self.is_fsdp_enabled = False
        self.saved_bias, self.metrics = None, None

    def evaluate(self, metric_key_prefix):
        return {f"{metric_key_prefix}_bleu": self.score_of_weights(self.model.out.bias[0].item())}

    def save_model(self):
        self.saved_bias = self.model.out.bias.detach().clone()

    def save_metrics(self, split, metrics):
        self.metrics = (split, metrics)


@pytest.mark.parametrize("best, scores", [("ema", {1.0: 30.0, 2.0: 31.0, 3.0: 32.0}),
                                          ("average", {1.0: 30.0, 2.0: 33.0, 3.0: 32.0}),
                                          ("last", {1.0: 34.0, 2.0: 33.0, 3.0: 32.0}),
                                          ("average", {1.0: 31.0, 2.0: 31.0, 3.0: 31.0})])  # a tie
def test_the_job_keeps_the_best_of_last_average_and_moving_average_on_validation(tmp_path, best, scores):
    """Last weights 1.0, the two checkpoints' mean 2.0, the moving average 3.0: the kept weights are the ones
    with the highest validation BLEU, in the model and on disk, and averaging_results.json names them."""
    model = Tied()
    for step, value in ((1, 1.5), (2, 2.5)):  # checkpoints whose mean is 2.0
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        state = {k: torch.full_like(v, value) for k, v in model.state_dict().items() if k != "out.weight"}
        save_file(state, str(folder / "model.safetensors"))
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.fill_(1.0)
    ema = ExponentialMovingAverageCallback(0.99)
    ema.shadow = {name: torch.full_like(p, 3.0) for name, p in ema._trainable(model).items()}
    trainer = FakeTrainer(tmp_path, model, lambda weight: scores[round(weight, 3)])
    results = average(trainer, 2, ema)
    value = {"last": 1.0, "average": 2.0, "ema": 3.0}[best]
    assert results["kept_weights"] == best
    assert results["averaged_checkpoints"] == (2 if best == "average" else 0)
    torch.testing.assert_close(model.out.bias, torch.full((3,), value))
    if best == "last":
        assert trainer.saved_bias is None  # the last weights are on disk already
    else:
        torch.testing.assert_close(trainer.saved_bias, torch.full((3,), value))
    split, metrics = trainer.metrics
    assert split == "averaging" and metrics["kept_weights"] == best and metrics["ema_decay"] == 0.99
    assert (metrics["last_checkpoint_bleu"], metrics["averaged_bleu"], metrics["ema_bleu"]) == \
        (scores[1.0], scores[2.0], scores[3.0])


def test_the_main_job_with_a_moving_average(tmp_path):
    """A tiny run with --ema_decay: every checkpoint holds the average, the three candidates are scored and the
    model card names the kept weights."""
    out = tmp_path / "run"
    results = train_translation.main(tiny_run_flags(out, max_steps=4, save_steps=2, average_last_checkpoints=2,
                                                    ema_decay=0.9, max_eval_samples=4, max_predict_samples=4))
    for step in (2, 4):
        assert (out / f"checkpoint-{step}" / EMA_WEIGHTS_NAME).is_file()
    averaging = json.loads((out / "averaging_results.json").read_text())
    scores = {"last": averaging["last_checkpoint_bleu"], "average": averaging["averaged_bleu"],
              "ema": averaging["ema_bleu"]}
    assert scores[averaging["kept_weights"]] == max(scores.values())
    assert results["all_results"]["kept_weights"] == averaging["kept_weights"]
    card = (out / "README.md").read_text()
    expected = {"last": "Weights: the last checkpoint.", "average": "Weights: the average of the last 2 checkpoints",
                "ema": "Weights: the exponential moving average of the weights (decay 0.9 per step)."}
    assert expected[averaging["kept_weights"]] in card
