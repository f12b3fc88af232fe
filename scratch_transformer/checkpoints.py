"""Trainer checkpoints on disk: which are complete, which to resume from, averaging them (paper 6.1).

A run killed while saving leaves a half-written `checkpoint-N`; a folder handed to --resume_from_checkpoint
may be a finished model, a checkpoint of another architecture or a damaged one. Every check here only
looks, and raises ValueError naming the folder and the file, before anything is loaded or written.
"""

import datetime
import hashlib
import json
import logging
import os
import shutil
import weakref
from collections.abc import Sequence

import torch
from safetensors.torch import load_file

from .paths import is_complete_safetensors  # noqa: F401  (checked here; kept importable from this module)

logger = logging.getLogger(__name__)


def sorted_checkpoints(output_dir: str) -> list[str]:
    """`checkpoint-N` folders in output_dir, by step N ascending."""
    if not os.path.isdir(output_dir):
        return []
    found = []
    for name in os.listdir(output_dir):
        if name.startswith("checkpoint-") and name.split("-")[-1].isdigit():
            found.append((int(name.split("-")[-1]), os.path.join(output_dir, name)))
    return [path for _, path in sorted(found)]


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
            shutil.rmtree(folder)
    return None


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


def check_resume_checkpoint(checkpoint: str, model=None, needs_tokenizer: bool = False) -> None:
    """A checkpoint to resume must be complete (and, given the model, match it); raise naming the path and field.

    Called before anything is loaded from it, and again with the model once it is built.

    Raises:
        ValueError: a missing file (config.json, model.safetensors, trainer_state.json, tokenizer.json when
            needed), no optimizer/scheduler state (a finished model), JSON that does not parse, truncated
            weights, or an architecture field that differs from the model's.
    """
    needed = ["config.json", "model.safetensors", "trainer_state.json"]
    needed += ["tokenizer.json"] if needs_tokenizer else []
    missing = [name for name in needed if not os.path.isfile(os.path.join(checkpoint, name))]
    if missing:
        raise ValueError(f"checkpoint {checkpoint} is incomplete or corrupt: missing {', '.join(missing)}")
    names = os.listdir(checkpoint)
    if not any(name.startswith("optimizer") for name in names) or not any(name.startswith("scheduler")
                                                                          for name in names):
        raise ValueError(f"{checkpoint} holds no optimizer or scheduler state (optimizer.pt, scheduler.pt): it is a "
                         "finished model, not a training checkpoint, and a resumed run would restart Adam and the "
                         f"schedule from zero. To train on from its weights, pass --model_name_or_path {checkpoint} "
                         "(a fine-tune: new optimizer and schedule); to resume, give a checkpoint-N folder")
    saved = {}
    for name in ("config.json", "trainer_state.json"):
        try:
            with open(os.path.join(checkpoint, name), encoding="utf-8") as handle:
                saved[name] = json.load(handle)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"checkpoint {checkpoint}: {name} is not valid JSON ({error})") from error
        if not isinstance(saved[name], dict):
            raise ValueError(f"checkpoint {checkpoint}: {name} does not hold a JSON object")
    if not is_complete_safetensors(os.path.join(checkpoint, "model.safetensors")):
        raise ValueError(f"checkpoint {checkpoint}: model.safetensors is truncated or corrupt")
    if model is None:
        return
    config = saved["config.json"]
    for key in ("vocab_size", "d_model", "num_heads", "encoder_layers", "decoder_layers", "d_ff",
                "share_encoder_decoder_embeddings", "pre_layer_norm"):
        if key in config and config[key] != getattr(model.config, key):
            raise ValueError(f"checkpoint {checkpoint} does not match the model: config field {key} is "
                             f"{config[key]!r} there but {getattr(model.config, key)!r} here")


