"""Training pieces around HF's Trainer: the paper's learning-rate peak (eq. 3), the precision that suits the
hardware, a training-time budget with a schedule laid out on it, a moving average of the weights, dropout that
rises with the epochs or follows the length of the run, the training-curve plot, parameter counting and atomic
JSON writes."""

import json
import logging
import os
import signal
import threading
import time

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

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

def native_bf16_cpu() -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively (x86 avx512_bf16 / amx_bf16, Arm FEAT_BF16), and the evidence.

    Without it, torch emulates bf16 matrix products and bf16 autocast trains about 3x slower than fp32 (a
    step of the main job's model: 1.78 s in bf16 against 0.56 s in fp32 on a 2-core Intel Xeon without it).
    """
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = {flag for line in handle if line.startswith(("flags", "Features")) for flag in line.split()}
    except OSError:  # not Linux: ask sysctl on macOS, else assume none
        import subprocess

        try:
            answer = subprocess.run(["sysctl", "-n", "hw.optional.arm.FEAT_BF16"], capture_output=True, text=True,
                                    timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            answer = ""
        return answer == "1", "sysctl hw.optional.arm.FEAT_BF16=" + (answer or "?")
    found = sorted(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    return bool(found), ("CPU flags " + ", ".join(found)) if found else "no avx512_bf16/amx_bf16/bf16 CPU flag"


def choose_precision(on_cpu: bool) -> tuple[str, str]:
    """The precision `--precision auto` trains in: bf16 autocast where the hardware computes bf16 natively
    (a GPU that supports it, a CPU with native bf16), where it trains faster than fp32; fp32 elsewhere.

    Returns:
        (precision, reason): "bf16" or "fp32", and why, for the log, all_results.json and the model card.
    """
    if not on_cpu and torch.cuda.is_available():
        if torch.cuda.is_bf16_supported():
            return "bf16", f"GPU {torch.cuda.get_device_name()} supports bf16"
        return "fp32", f"GPU {torch.cuda.get_device_name()} has no bf16 (fp16 is not chosen automatically)"
    native, evidence = native_bf16_cpu()
    if native:
        return "bf16", f"CPU with native bf16 ({evidence})"
    return "fp32", f"CPU without native bf16 ({evidence}): bf16 autocast would be emulated, about 3x slower"


class WallClockBudgetCallback(TrainerCallback, ExportableState):
    """Stops training once `max_minutes` of training time have passed; evaluation and checkpoint saving are not
    counted.

    A budget in time (not steps) makes a run fit the machine whatever its speed, and `budget_schedule`
    lays the learning-rate schedule on the same clock. The training time travels in each checkpoint
    (trainer_state.json, stateful_callbacks), so that a resumed run continues the clock where it stopped.
    With several processes the main process's clock decides for all (`elapsed_at_last_step`).

    A run paused with SIGTSTP (Ctrl-Z in a terminal, `kill -TSTP`) stops until SIGCONT (`fg`, `kill -CONT`), and
    the stopped time is left out of the clock as well, so that a pause does not cut the decay short: during
    training the callback handles SIGTSTP in the main thread (on POSIX, where no other handler is set) and
    stops the process itself. `benchmarks/quality.py` pauses its two runs in turn this way to give them the
    same machine.
    """

    @staticmethod
    def clock() -> float:
        """Seconds on a monotonic clock (time.perf_counter); tests replace it to give each step a known length."""
        return time.perf_counter()

    def __init__(self, max_minutes: float):
        if max_minutes <= 0:
            raise ValueError(f"max_minutes must be positive, got {max_minutes}")
        self.max_seconds = max_minutes * 60.0
        self.start = None
        self.excluded = 0.0
        self.offset = 0.0  # training seconds of the run before a resume
        self.training_seconds = 0.0
        self.elapsed_at_last_step = 0.0  # the same on every process
        self._step_end, self._excluded_at_step_end = None, 0.0
        self.paused = 0.0  # seconds stopped by SIGTSTP during training
        self._pauses: list[tuple[float, float]] = []  # (stopped, resumed) since the last step's end
        self._previous_sigtstp = None

    def state(self) -> dict:  # ExportableState: saved in every checkpoint's trainer_state.json
        return {"args": {"max_minutes": self.max_seconds / 60}, "attributes": {"training_seconds": self.elapsed()}}

    def elapsed(self) -> float:
        """Training seconds so far (this process's clock), evaluation excluded, earlier run segments included."""
        if self.start is None:
            return self.offset
        return self.offset + self.clock() - self.start - self.excluded - self.paused

    def progress(self) -> float:
        """Fraction of the budget used at the end of the last step, in [0, 1] (the same on every process)."""
        return min(self.elapsed_at_last_step / self.max_seconds, 1.0)

    def on_train_begin(self, args, state, control, **kwargs):
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[-1] if saved else None
        self.offset = float(saved["attributes"]["training_seconds"]) if saved else 0.0
        if self.offset > 0:  # a fresh run's state holds the callback too, with 0 s
            logger.info("resuming the training-time budget at %.1f of %.1f min", self.offset / 60,
                        self.max_seconds / 60)
        self.start, self.excluded, self.paused, self._pauses = self.clock(), 0.0, 0.0, []
        self._step_end, self._excluded_at_step_end = None, 0.0
        self.training_seconds = self.elapsed_at_last_step = self.offset
        self._handle_sigtstp()

    def on_train_end(self, args, state, control, **kwargs):
        self._release_sigtstp()

    def pause(self, stop=None) -> float:
        """Stop this process until it is continued, and leave the stopped time out of the clock (SIGTSTP's
        handler during training). `stop` (tests) replaces the SIGSTOP the process sends itself.

        Returns:
            the seconds the process was stopped.
        """
        stopped = self.clock()
        (stop or (lambda: os.kill(os.getpid(), signal.SIGSTOP)))()  # returns once SIGCONT has come
        resumed = self.clock()
        self.paused += resumed - stopped
        self._pauses.append((stopped, resumed))
        logger.info("paused for %.1f s (left out of the training time)", resumed - stopped)
        return resumed - stopped

    def _paused_within(self, begin: float, end: float) -> float:
        """Seconds of the pauses since the last step's end that fall between the clock readings begin and end."""
        return sum(max(0.0, min(end, resumed) - max(begin, stopped)) for stopped, resumed in self._pauses)

    def _handle_sigtstp(self) -> None:
        if not hasattr(signal, "SIGTSTP") or threading.current_thread() is not threading.main_thread():
            return  # no job control (Windows), or signal handlers cannot be set from here
        if signal.getsignal(signal.SIGTSTP) is not signal.SIG_DFL:
            return  # ignored, or handled by the program around the Trainer: leave it as it is
        self._previous_sigtstp = signal.signal(signal.SIGTSTP, lambda signum, frame: self.pause())

    def _release_sigtstp(self) -> None:
        if self._previous_sigtstp is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTSTP, self._previous_sigtstp)
            self._previous_sigtstp = None

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # eval_runtime counts a pause during the evaluation too, which `paused` already leaves out
        runtime, now = float((metrics or {}).get("eval_runtime", 0.0)), self.clock()
        self.excluded += max(0.0, runtime - self._paused_within(now - runtime, now))

    def on_save(self, args, state, control, **kwargs):
        # Saving a checkpoint is no training either: all the time since the step ended (logging, evaluation,
        # the save itself) is left out. Under load a save can take a large part of a short budget, which
        # would cut the decay short by the time it took.
        if self.start is not None and self._step_end is not None:
            now = self.clock()
            window = now - self._step_end - self._paused_within(self._step_end, now)  # pauses: in `paused`
            self.excluded = max(self.excluded, self._excluded_at_step_end + window)

    def on_step_end(self, args, state, control, **kwargs):
        self.training_seconds = self.elapsed()
        elapsed = self.training_seconds
        if args.world_size > 1:
            # The processes' clocks differ: one that stopped alone would leave the others waiting for it in
            # the next step's gradient all-reduce, and different learning rates would split the replicas.
            # The main process decides for all.
            from accelerate.utils import broadcast_object_list

            elapsed = broadcast_object_list([elapsed], from_process=0)[0]
        self.elapsed_at_last_step = elapsed
        self._step_end, self._excluded_at_step_end = self.clock(), self.excluded
        self._pauses = []
        if elapsed >= self.max_seconds:
            logger.info("training-time budget of %.1f min reached at step %d", self.max_seconds / 60,
                        state.global_step)
            control.should_training_stop = True
            control.should_save = True
        return control


EMA_WEIGHTS_NAME = "ema.safetensors"  # in each checkpoint-N folder, beside model.safetensors


class ExponentialMovingAverageCallback(TrainerCallback):
    """An exponential moving average of the trainable weights, updated after every optimizer step (Polyak
    averaging; the continuous cousin of the paper's checkpoint averaging, 6.1).

    After step t: ema <- d_t * ema + (1 - d_t) * weights, with d_t = min(decay, (1 + t) / (10 + t)) (the
    warm-up of TensorFlow's ExponentialMovingAverage(num_updates)), so the first steps' random weights fade
    quickly. The average is kept in float32 on the weights' device (one more copy of the parameters) and saved
    in every checkpoint as `ema.safetensors`; a resumed run continues it from there (from the resumed weights,
    with a warning, when the checkpoint has none). The model keeps training on its own weights: `load_into`
    puts the average into a model at the end.

    Args:
        decay: the per-step decay in (0, 1), e.g. 0.999 (an average over about 1 / (1 - decay) steps).
        resume_from: the checkpoint folder the run resumes from, or None.
    Raises:
        ValueError: decay outside (0, 1).
    """

    def __init__(self, decay: float, resume_from: str | None = None):
        if not 0 < decay < 1:
            raise ValueError(f"ema_decay must be in (0, 1) (e.g. 0.999), got {decay}")
        self.decay, self.resume_from = decay, resume_from
        self.shadow: dict[str, torch.Tensor] | None = None

    @staticmethod
    def _trainable(model) -> dict[str, torch.nn.Parameter]:
        return {name: p for name, p in model.named_parameters() if p.requires_grad}  # tied weights once

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        params = self._trainable(model)
        saved = os.path.join(self.resume_from, EMA_WEIGHTS_NAME) if self.resume_from else None
        if saved and os.path.isfile(saved):
            from safetensors.torch import load_file

            loaded = load_file(saved)
            if loaded.keys() != params.keys() or any(loaded[k].shape != p.shape for k, p in params.items()):
                raise ValueError(f"{saved} does not hold the model's trainable weights (different names or shapes)")
            self.shadow = {k: loaded[k].to(device=p.device, dtype=torch.float32) for k, p in params.items()}
            logger.info("resuming the moving average of the weights from %s", saved)
            return
        if saved:
            logger.warning("%s has no %s: the moving average of the weights restarts from the resumed weights",
                           self.resume_from, EMA_WEIGHTS_NAME)
        self.shadow = {k: p.detach().to(torch.float32, copy=True) for k, p in params.items()}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        decay = min(self.decay, (1 + step) / (10 + step))
        names = list(self.shadow)
        params = self._trainable(model)
        torch._foreach_lerp_([self.shadow[k] for k in names], [params[k].detach().float() for k in names],
                             1.0 - decay)

    def on_save(self, args, state, control, **kwargs):
        if not args.should_save or self.shadow is None:
            return
        from safetensors.torch import save_file
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        if os.path.isdir(folder):  # written whole or not at all: a resume never reads half an average
            tmp = os.path.join(folder, EMA_WEIGHTS_NAME + ".tmp")
            save_file({k: v.contiguous().cpu() for k, v in self.shadow.items()}, tmp)
            os.replace(tmp, os.path.join(folder, EMA_WEIGHTS_NAME))

    def load_into(self, model) -> None:
        """Copy the average into `model`'s trainable weights (in their dtype); buffers are left as they are."""
        with torch.no_grad():
            for name, param in self._trainable(model).items():
                param.copy_(self.shadow[name])


def config_dropout_modules(model, option: str) -> tuple[float, list[torch.nn.Dropout]]:
    """The model's `config.dropout` and its `nn.Dropout` modules at that p (ours: the embedding and sublayer
    dropouts of paper 5.4; attention dropout is a float handed to the attention kernel, not a module).

    Raises:
        ValueError: the model has no such module (e.g. transformers' Marian, whose layers call F.dropout);
            the message names `option`, the flag that asked to set them.
    """
    base = float(getattr(model.config, "dropout", float("nan")))
    modules = [m for m in model.modules() if isinstance(m, torch.nn.Dropout) and m.p == base]
    if not modules:
        raise ValueError(f"{option} sets the p of the model's nn.Dropout modules at config.dropout ({base}), and "
                         f"this {type(model).__name__} has none (its layers may call F.dropout): leave "
                         f"--{option} at 0 for it")
    return base, modules


class LongRunDropoutCallback(TrainerCallback, ExportableState):
    """Stronger dropout for a run long enough to need it: the model's embedding and sublayer dropout (paper
    5.4) is raised from `config.dropout` to `long_run_dropout` when the run is planned or projected to make at
    least `min_epochs` passes over the training data, and left alone otherwise.

    How much dropout pays depends on how long the run is, and a training-time budget makes that depend on the
    machine: on Multi30k (29,000 pairs) our main job's model learns faster with 0.1 and overfits after about
    ten passes, where 0.2 regularises better. Measured with 25-minute runs (docs/results.md, the recipe
    study): 0.2 lost at 9 epochs (4029 steps; test_2016_flickr 38.95 against 40.14) and won at 17.5 and 20
    (val +1.25 and +1.15 BLEU, all six test-set differences positive).

    The decision is taken once. Without a budget, at the start, from the epochs planned (`num_train_epochs`,
    or `max_steps` over the steps per epoch). With a budget, after the first `decide_at` of it: the epochs
    done so far divided by the fraction of the budget used project the epochs the whole budget will make
    (the same on every process). The decision travels in the checkpoints (trainer_state.json,
    stateful_callbacks), so a resumed run keeps it; `config.dropout` is put back at the end of training, so
    the saved config is the model's own and the dropout trained with is in `summary()`.

    Args:
        model: the model to train (its `config.dropout` is the base value).
        long_run_dropout: the dropout of a long run, in [0, 1).
        min_epochs: the projected passes over the training data from which a run counts as long, > 0.
        budget: the run's training-time budget, or None for a run planned in steps or epochs.
        decide_at: the fraction of the budget after which the projection is made, in (0, 1).
    Raises:
        ValueError: a value out of range, or a model without `nn.Dropout` modules at `config.dropout`.
    """

    def __init__(self, model, long_run_dropout: float, min_epochs: float, budget=None, decide_at: float = 0.1):
        if not 0 <= long_run_dropout < 1:
            raise ValueError(f"long_run_dropout must be in [0, 1), got {long_run_dropout}")
        if not 0 < min_epochs < float("inf"):
            raise ValueError(f"long_run_min_epochs must be positive and finite, got {min_epochs}")
        if not 0 < decide_at < 1:
            raise ValueError(f"decide_at must be in (0, 1), got {decide_at}")
        self.base, self.modules = config_dropout_modules(model, "long_run_dropout")
        self.target, self.min_epochs, self.budget, self.decide_at = float(long_run_dropout), float(min_epochs), \
            budget, float(decide_at)
        self.projected_epochs: float | None = None  # None: not decided yet
        self.dropout = self.base
        self.decided_at_step: int | None = None

    def state(self) -> dict:  # ExportableState: saved in every checkpoint's trainer_state.json
        return {"args": {"long_run_dropout": self.target, "min_epochs": self.min_epochs},
                "attributes": {"projected_epochs": self.projected_epochs, "dropout": self.dropout,
                               "decided_at_step": self.decided_at_step}}

    def _set(self, p: float) -> None:
        for module in self.modules:
            module.p = p

    def _decide(self, projected_epochs: float, step: int) -> None:
        self.projected_epochs, self.decided_at_step = float(projected_epochs), int(step)
        self.dropout = self.target if projected_epochs >= self.min_epochs else self.base
        logger.info("%s %.1f epochs (long run: at least %g): dropout %g from step %d", "projected" if self.budget
                    else "planned", projected_epochs, self.min_epochs, self.dropout, step)
        self._set(self.dropout)

    def on_train_begin(self, args, state, control, **kwargs):
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[-1] if saved else None
        attributes = (saved or {}).get("attributes", {})
        if attributes.get("projected_epochs") is not None:  # a resumed run keeps the decision
            self.projected_epochs = float(attributes["projected_epochs"])
            self.dropout, self.decided_at_step = float(attributes["dropout"]), attributes.get("decided_at_step")
            logger.info("resuming with dropout %g (decided at step %s: %.1f epochs projected)", self.dropout,
                        self.decided_at_step, self.projected_epochs)
            self._set(self.dropout)
        elif self.budget is None:
            # HF's plan: max_steps over the steps per epoch, rounded up, or num_train_epochs rounded up; a
            # dataset of unknown length gets sys.maxsize epochs, and the run is not counted as long
            planned = float(state.num_train_epochs or 0)
            if planned >= 2**31:
                logger.warning("the planned number of epochs is unknown (a dataset without a length): dropout "
                               "stays %g (--long_run_dropout needs a budget or a planned length)", self.base)
                planned = 0.0
            self._decide(planned, state.global_step)

    def on_step_end(self, args, state, control, **kwargs):
        if self.projected_epochs is None and self.budget is not None:
            progress = self.budget.progress()
            if progress >= self.decide_at and state.epoch:
                self._decide(state.epoch / progress, state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self._set(self.base)

    def summary(self) -> dict:
        """The decision, for all_results.json and the model card."""
        return {"long_run_dropout": self.target, "long_run_min_epochs": self.min_epochs,
                "projected_epochs": None if self.projected_epochs is None else round(self.projected_epochs, 2),
                "final_dropout": self.dropout}


BUDGET_SCHEDULE_RESOLUTION = 1_000_000  # virtual steps over the budget: the schedule's shape at 1e-6 resolution


def budget_schedule(optimizer, scheduler_type, warmup_fraction: float, budget: WallClockBudgetCallback,
                    scheduler_kwargs: dict | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """HF's learning-rate schedule `scheduler_type`, laid out on the training-time budget instead of steps.

    The multiplier after each step is HF's own schedule (linear, cosine, inverse_sqrt, ...) evaluated at the
    fraction of the budget used so far (`budget.progress()`): warm-up covers the first `warmup_fraction` of the
    budget and the decay ends when the budget does, whatever the machine's speed or load.

    Raises:
        ValueError: for a schedule that is not a per-step multiplier (e.g. reduce_lr_on_plateau), or a
            warmup_fraction outside [0, 1).
    """
    from transformers import get_scheduler

    if not 0 <= warmup_fraction < 1:
        raise ValueError(f"with max_train_minutes, warmup_steps is a fraction of the training-time budget in "
                         f"[0, 1) (e.g. 0.3), got {warmup_fraction}; or pass --schedule_on_budget false")
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    shape = get_scheduler(scheduler_type, probe, num_warmup_steps=round(warmup_fraction * BUDGET_SCHEDULE_RESOLUTION),
                          num_training_steps=BUDGET_SCHEDULE_RESOLUTION, scheduler_specific_kwargs=scheduler_kwargs)
    if not isinstance(shape, torch.optim.lr_scheduler.LambdaLR):
        raise ValueError(f"lr_scheduler_type {scheduler_type} cannot follow the training-time budget; pass "
                         "--schedule_on_budget false")
    multiplier = shape.lr_lambdas[0]
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda _step: multiplier(round(budget.progress() * BUDGET_SCHEDULE_RESOLUTION)))


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
    from .paths import save_figure

    save_figure(fig, path, "training_curve", dpi=120)  # whole or not at all
    plt.close(fig)


def write_json(path: str, data: dict) -> None:
    """Write JSON atomically (`paths.atomic_write`: temp file + rename), so an interruption or a full disk never
    leaves half a file, nor a temporary one."""
    from .paths import atomic_write

    with atomic_write(path) as handle:
        json.dump(data, handle, indent=2, ensure_ascii=False)
        handle.write("\n")


def count_parameters(model: torch.nn.Module, trainable_only: bool = True) -> int:
    """Trainable parameters (all, frozen ones too, with trainable_only=False), each shared tensor counted once.

    Buffers are not parameters: our sinusoidal positions are a buffer, Marian's a frozen parameter, so the two
    models of the same size have the same trainable count and Marian the larger total.
    """
    seen, total = set(), 0
    for parameter in model.parameters():
        if (parameter.requires_grad or not trainable_only) and id(parameter) not in seen:
            seen.add(id(parameter))
            total += parameter.numel()
    return total
