"""scratch_transformer.training: the paper's peak learning rate, the wall-clock budget, the curve, JSON, counts."""

import json
import math
import os
from types import SimpleNamespace

import pytest
import torch
from transformers import TrainerControl, TrainerState

from scratch_transformer import training
from scratch_transformer.training import (
    WallClockBudgetCallback,
    count_parameters,
    noam_peak_learning_rate,
    plot_training_curve,
    write_json,
)


def test_noam_peak_is_eq_3_at_the_end_of_warmup():
    # eq. 3 at step = warmup: d_model^-0.5 * min(w^-0.5, w * w^-1.5) = d_model^-0.5 * w^-0.5
    assert noam_peak_learning_rate(512, 4000) == pytest.approx(512**-0.5 * 4000**-0.5)
    assert noam_peak_learning_rate(512, 4000) == pytest.approx(6.9877e-4, rel=1e-4)  # the paper's base model
    assert noam_peak_learning_rate(256, 800, factor=2.0) == pytest.approx(2 * 256**-0.5 * 800**-0.5)


@pytest.mark.parametrize("d_model, warmup", [(0, 10), (-4, 10), (16, 0)])
def test_noam_peak_refuses_non_positive_sizes(d_model, warmup):
    with pytest.raises(ValueError, match="must be positive"):
        noam_peak_learning_rate(d_model, warmup)


