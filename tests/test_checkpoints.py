"""scratch_transformer.checkpoints: complete or half-written checkpoints, resume checks, averaging (paper 6.1)."""

import json
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from scratch_transformer.checkpoints import (
    average_checkpoints,
    check_resume_checkpoint,
    is_complete_checkpoint,
    is_complete_safetensors,
    last_complete_checkpoint,
    lock_output_dir,
    remove_incomplete_checkpoints,
    resume_checkpoint_in,
    sorted_checkpoints,
    unlock_output_dir,
)

CONFIG = {"vocab_size": 10, "d_model": 4, "num_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 8}


def make_checkpoint(folder, weights=None, optimizer=True, state=None):
    """A Trainer-like checkpoint folder: weights, config, trainer state and (by default) optimizer/scheduler."""
    folder.mkdir(parents=True)
    save_file(weights or {"w": torch.ones(2, 3)}, folder / "model.safetensors")
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "trainer_state.json").write_text(json.dumps(state if state is not None else {"global_step": 1}))
    if optimizer:
        (folder / "optimizer.pt").write_bytes(b"x")
        (folder / "scheduler.pt").write_bytes(b"x")
    return folder


def args(output_dir, **overrides):
    values = dict(output_dir=str(output_dir), resume_from_checkpoint=None, do_train=True, should_save=True,
                  overwrite_output_dir=False)
    return SimpleNamespace(**{**values, **overrides})


def test_sorted_checkpoints_orders_by_step_not_by_name(tmp_path):
    for step in (100, 20, 3):
        (tmp_path / f"checkpoint-{step}").mkdir()
    (tmp_path / "checkpoint-last").mkdir()
    assert [p.rsplit("-", 1)[1] for p in sorted_checkpoints(str(tmp_path))] == ["3", "20", "100"]
    assert sorted_checkpoints(str(tmp_path / "missing")) == []


def test_a_safetensors_file_cut_short_is_incomplete(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"w": torch.arange(100.0)}, path)
    assert is_complete_safetensors(str(path))
    data = path.read_bytes()
    path.write_bytes(data[:-1])
    assert not is_complete_safetensors(str(path))
    path.write_bytes(data[:5])
    assert not is_complete_safetensors(str(path))


def test_last_complete_checkpoint_skips_and_removes_half_written_ones(tmp_path):
    make_checkpoint(tmp_path / "checkpoint-5")
    broken = make_checkpoint(tmp_path / "checkpoint-10")
    (broken / "trainer_state.json").write_text("{\"global_st")  # killed while writing the state (written last)
    assert not is_complete_checkpoint(str(broken))
    assert last_complete_checkpoint(str(tmp_path)).endswith("checkpoint-5")
    assert broken.exists()
    remove_incomplete_checkpoints(args(tmp_path))
    assert not broken.exists() and (tmp_path / "checkpoint-5").exists()


def test_average_is_the_elementwise_mean(tmp_path):
    folders = [make_checkpoint(tmp_path / f"checkpoint-{i}", {"w": torch.full((2, 2), float(i))}) for i in (1, 2, 6)]
    averaged = average_checkpoints([str(f) for f in folders])
    torch.testing.assert_close(averaged["w"], torch.full((2, 2), 3.0), rtol=0, atol=0)
    assert averaged["w"].dtype == torch.float32


def test_average_refuses_different_weights(tmp_path):
    a = make_checkpoint(tmp_path / "checkpoint-1", {"w": torch.zeros(2)})
    b = make_checkpoint(tmp_path / "checkpoint-2", {"w": torch.zeros(3)})
    c = make_checkpoint(tmp_path / "checkpoint-3", {"v": torch.zeros(2)})
    with pytest.raises(ValueError, match=r"w has shape \(3,\)"):
        average_checkpoints([str(a), str(b)])
    with pytest.raises(ValueError, match="different weights"):
        average_checkpoints([str(a), str(c)])
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])


