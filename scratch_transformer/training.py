"""Training pieces around HF's Trainer: the paper's schedule and optimiser, a wall-clock budget,
checkpoint averaging (paper 6.1) and the training-curve plot."""

import json
import logging
import math
import os
import time
from collections.abc import Sequence

import torch
from safetensors.torch import load_file
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


def noam_learning_rate(step: int, d_model: int, warmup_steps: int, factor: float = 1.0) -> float:
    """The paper's eq. 3 at a given 1-based step (for tests and plots)."""
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup_steps**-1.5)


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


def _load_checkpoint_weights(folder: str) -> dict[str, torch.Tensor]:
    path = os.path.join(folder, "model.safetensors")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {folder} has no model.safetensors (incomplete or corrupt checkpoint)")
    return load_file(path)


def average_checkpoints(folders: Sequence[str]) -> dict[str, torch.Tensor]:
    """Element-wise mean of the weights of several checkpoints (paper 6.1: "averaging the last 5 checkpoints").

    Args:
        folders: checkpoint folders, each with a model.safetensors of the same keys and shapes.
    Returns:
        a state dict of float tensors (same keys as the checkpoints).
    Raises:
        ValueError: no folders, or keys/shapes that differ; FileNotFoundError: a folder without weights.
    """
    if not folders:
        raise ValueError("average_checkpoints needs at least one checkpoint folder")
    total = None
    for folder in folders:
        weights = _load_checkpoint_weights(folder)
        if total is None:
            total = {k: v.double().clone() for k, v in weights.items()}
            reference = folder
            continue
        if weights.keys() != total.keys():
            raise ValueError(f"checkpoint {folder} has different weights than {reference}")
        for key, value in weights.items():
            if value.shape != total[key].shape:
                raise ValueError(f"{key} has shape {tuple(value.shape)} in {folder}, {tuple(total[key].shape)} "
                                 f"in {reference}")
            total[key] += value.double()
    return {k: (v / len(folders)).float() for k, v in total.items()}


def sorted_checkpoints(output_dir: str) -> list[str]:
    """`checkpoint-N` folders in output_dir, by step N ascending."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        if name.startswith("checkpoint-") and name.split("-")[-1].isdigit():
            found.append((int(name.split("-")[-1]), os.path.join(output_dir, name)))
    return [path for _, path in sorted(found)]


def is_complete_safetensors(path: str) -> bool:
    """True when a .safetensors file is whole: its JSON header parses and the file holds every byte the
    header indexes (a file cut short by a crash fails this; the tensors themselves are not read)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            if header_size <= 0 or 8 + header_size > size:
                return False
            header = json.loads(handle.read(header_size))
        end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False
    return size >= 8 + header_size + end


def is_complete_checkpoint(folder: str) -> bool:
    """True when a Trainer checkpoint finished writing: whole weights, and trainer_state.json (written
    last by Trainer._save_checkpoint) parses."""
    state = os.path.join(folder, "trainer_state.json")
    if not is_complete_safetensors(os.path.join(folder, "model.safetensors")) or not os.path.isfile(state):
        return False
    try:
        with open(state, encoding="utf-8") as handle:
            json.load(handle)
    except (OSError, ValueError):  # unreadable, not UTF-8 or not JSON
        return False
    return True


def last_complete_checkpoint(output_dir: str, remove_incomplete: bool = False) -> str | None:
    """The newest checkpoint in output_dir that finished writing, or None.

    A run killed while saving leaves a half-written `checkpoint-N`; with `remove_incomplete`
    such folders newer than the last complete one are deleted (their step is trained again), so
    that neither HF's resume nor its checkpoint rotation ever reads them.
    """
    checkpoints = sorted_checkpoints(output_dir)
    for folder in reversed(checkpoints):
        if is_complete_checkpoint(folder):
            return folder
        logger.warning("checkpoint %s is incomplete (interrupted while saving)%s", folder,
                       "; removing it" if remove_incomplete else "")
        if remove_incomplete:
            import shutil

            shutil.rmtree(folder)
    return None


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


def is_finite_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)