def test_budget_stops_after_its_training_time_not_counting_evaluation(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(WallClockBudgetCallback, "clock", staticmethod(lambda: clock[0]))
    budget = WallClockBudgetCallback(max_minutes=1.0)
    args, state = SimpleNamespace(world_size=1), TrainerState()
    budget.on_train_begin(args, state, TrainerControl())
    clock[0] += 50  # 50 s of training
    assert not budget.on_step_end(args, state, TrainerControl()).should_training_stop
    clock[0] += 30  # a 30 s evaluation, then 5 s of training: 55 s trained
    budget.on_evaluate(args, state, TrainerControl(), metrics={"eval_runtime": 30.0})
    clock[0] += 5
    control = budget.on_step_end(args, state, TrainerControl())
    assert not control.should_training_stop and budget.training_seconds == pytest.approx(55)
    clock[0] += 5  # 60 s trained: stop, and save the last step
    control = budget.on_step_end(args, state, TrainerControl())
    assert control.should_training_stop and control.should_save
    assert budget.training_seconds == pytest.approx(60)


@pytest.mark.parametrize("minutes", [0, -1])
def test_budget_refuses_a_non_positive_budget(minutes):
    with pytest.raises(ValueError, match="max_minutes must be positive"):
        WallClockBudgetCallback(minutes)


def test_training_curve_is_a_png_of_loss_and_bleu(tmp_path):
    history = [{"step": s, "loss": 5.0 / s} for s in range(1, 6)] + [{"step": 5, "eval_bleu": 12.5}]
    path = tmp_path / "curve.png"
    plot_training_curve(history, str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_write_json_replaces_the_file_whole_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("{\"old\": 1}")
    write_json(str(path), {"bleu": 38.5, "name": "Grüße"})
    assert json.loads(path.read_text(encoding="utf-8")) == {"bleu": 38.5, "name": "Grüße"}
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_count_parameters_counts_a_tied_weight_once_and_skips_frozen_ones():
    embedding = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = embedding.weight  # tied, as the target embedding and the output projection (paper 3.4)
    frozen = torch.nn.Linear(4, 4)
    frozen.requires_grad_(False)
    model = torch.nn.ModuleList([embedding, head, frozen])
    assert count_parameters(model) == 40
    assert math.prod(embedding.weight.shape) == 40


def test_precision_auto_follows_native_bf16(monkeypatch):
    monkeypatch.setattr(training, "native_bf16_cpu", lambda: (True, "CPU flags avx512_bf16"))
    assert training.choose_precision(on_cpu=True) == ("bf16", "CPU with native bf16 (CPU flags avx512_bf16)")
    monkeypatch.setattr(training, "native_bf16_cpu", lambda: (False, "no avx512_bf16/amx_bf16/bf16 CPU flag"))
    precision, reason = training.choose_precision(on_cpu=True)
    assert precision == "fp32" and "without native bf16" in reason and "3x slower" in reason


def test_native_bf16_reads_the_cpu_flags():
    native, evidence = training.native_bf16_cpu()
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        flags = set(" ".join(line for line in handle if line.startswith("flags")).split())
    assert native == bool(flags & {"avx512_bf16", "amx_bf16"})
    if native:  # the flags found, named
        assert evidence.startswith("CPU flags ")
        assert all((flag in evidence) == (flag in flags) for flag in ("avx512_bf16", "amx_bf16"))
    else:  # the flags it looked for, named as missing
        assert evidence == "no avx512_bf16/amx_bf16/bf16 CPU flag"


def fake_budget(monkeypatch, minutes):
    clock = [0.0]
    monkeypatch.setattr(WallClockBudgetCallback, "clock", staticmethod(lambda: clock[0]))
    budget = WallClockBudgetCallback(max_minutes=minutes)
    budget.on_train_begin(SimpleNamespace(world_size=1), TrainerState(), TrainerControl())
    return budget, clock


@pytest.mark.parametrize("kind", ["linear", "cosine"])
def test_budget_schedule_warms_up_and_decays_on_the_clock(monkeypatch, kind):
    """Warm-up over the first 30% of the training time, decay to 0 when the budget runs out, at any step rate."""
    budget, clock = fake_budget(monkeypatch, minutes=1.0)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    scheduler = training.budget_schedule(optimizer, kind, 0.3, budget)
    args, state = SimpleNamespace(world_size=1), TrainerState()
    seen = {}
    for seconds in (0, 9, 18, 30, 45, 59.4, 60):
        clock[0] = seconds
        budget.on_step_end(args, state, TrainerControl())
        scheduler.step()
        seen[seconds] = optimizer.param_groups[0]["lr"]
    assert seen[0] == 0 and seen[9] == pytest.approx(0.5e-3) and seen[18] == pytest.approx(1e-3)
    assert seen[30] < 1e-3 and seen[45] < seen[30] and seen[59.4] < 0.05e-3 and seen[60] == pytest.approx(0)
    if kind == "linear":
        assert seen[45] == pytest.approx(1e-3 * 15 / 42)


def test_budget_schedule_refuses_warmup_in_steps_or_a_stepless_schedule(monkeypatch):
    budget, _ = fake_budget(monkeypatch, minutes=1.0)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1e-3)
    with pytest.raises(ValueError, match="fraction of the training-time budget"):
        training.budget_schedule(optimizer, "linear", 800, budget)
    with pytest.raises(ValueError, match="cannot follow the training-time budget"):
        training.budget_schedule(optimizer, "reduce_lr_on_plateau", 0.1, budget)


def test_budget_clock_travels_in_the_checkpoint(monkeypatch):
    """The callback's state (saved in trainer_state.json) restores the training time on resume."""
    budget, clock = fake_budget(monkeypatch, minutes=1.0)
    clock[0] = 42.0
    saved = budget.state()
    assert saved["attributes"]["training_seconds"] == pytest.approx(42.0)
    resumed = WallClockBudgetCallback(max_minutes=1.0)
    state = TrainerState(stateful_callbacks={"WallClockBudgetCallback": saved})
    clock[0] = 1000.0  # another process, another clock
    resumed.on_train_begin(SimpleNamespace(world_size=1), state, TrainerControl())
    assert resumed.progress() == pytest.approx(0.7)
    clock[0] = 1018.0
    control = resumed.on_step_end(SimpleNamespace(world_size=1), state, TrainerControl())
    assert control.should_training_stop and resumed.training_seconds == pytest.approx(60.0)


def test_budget_leaves_out_checkpoint_saving(monkeypatch):
    """The time from a step's end to the end of its checkpoint save (logging, evaluation, saving) is not
    training time; the time of the next step is."""
    budget, clock = fake_budget(monkeypatch, minutes=1.0)
    args, control = SimpleNamespace(world_size=1), TrainerControl()
    state = SimpleNamespace(stateful_callbacks=None, global_step=1)
    clock[0] += 0.05  # a step
    budget.on_step_end(args, state, control)
    assert budget.elapsed() == pytest.approx(0.05)
    clock[0] += 0.3  # the save
    budget.on_save(args, state, control)
    assert budget.elapsed() == pytest.approx(0.05)
    clock[0] += 0.2  # the next step
    budget.on_step_end(args, state, control)
    assert budget.elapsed_at_last_step == pytest.approx(0.25)


def test_budget_leaves_out_a_pause(monkeypatch):
    """Time stopped by SIGTSTP (Ctrl-Z) is not training time: 10 s trained, 100 s paused, 5 s trained is 15 s."""
    budget, clock = fake_budget(monkeypatch, minutes=1.0)
    args, state = SimpleNamespace(world_size=1), TrainerState()
    clock[0] += 10
    budget.on_step_end(args, state, TrainerControl())

    def stopped_for_100_s():
        clock[0] += 100

    assert budget.pause(stop=stopped_for_100_s) == pytest.approx(100)
    clock[0] += 5
    control = budget.on_step_end(args, state, TrainerControl())
    assert budget.training_seconds == pytest.approx(15) and not control.should_training_stop
    assert budget.progress() == pytest.approx(15 / 60)


def test_a_pause_during_evaluation_or_saving_is_left_out_once(monkeypatch):
    """eval_runtime and the save window hold the pause too; it must not be subtracted twice (the clock would then
    run behind the training done, and the decay overshoot the budget)."""
    budget, clock = fake_budget(monkeypatch, minutes=1.0)
    args, state = SimpleNamespace(world_size=1), TrainerState()
    clock[0] += 10
    budget.on_step_end(args, state, TrainerControl())  # 10 s trained

    def stopped_for_20_s():
        clock[0] += 20

    clock[0] += 5  # the evaluation: 5 s, a 20 s pause, 5 s more; HF reports 30 s
    budget.pause(stop=stopped_for_20_s)
    clock[0] += 5
    budget.on_evaluate(args, state, TrainerControl(), metrics={"eval_runtime": 30.0})
    assert budget.elapsed() == pytest.approx(10)
    clock[0] += 2  # saving, with a 7 s pause
    budget.pause(stop=lambda: clock.__setitem__(0, clock[0] + 7))
    budget.on_save(args, state, TrainerControl())
    assert budget.elapsed() == pytest.approx(10)
    clock[0] += 4  # the next step
    budget.on_step_end(args, state, TrainerControl())
    assert budget.training_seconds == pytest.approx(14)


PAUSED_CHILD = """
import sys, time
from types import SimpleNamespace
from transformers import TrainerControl, TrainerState
from scratch_transformer.training import WallClockBudgetCallback

budget = WallClockBudgetCallback(max_minutes=1.0)
args, state = SimpleNamespace(world_size=1), TrainerState()
began = time.perf_counter()  # before the budget's clock starts: wall >= training time + pauses, however slow
budget.on_train_begin(args, state, TrainerControl())
print("training", flush=True)
while time.perf_counter() - began < float(sys.argv[1]):  # steps of 10 ms of wall time
    time.sleep(0.01)
    budget.on_step_end(args, state, TrainerControl())
budget.on_train_end(args, state, TrainerControl())
import signal
print(time.perf_counter() - began, budget.training_seconds, budget.paused,
      signal.getsignal(signal.SIGTSTP) is signal.SIG_DFL, flush=True)
"""


@pytest.mark.skipif(not hasattr(__import__("signal"), "SIGTSTP") or not os.path.isdir("/proc/self"),
                    reason="needs POSIX job control and /proc")
def test_sigtstp_pauses_a_training_process_without_spending_its_budget():
    """A real process: SIGTSTP stops it (its own handler sends SIGSTOP), SIGCONT continues it, and the 1.5 s it
    was stopped are not in its training time; after training SIGTSTP has its default action back."""
    import signal
    import subprocess
    import sys
    import time

    from benchmarks.quality import _is_stopped

    child = subprocess.Popen([sys.executable, "-c", PAUSED_CHILD, "3"], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "training"
        time.sleep(0.5)
        child.send_signal(signal.SIGTSTP)
        deadline = time.perf_counter() + 10
        while not _is_stopped(child.pid):
            assert time.perf_counter() < deadline, "the process did not stop"
            time.sleep(0.01)
        time.sleep(1.5)
        assert _is_stopped(child.pid)  # still stopped: nothing continued it
        child.send_signal(signal.SIGCONT)
        wall, trained, paused, default_again = child.stdout.readline().split()
    finally:
        child.kill()
        child.wait()
    assert float(paused) >= 1.5
    # training time is what the wall clock saw less the pause (the last step's end comes before `wall` is read)
    assert float(trained) <= float(wall) - float(paused) + 1e-6
    assert default_again == "True"
