"""Training pieces around HF's Trainer: the paper's learning-rate peak (eq. 3), a wall-clock budget,
the training-curve plot, parameter counting and atomic JSON writes."""

import json
import logging
import os
import time

import torch
from transformers import TrainerCallback

logger = logging.getLogger(__name__)


def noam_peak_learning_rate(d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """Peak of the paper's schedule (paper 5.3, eq. 3), reached at step `warmup_steps`.

    lrate = factor * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)

    HF's `lr_scheduler_type="inverse_sqrt"` with `warmup_steps=w` is exactly this curve when
    `learning_rate` is set to this peak: linear warmup to the peak, then peak * sqrt(w / step).

    Raises:
        ValueError: for non-positive d_model or warmup_steps.
    """
    if d_model <= 0 or warmup_steps <= 0:
        raise ValueError(f"d_model and warmup_steps must be positive, got {d_model} and {warmup_steps}")
    return factor * d_model**-0.5 * warmup_steps**-0.5

class WallClockBudgetCallback(TrainerCallback):
    """Stops training once `max_minutes` of training time have passed; evaluation time is not counted.

    A budget in time (not steps) makes a run fit the machine whatever its speed; with the Noam
    schedule, stopping early cuts no planned decay short.
    """

    def __init__(self, max_minutes: float):
        if max_minutes <= 0:
            raise ValueError(f"max_minutes must be positive, got {max_minutes}")
        self.max_seconds = max_minutes * 60.0
        self.start = None
        self.excluded = 0.0
        self.training_seconds = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.excluded += float((metrics or {}).get("eval_runtime", 0.0))

    def on_step_end(self, args, state, control, **kwargs):
        self.training_seconds = time.perf_counter() - self.start - self.excluded
        over_budget = self.training_seconds >= self.max_seconds
        if args.world_size > 1:
            # The processes' clocks differ: one that stopped alone would leave the others waiting for it in
            # the next step's gradient all-reduce. The main process decides for all.
            from accelerate.utils import broadcast_object_list

            over_budget = broadcast_object_list([over_budget], from_process=0)[0]
        if over_budget:
            logger.info("training-time budget of %.1f min reached at step %d", self.max_seconds / 60,
                        state.global_step)
            control.should_training_stop = True
            control.should_save = True
        return control

def plot_training_curve(log_history: list[dict], path: str, metric: str = "eval_bleu") -> None:
    """Training loss and validation BLEU by step, from `trainer.state.log_history`, as a PNG (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(e["step"], e["loss"]) for e in log_history if "loss" in e and "step" in e]
    evals = [(e["step"], e[metric]) for e in log_history if metric in e and "step" in e]
    fig, ax_loss = plt.subplots(figsize=(7, 4))
    if train:
        ax_loss.plot(*zip(*train), color="tab:blue", label="training loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("training loss (label-smoothed, nats/token)", color="tab:blue")
    if evals:
        ax_bleu = ax_loss.twinx()
        ax_bleu.plot(*zip(*evals), color="tab:orange", marker="o", label="validation BLEU")
        ax_bleu.set_ylabel("validation BLEU", color="tab:orange")
    ax_loss.set_title("Training curve")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_json(path: str, data: dict) -> None:
    """Write JSON atomically (temp file + rename), so an interruption never leaves half a file."""
    tmp = f"{path}.tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        json.dump(data, handle, indent=2, ensure_ascii=False)
        handle.write("\n")
    os.replace(tmp, path)


def count_parameters(model: torch.nn.Module) -> int:
    """Trainable parameters, each shared tensor counted once."""
    seen, total = set(), 0
    for parameter in model.parameters():
        if parameter.requires_grad and id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel()
    return total