def test_resume_check_names_what_is_missing_or_damaged(tmp_path):
    folder = make_checkpoint(tmp_path / "checkpoint-1")
    check_resume_checkpoint(str(folder))  # complete: no error
    with pytest.raises(ValueError, match="missing tokenizer.json"):
        check_resume_checkpoint(str(folder), needs_tokenizer=True)
    (folder / "config.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="config.json does not hold a JSON object"):
        check_resume_checkpoint(str(folder))


def test_a_finished_model_folder_is_not_a_checkpoint_to_resume(tmp_path):
    folder = make_checkpoint(tmp_path / "model", optimizer=False)
    with pytest.raises(ValueError, match=r"no optimizer or scheduler state.*--model_name_or_path"):
        check_resume_checkpoint(str(folder))


def test_resume_check_compares_the_architecture(tmp_path):
    folder = make_checkpoint(tmp_path / "checkpoint-1")
    model = SimpleNamespace(config=SimpleNamespace(**{**CONFIG, "d_model": 8, "share_encoder_decoder_embeddings": 1,
                                                      "pre_layer_norm": False}))
    with pytest.raises(ValueError, match="config field d_model is 4 there but 8 here"):
        check_resume_checkpoint(str(folder), model)


def test_a_training_run_resumes_from_the_last_complete_checkpoint_or_refuses_a_full_folder(tmp_path):
    assert resume_checkpoint_in(args(tmp_path / "new")) is None
    make_checkpoint(tmp_path / "run" / "checkpoint-4")
    assert resume_checkpoint_in(args(tmp_path / "run")).endswith("checkpoint-4")
    (tmp_path / "finished").mkdir()
    (tmp_path / "finished" / "model.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match="holds no checkpoint to resume from"):
        resume_checkpoint_in(args(tmp_path / "finished"))


def test_an_evaluation_refuses_a_folder_with_files_unless_asked(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="already holds a model.*--overwrite_output_dir"):
        resume_checkpoint_in(args(tmp_path, do_train=False))
    assert resume_checkpoint_in(args(tmp_path, do_train=False, overwrite_output_dir=True)) is None
    assert resume_checkpoint_in(args(tmp_path / "empty", do_train=False)) is None


HOLD_LOCK = """
import sys, time
from scratch_transformer.checkpoints import lock_output_dir
handle = lock_output_dir(sys.argv[1])
print("locked", flush=True)
time.sleep(120)
"""


def test_a_second_run_into_a_folder_another_process_writes_is_refused(tmp_path):
    pytest.importorskip("fcntl")
    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        assert not out.exists()  # nothing is written into the output folder itself
        (tmp_path / "link").symlink_to(tmp_path)
        for spelling in (out, f"{out}/", tmp_path / "link" / "run", tmp_path / "run" / ".." / "run"):
            with pytest.raises(ValueError, match=rf"in use by another run \(pid {holder.pid}, started .* UTC"):
                lock_output_dir(str(spelling))
        other = lock_output_dir(str(tmp_path / "other"))  # another folder is free
        unlock_output_dir(other)
    finally:
        holder.kill()
        holder.wait()
    mine = lock_output_dir(str(out))  # the lock went with the process that held it
    assert mine is not None
    with pytest.raises(ValueError, match="in use by another run"):  # a second run in this process too
        lock_output_dir(str(out))
    unlock_output_dir(mine)
    unlock_output_dir(mine)  # twice, or None: nothing happens
    unlock_output_dir(None)
    again = lock_output_dir(str(out))  # released: the folder can be locked again
    assert os.path.isfile(again.lock_path)
    unlock_output_dir(again)
    assert not os.path.exists(again.lock_path)  # a run that ends leaves no lock file behind


HOLD_LOCK_WITH_WORKER = """
import multiprocessing, sys, time
from scratch_transformer.checkpoints import lock_output_dir
handle = lock_output_dir(sys.argv[1])
worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,))  # as a DataLoader worker
worker.start()
print("locked", worker.pid, flush=True)
time.sleep(120)
"""


def test_a_killed_runs_forked_workers_do_not_keep_its_folder_locked(tmp_path):
    """A forked child (DataLoader worker) drops its share of the lock: kill -9 of the run frees the folder at once,
    while the worker still runs; the run itself keeps the lock while it lives."""
    pytest.importorskip("fcntl")
    import signal

    out = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK_WITH_WORKER, str(out)], stdout=subprocess.PIPE,
                              text=True)
    worker_pid = None
    try:
        word, worker_pid = holder.stdout.readline().split()
        worker_pid = int(worker_pid)
        assert word == "locked"
        with pytest.raises(ValueError, match=rf"in use by another run \(pid {holder.pid},"):  # held after the fork
            lock_output_dir(str(out))
        holder.kill()
        holder.wait()
        os.kill(worker_pid, 0)  # the worker is still alive (orphaned) ...
        mine = lock_output_dir(str(out))  # ... and the folder is free all the same
        assert mine is not None
        unlock_output_dir(mine)
    finally:
        holder.kill()
        holder.wait()
        if worker_pid is not None:
            try:
                os.kill(worker_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _in_forked_child(work) -> bytes:
    """Run work() in a child made by os.fork; return the bytes it returns (through a pipe)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        try:
            os.write(write_end, work())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        out = pipe.read()
    os.waitpid(pid, 0)
    return out


def test_the_fork_hook_touches_only_open_lock_files_and_a_child_never_unlocks_the_run(tmp_path, monkeypatch):
    pytest.importorskip("fcntl")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    # a lock file closed without unlock_output_dir: its number, reused by another file, is left alone in a child
    closed = lock_output_dir(str(tmp_path / "a"))
    number = closed.fileno()
    closed.close()
    data_file = tmp_path / "data.bin"
    data_file.write_bytes(b"payload")
    with open(data_file, "rb") as data:
        assert data.fileno() == number  # the freed number was reused
        assert _in_forked_child(lambda: data.read()) == b"payload"
    # a forked child that unlocks (a finally run down in a worker) neither frees nor removes the run's lock
    held = lock_output_dir(str(tmp_path / "b"))
    assert _in_forked_child(lambda: (unlock_output_dir(held), b"done")[1]) == b"done"
    assert os.path.isfile(held.lock_path)
    with pytest.raises(ValueError, match="in use by another run"):
        lock_output_dir(str(tmp_path / "b"))
    unlock_output_dir(held)
    assert not os.path.exists(held.lock_path)


def test_an_unwritable_cache_folder_leaves_the_run_unlocked_not_refused(tmp_path, monkeypatch, caplog):
    pytest.importorskip("fcntl")
    blocked = tmp_path / "not_a_folder"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocked))
    with caplog.at_level("WARNING"):
        assert lock_output_dir(str(tmp_path / "run")) is None
    assert "is not locked against a second run" in caplog.text


def test_the_lock_ignores_tmpdir_and_refuses_a_planted_link(tmp_path, monkeypatch):
    """Two runs with different TMPDIRs (a scheduler's per-job folders) still exclude each other; a link planted
    under the lock's name is not followed (the file it points to is left as it was)."""
    pytest.importorskip("fcntl")
    import hashlib
    import os

    from scratch_transformer.checkpoints import lock_folder

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    out = tmp_path / "run"
    env = dict(os.environ, TMPDIR=str(tmp_path))
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(ValueError, match=f"in use by another run \\(pid {holder.pid},"):
            lock_output_dir(str(out))
    finally:
        holder.kill()
        holder.wait()
    victim = tmp_path / "precious.txt"
    victim.write_text("precious content")
    planted = tmp_path / "planted"
    name = hashlib.sha256(os.path.realpath(str(planted)).encode("utf-8")).hexdigest()[:32] + ".lock"
    (tmp_path / "cache" / "scratch_transformer" / "locks" / name).symlink_to(victim)
    assert lock_folder() == str(tmp_path / "cache" / "scratch_transformer" / "locks")
    assert lock_output_dir(str(planted)) is None  # refused to follow the link: unlocked, with a warning
    assert victim.read_text() == "precious content"