def lock_folder() -> str:
    """Where `lock_output_dir` keeps its lock files: $XDG_CACHE_HOME/scratch_transformer/locks, by default
    ~/.cache/scratch_transformer/locks (the user's own, unlike a shared temporary folder)."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "scratch_transformer", "locks")


_HELD_LOCKS = weakref.WeakSet()  # the open lock files of lock_output_dir in this process (a closed one drops out)


def _drop_inherited_locks() -> None:
    """In a child made by fork (DataLoader workers, multiprocessing), let go of the parent's output-folder locks.

    A forked child shares each open file, and with it the flock, until it ends: after a kill -9 of a run its
    workers would keep its folder locked. /dev/null is put over each lock file's descriptor (rather than closing it)
    so that the number stays taken: the parent's file objects, copied into the child, can never close another file
    of the child that reused it. Only a handle still open on its lock file is touched (a number the parent closed
    and reused for another file is left alone)."""
    held = [handle for handle in _HELD_LOCKS if not handle.closed]
    _HELD_LOCKS.clear()
    if not held:
        return
    null = os.open(os.devnull, os.O_RDONLY)
    for handle in held:
        try:
            if os.path.samestat(os.fstat(handle.fileno()), handle.lock_stat):
                os.dup2(null, handle.fileno())  # drops the child's share of the lock file (and with it of the flock)
        except (OSError, ValueError):
            pass
    os.close(null)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drop_inherited_locks)


def lock_output_dir(output_dir: str):
    """An exclusive lock on output_dir for one run, held until `unlock_output_dir` or the process's end (the OS
    releases it however the process ends: a kill, a crash).

    Two training runs into one folder would resume from the same checkpoint and train beside each other into the
    same checkpoints, each rotating the other's away. The lock is a file in the user's cache folder (`lock_folder`)
    named after output_dir's absolute, resolved path (nothing is written into output_dir, which is pushed to the
    Hub as it is), so any path spelling of one folder takes the same lock, whatever TMPDIR each run has; it guards
    the runs of one user (one home folder). A child made by fork (DataLoader workers) does not share the lock
    (`_drop_inherited_locks`), so a killed run's folder is free at once even while its workers still run down.
    Only the process that saves takes it: under torchrun / accelerate that is rank 0, and the other ranks of the
    same run follow it.

    Args:
        output_dir: the run's output folder (need not exist yet).
    Returns:
        the open lock file, for `unlock_output_dir`; None where the OS has no flock (Windows) or the cache
        folder takes no file (a warning is logged): no lock there.
    Raises:
        ValueError: another process holds the lock on output_dir; the message gives its pid and start time.
    """
    try:
        import fcntl
    except ImportError:  # not POSIX
        return None
    path = os.path.realpath(os.path.abspath(output_dir))
    folder = lock_folder()
    name = hashlib.sha256(path.encode("utf-8")).hexdigest()[:32] + ".lock"
    lock_path = os.path.join(folder, name)
    for _ in range(10):  # a holder may remove the file between our open and our lock: then open the new one
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            # O_NOFOLLOW: a link planted under the lock's name is refused, not followed and overwritten
            descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
            handle = os.fdopen(descriptor, "a+", encoding="utf-8")
        except OSError as error:  # a read-only or full cache folder: train unguarded rather than not at all
            logger.warning("output_dir %s is not locked against a second run (%s)", output_dir, error)
            return None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "a process that did not say its pid"
            handle.close()
            raise ValueError(f"output_dir {output_dir} is in use by another run ({holder}): two runs would train "
                             "into the same checkpoints. Wait for it to end or stop it (kill PID; a job started in "
                             "the background by a script ignores Ctrl-C), or choose another --output_dir") from None
        try:
            current = os.path.samestat(os.fstat(handle.fileno()), os.stat(lock_path, follow_symlinks=False))
        except FileNotFoundError:
            current = False
        if current:
            break
        handle.close()
    else:
        logger.warning("output_dir %s is not locked against a second run (its lock file kept changing)", output_dir)
        return None
    handle.seek(0)
    handle.truncate()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    handle.write(f"pid {os.getpid()}, started {started}, {path}\n")
    handle.flush()
    handle.lock_path, handle.lock_pid, handle.lock_stat = lock_path, os.getpid(), os.fstat(handle.fileno())
    _HELD_LOCKS.add(handle)
    return handle


def unlock_output_dir(handle) -> None:
    """Release a lock from `lock_output_dir` (None: nothing to release) and remove its file (a run that was killed
    leaves the file, unlocked, for the next run to take)."""
    if handle is not None and not handle.closed:
        _HELD_LOCKS.discard(handle)
        if handle.lock_pid == os.getpid():  # not in a forked child, whose copy holds nothing: the file is the run's
            try:
                os.unlink(handle.lock_path)  # while still locked: a run that opened it now finds it gone, opens anew
            except FileNotFoundError:
                pass
        handle.close()  # closing the file releases the flock (in a forked child: closes its /dev/null)


# what an evaluation-only run (do_train false) writes into its output folder; never the model, tokenizer or curve
EVALUATION_OUTPUTS = ("README.md", "all_results.json", "eval_results.json", "test_results.json",
                      "generated_predictions.txt")


def evaluation_outputs_in(output_dir: str) -> list[str]:
    """The files of output_dir that an evaluation-only run would replace (EVALUATION_OUTPUTS and the
    generated_predictions_{split}.txt of further test splits), in that order."""
    names = set(os.listdir(output_dir))
    extra = sorted(name for name in names if name.startswith("generated_predictions_") and name.endswith(".txt"))
    return [name for name in EVALUATION_OUTPUTS if name in names] + extra


def resume_checkpoint_in(training_args) -> str | None:
    """Resume from the last complete checkpoint in output_dir, or refuse to overwrite a finished run.

    Only looks: half-written checkpoints are removed later, by `remove_incomplete_checkpoints`, once
    every check has passed (a failing start leaves the folder as it was).

    Returns:
        the checkpoint folder to resume from, or None for a fresh start.
    Raises:
        ValueError: output_dir is a file; resume_from_checkpoint is not a folder; an evaluation-only run into a
            folder with files (without overwrite_output_dir); a training run into a non-empty folder without a
            checkpoint.
    """
    if os.path.exists(training_args.output_dir) and not os.path.isdir(training_args.output_dir):
        raise ValueError(f"output_dir {training_args.output_dir} is a file, not a folder: choose another --output_dir")
    if training_args.resume_from_checkpoint:
        if not os.path.isdir(training_args.resume_from_checkpoint):
            raise ValueError(f"resume_from_checkpoint {training_args.resume_from_checkpoint} is not a folder")
        return training_args.resume_from_checkpoint
    output_dir = training_args.output_dir
    if not training_args.do_train:
        if os.path.isdir(output_dir) and os.listdir(output_dir):
            replaced = evaluation_outputs_in(output_dir)
            named = ", ".join(replaced) if replaced else "none of its files (it adds its results beside them)"
            if not training_args.overwrite_output_dir:
                holds = "a model" if os.path.isfile(os.path.join(output_dir, "config.json")) else "files"
                raise ValueError(f"output_dir {output_dir} already holds {holds}: an evaluation-only run (do_train "
                                 f"false) would replace {named}. Choose a new --output_dir, or pass "
                                 "--overwrite_output_dir true to write there")
            logger.warning("evaluation-only run into %s (--overwrite_output_dir): replacing %s; its model, tokenizer "
                           "and training curve are kept", output_dir, named)
        return None
    if not os.path.isdir(output_dir):
        return None
    last = last_complete_checkpoint(output_dir)
    if last is not None:
        logger.info("resuming from %s (delete the output folder to start afresh)", last)
        return last
    half_written = {os.path.basename(folder) for folder in sorted_checkpoints(output_dir)}  # none is complete
    if set(os.listdir(output_dir)) - half_written:
        raise ValueError(f"output_dir {output_dir} already exists, is not empty and holds no checkpoint to resume "
                         "from: choose another folder or delete it")
    return None


def remove_incomplete_checkpoints(training_args) -> None:
    """Delete the checkpoints newer than the last complete one (a run killed while saving): their steps are
    trained again, and neither HF's resume nor its checkpoint rotation must ever read them."""
    if training_args.do_train and training_args.should_save and os.path.isdir(training_args.output_dir):
        last_complete_checkpoint(training_args.output_dir, remove_incomplete=True)
