"""Scale-out and robustness of scripts/train_translation.py, with tiny models on the real Multi30k subset:
two processes (gloo, through `accelerate launch` and `torchrun`) against one, bf16 on the CPU, resuming
after SIGKILL (also past half-written checkpoints), and bad inputs that must fail before anything is written.
"""

import json
import logging
import random
import shutil
import socket
import subprocess
import sys

import pytest
import torch
from conftest import MULTI30K, REPO_ROOT
from helpers import (TINY, common_flags, kill_at_checkpoint, snapshot, steps_of_known_length_script, subprocess_env,
                     train_translation)
from safetensors.torch import load_file

from scratch_transformer.checkpoints import is_complete_checkpoint, is_complete_safetensors, last_complete_checkpoint

pytestmark = [
    pytest.mark.filterwarnings("ignore"),
    pytest.mark.skipif(not MULTI30K.is_dir(), reason="Multi30k not found beside the repo"),
]

SCRIPT = REPO_ROOT / "scripts" / "train_translation.py"
CPU_CONFIG = REPO_ROOT / "configs" / "accelerate_cpu_2proc.yaml"
STEPS = 6  # 1 process vs 2
RESUME = {"max_steps": 30, "save_strategy": "steps", "save_steps": 5, "save_total_limit": 3,
          "train_sampling_strategy": "group_by_length"}  # the main job's sampler: resume must replay its order

BASE = {
    "dataset_name": MULTI30K, "validation_split": "val", "test_split": "test_2016_flickr", "config_overrides": TINY,
    "vocab_size": 500, "max_train_samples": 64, "max_eval_samples": 16, "max_predict_samples": 16,
    "warmup_steps": 2, "learning_rate": 3e-3, "logging_steps": 1, "do_eval": False, "do_predict": False,
    "average_last_checkpoints": 0, "save_strategy": "no",
}


def flags(output_dir, **extra):
    """Command-line flags of a tiny, fast run; a value of None drops the flag."""
    values = {**BASE, **extra}
    return common_flags(output_dir, **{k: v for k, v in values.items() if v is not None})


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread per process, as torchrun gives each of its processes: the tiny model gains nothing
    from two, and two threads slow down tenfold when another job holds the cores."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run_command(args, log_path, timeout=300, **env):
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run([sys.executable, *map(str, args)], cwd=REPO_ROOT, env=subprocess_env(**env),
                              stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    if done.returncode != 0:
        pytest.fail(f"exit code {done.returncode}: {args}\n" + log_path.read_text(encoding="utf-8")[-4000:])


def free_port():
    """A free port below the ephemeral range, so that no outgoing connection takes it before the launcher binds it."""
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(20_000, 32_000)
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def accelerate_launch(script_flags, log_path):
    run_command(["-m", "accelerate.commands.launch", "--config_file", CPU_CONFIG, "--main_process_port", free_port(),
                 SCRIPT, *script_flags], log_path)


def log_steps(output_dir):
    """step -> the training log entry (loss, grad_norm, epoch, ...) of trainer_state.json; each step once."""
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    entries = [entry for entry in history if "loss" in entry]
    steps = [entry["step"] for entry in entries]
    assert len(steps) == len(set(steps)), f"steps logged twice: {steps}"
    return {entry["step"]: entry for entry in entries}


def assert_same_weights(folder_a, folder_b, skip=(), **tolerance):
    weights_a, weights_b = load_file(folder_a / "model.safetensors"), load_file(folder_b / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    for key in weights_a:
        if not key.endswith(skip):
            torch.testing.assert_close(weights_b[key], weights_a[key], **tolerance, msg=key)


def files_of(folder):
    return {str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()}


# ---------------------------------------------------------------- 1 process vs 2 processes (a)


@pytest.fixture(scope="module")
def one_and_two_processes(tmp_path_factory):
    """The same 6 steps: one process of batch 8, and two processes (accelerate launch, gloo) of batch 4 each."""
    root = tmp_path_factory.mktemp("scale_out")
    common = {"max_steps": STEPS, "save_strategy": "steps", "save_steps": 3}  # random sampling, same seed
    run_command([SCRIPT, *flags(root / "one", per_device_train_batch_size=8, **common)], root / "one.log")
    accelerate_launch(flags(root / "two", per_device_train_batch_size=4, **common), root / "two.log")
    return root / "one", root / "two"


def test_two_processes_train_like_one_process_with_the_global_batch(one_and_two_processes):
    one, two = one_and_two_processes
    logs_one, logs_two = log_steps(one), log_steps(two)
    assert sorted(logs_one) == sorted(logs_two) == list(range(1, STEPS + 1))
    print("\nstep  loss (1 x 8)  loss (2 x 4)  grad_norm (1 x 8)  grad_norm (2 x 4)")
    for step in logs_one:
        a, b = logs_one[step], logs_two[step]
        print(f"{step:4d}  {a['loss']:.6f}  {b['loss']:.6f}  {a['grad_norm']:.6f}  {b['grad_norm']:.6f}")
    for step in logs_one:
        a, b = logs_one[step], logs_two[step]
        assert b["epoch"] == pytest.approx(a["epoch"]), "the two processes did not each take half of the batch"
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), step
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3), step
    # The key projections' biases get no gradient but rounding noise (softmax ignores a shift shared by all
    # keys), which Adam normalises into steps of size ~lr: they differ with the summation order. The rest agrees.
    assert_same_weights(one, two, skip=("k_proj.bias",), rtol=1e-3, atol=1e-5)
    assert (one / "tokenizer.json").read_text() == (two / "tokenizer.json").read_text()
    # whether a run tokenised its splits or found them in the cache, no truncation state is saved with it
    assert json.loads((one / "tokenizer.json").read_text())["truncation"] is None


def test_two_process_run_writes_every_file_once(one_and_two_processes):
    one, two = one_and_two_processes
    top = {path.name for path in two.iterdir()}
    assert top == {path.name for path in one.iterdir()}, top ^ {path.name for path in one.iterdir()}
    assert {"all_results.json", "train_results.json", "trainer_state.json", "model.safetensors",
            "training_curve.png", "checkpoint-3", "checkpoint-6"} <= top
    for checkpoint in ("checkpoint-3", "checkpoint-6"):
        per_process_rng = {"rng_state_0.pth", "rng_state_1.pth"}
        assert files_of(two / checkpoint) == files_of(one / checkpoint) - {"rng_state.pth"} | per_process_rng
        assert is_complete_checkpoint(two / checkpoint)
    for path in two.rglob("*"):
        assert not path.name.endswith(".tmp"), path
        if path.suffix == ".json":
            json.loads(path.read_text())  # whole, not two writers' interleaved bytes
        if path.suffix == ".safetensors":
            assert is_complete_safetensors(path), path
    log = (two.parent / "two.log").read_text(encoding="utf-8")
    assert log.count("***** train metrics *****") == 1  # printed by the main process only
    results = json.loads((two / "all_results.json").read_text())
    assert results["num_parameters"] == json.loads((one / "all_results.json").read_text())["num_parameters"]
    assert json.loads((two / "trainer_state.json").read_text())["global_step"] == STEPS


EVAL_SAMPLES, TEST_SAMPLES = 11, 13  # primes: neither divides into 2 processes x batch 4


@pytest.fixture(scope="module")
def torchrun_job(tmp_path_factory):
    """torchrun, 2 processes, the whole job on sets that do not divide evenly into processes x batch: a
    wall-clock budget (the main process decides when both stop), validation every 2 steps, checkpoint averaging
    (evaluate on both), the final validation, a beam-search test, the card; and one process translating and
    scoring the same sets with the saved model."""
    root = tmp_path_factory.mktemp("torchrun")
    out = root / "run"
    sets = {"max_eval_samples": EVAL_SAMPLES, "max_predict_samples": TEST_SAMPLES, "per_device_eval_batch_size": 4,
            "num_beams": 2}
    # a 3 s budget of 0.25 s steps on the budget's clock (simulated: 12 steps however slow the machine)
    run_command(["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", 2,
                 *steps_of_known_length_script(root, 0.25, SCRIPT),
                 *flags(out, per_device_train_batch_size=4, max_steps=10_000, max_train_minutes=0.05,
                        warmup_steps=0.1, save_strategy="steps", save_steps=2, average_last_checkpoints=2,
                        eval_strategy="steps", eval_steps=2, do_eval=True, do_predict=True, **sets)],
                root / "torchrun.log", timeout=600)
    evaluate_only = {"model_name_or_path": out, "do_train": False, "do_eval": True, "do_predict": True,
                     "config_overrides": None, **sets}
    one = root / "one_process"
    run_command([SCRIPT, *flags(one, **evaluate_only)], root / "one_process.log")
    return out, one, evaluate_only


def test_torchrun_full_job_with_averaging_budget_eval_and_test(torchrun_job):
    out, _, _ = torchrun_job
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 12  # stopped by the budget, both processes at the same step
    results = json.loads((out / "all_results.json").read_text())
    for key in ("train_loss", "eval_bleu", "test_bleu", "last_checkpoint_bleu", "averaged_bleu", "num_parameters"):
        assert key in results, key
    assert results["test_samples"] == TEST_SAMPLES
    for name in ("README.md", "training_curve.png", "generated_predictions.txt", "model.safetensors"):
        assert (out / name).is_file(), name
    predictions = (out / "generated_predictions.txt").read_text(encoding="utf-8").splitlines()
    assert len(predictions) == TEST_SAMPLES


def test_two_processes_validate_each_sentence_once(torchrun_job):
    """Every validation during training, and the final one, scored the 11 sentences once each (the distributed
    sampler repeats sentences to even out the last batches; they must not be scored)."""
    out, _, _ = torchrun_job
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    periodic = [entry for entry in history if "eval_bleu" in entry]
    assert periodic, "no validation during training"
    assert [entry["eval_sentences"] for entry in periodic] == [EVAL_SAMPLES] * len(periodic)
    results = json.loads((out / "all_results.json").read_text())
    assert results["eval_sentences"] == EVAL_SAMPLES
    assert (out / "averaging_results.json").is_file()


def test_two_process_test_and_validation_equal_one_process(torchrun_job):
    out, one, _ = torchrun_job
    assert (one / "generated_predictions.txt").read_bytes() == (out / "generated_predictions.txt").read_bytes()
    two_results = json.loads((out / "all_results.json").read_text())
    one_results = json.loads((one / "all_results.json").read_text())
    for key in ("test_bleu", "test_chrf", "test_samples", "eval_bleu", "eval_chrf", "eval_sentences"):
        assert one_results[key] == two_results[key], key


def test_accelerate_launch_test_and_validation_equal_one_process(torchrun_job, tmp_path):
    out, one, evaluate_only = torchrun_job
    accelerated = tmp_path / "accelerate"
    accelerate_launch(flags(accelerated, **evaluate_only), tmp_path / "accelerate.log")
    assert (accelerated / "generated_predictions.txt").read_bytes() == \
        (one / "generated_predictions.txt").read_bytes()
    results = json.loads((accelerated / "all_results.json").read_text())
    one_results = json.loads((one / "all_results.json").read_text())
    for key in ("test_bleu", "test_chrf", "test_samples", "eval_bleu", "eval_chrf", "eval_sentences"):
        assert results[key] == one_results[key], key
    assert results["test_samples"] == TEST_SAMPLES and results["eval_sentences"] == EVAL_SAMPLES


# ---------------------------------------------------------------- mixed precision (b)


def test_bf16_on_cpu_trains_with_finite_losses_and_gradients(tmp_path):
    out = tmp_path / "bf16"
    train_translation.main(flags(out, per_device_train_batch_size=8, max_steps=STEPS, bf16=True, use_cpu=True))
    logs = log_steps(out)
    assert sorted(logs) == list(range(1, STEPS + 1))
    for entry in logs.values():
        assert torch.isfinite(torch.tensor([entry["loss"], entry["grad_norm"]])).all(), entry
        assert entry["grad_norm"] > 0
    assert logs[STEPS]["loss"] < logs[1]["loss"]
    weights = load_file(out / "model.safetensors")
    assert all(value.dtype == torch.float32 for value in weights.values())  # autocast: fp32 master weights


# ---------------------------------------------------------------- interruption (c)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """30 steps in one go, checkpoints every 5 (the last 3 kept)."""
    out = tmp_path_factory.mktemp("resume") / "uninterrupted"
    train_translation.main(flags(out, per_device_train_batch_size=8, **RESUME))
    return out


def assert_same_training(run, reference):
    logs, reference_logs = log_steps(run), log_steps(reference)
    assert sorted(logs) == sorted(reference_logs) == list(range(1, RESUME["max_steps"] + 1))
    for step, entry in reference_logs.items():
        assert logs[step]["loss"] == pytest.approx(entry["loss"], rel=1e-5, abs=1e-6), step
        assert logs[step]["grad_norm"] == pytest.approx(entry["grad_norm"], rel=1e-4, abs=1e-6), step
    assert_same_weights(reference, run, rtol=1e-5, atol=1e-6)


def test_sigkill_then_rerun_resumes_past_half_written_checkpoints(uninterrupted, tmp_path, caplog):
    out = tmp_path / "killed"
    argv = flags(out, per_device_train_batch_size=8, **RESUME)
    kill_at_checkpoint(argv, out / "checkpoint-10", tmp_path / "killed.log")
    assert not (out / "all_results.json").exists()
    last = last_complete_checkpoint(out)
    step = int(last.rsplit("-", 1)[1])
    assert 10 <= step < RESUME["max_steps"]

    # Two checkpoints newer than the last complete one: killed while saving (no trainer_state.json yet),
    # and weights cut short by a crash. The rerun must resume from `last`, and remove both.
    half_written, cut_short = out / f"checkpoint-{step + 5}", out / f"checkpoint-{step + 10}"
    for folder in (half_written, cut_short):
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(last, folder)
    (half_written / "trainer_state.json").unlink()
    weights = (cut_short / "model.safetensors").read_bytes()
    (cut_short / "model.safetensors").write_bytes(weights[: len(weights) // 2])

    caplog.set_level(logging.INFO, logger="scratch_transformer")
    train_translation.main(argv)  # the same command again
    assert f"resuming from {last}" in caplog.text
    assert_same_training(out, uninterrupted)
    for folder in (half_written, cut_short):
        assert not folder.exists() or is_complete_checkpoint(folder), folder


@pytest.mark.parametrize("sampling", ["group_by_length", "random"])
def test_resume_from_checkpoint_flag_continues_the_run(uninterrupted, tmp_path, sampling):
    """Resuming mid-epoch replays the epoch's order: group_by_length (our epoch-seeded sampler) and random
    (accelerate's seedable sampler)."""
    settings = {**RESUME, "train_sampling_strategy": sampling}
    reference = uninterrupted
    if sampling != RESUME["train_sampling_strategy"]:
        reference = tmp_path / "reference"
        train_translation.main(flags(reference, per_device_train_batch_size=8, **settings))
    out = tmp_path / "continued"
    train_translation.main(flags(out, per_device_train_batch_size=8, resume_from_checkpoint=reference / "checkpoint-20",
                                 **settings))
    assert_same_training(out, reference)


# ---------------------------------------------------------------- bad inputs (d)


def _corrupt_config(checkpoint):
    (checkpoint / "config.json").write_text("{ this is not json", encoding="utf-8")


def _no_weights(checkpoint):
    (checkpoint / "model.safetensors").unlink()


def _cut_weights(checkpoint):
    weights = (checkpoint / "model.safetensors").read_bytes()
    (checkpoint / "model.safetensors").write_bytes(weights[:1000])


def _corrupt_state(checkpoint):
    (checkpoint / "trainer_state.json").write_bytes(b"\x00\xff garbage")


def _as_interrupted(out):
    """A finished run's folder made to look interrupted: without run_finished.json and all_results.json, which
    the end of a run writes, a rerun resumes (and checks) instead of saying there is nothing to do."""
    for name in ("run_finished.json", "all_results.json"):
        (out / name).unlink(missing_ok=True)


@pytest.mark.parametrize("damage, message", [
    (_corrupt_config, "config.json is not valid JSON"),
    (_no_weights, "is incomplete or corrupt: missing model.safetensors"),
    (_cut_weights, "model.safetensors is truncated or corrupt"),
    (_corrupt_state, "trainer_state.json is not valid JSON"),
], ids=["garbage-config", "missing-weights", "truncated-weights", "garbage-trainer-state"])
def test_corrupt_checkpoint_to_resume_is_refused(uninterrupted, tmp_path, damage, message):
    checkpoint = tmp_path / "damaged" / "checkpoint-20"
    shutil.copytree(uninterrupted / "checkpoint-20", checkpoint)
    damage(checkpoint)
    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    _as_interrupted(out)
    before = snapshot(out)
    with pytest.raises(ValueError, match=message) as error:
        train_translation.main(flags(out, per_device_train_batch_size=8, resume_from_checkpoint=checkpoint, **RESUME))
    assert str(checkpoint) in str(error.value)
    assert snapshot(out) == before


@pytest.fixture
def finished_run_copy(uninterrupted, tmp_path):
    """A copy of a finished run made to look interrupted after checkpoint-30 (it would resume from there), plus a
    half-written checkpoint that only a start that passed every check may clean up; and the folder's hashes."""
    out = tmp_path / "out"
    shutil.copytree(uninterrupted, out)
    _as_interrupted(out)
    shutil.copytree(out / "checkpoint-30", out / "checkpoint-35")
    (out / "checkpoint-35" / "trainer_state.json").unlink()
    return out, snapshot(out)


def test_checkpoint_of_another_architecture_is_refused(finished_run_copy):
    out, before = finished_run_copy
    with pytest.raises(ValueError, match="config field d_model is 64 there but 32 here") as error:
        train_translation.main(flags(out, per_device_train_batch_size=8, config_overrides=TINY.replace("64", "32"),
                                     **RESUME))
    assert str(out / "checkpoint-30") in str(error.value)
    assert snapshot(out) == before


def _write_folder(folder, languages, lines=8):
    folder.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        for lang in languages:
            (folder / f"{split}.{lang}").write_text("".join(f"{lang} sentence {i}\n" for i in range(lines)))


def test_missing_language_in_a_folder_is_refused(finished_run_copy, tmp_path):
    out, before = finished_run_copy
    folder = tmp_path / "de_en_only"
    _write_folder(folder, ("de", "en"))
    with pytest.raises(ValueError, match=r"language\(s\) \['fr'\] not present in .*de_en_only"):
        train_translation.main(flags(out, per_device_train_batch_size=8, dataset_name=folder, source_lang="fr",
                                     **RESUME))
    assert snapshot(out) == before


def test_missing_language_column_in_jsonl_is_refused(finished_run_copy, tmp_path):
    out, before = finished_run_copy
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps({"de": f"Satz {i}", "en": f"sentence {i}"}) + "\n" for i in range(8)))
    with pytest.raises(ValueError, match=r"pairs.jsonl.*language\(s\) \['fr'\] not present.*\['de', 'en'\]"):
        train_translation.main(flags(out, per_device_train_batch_size=8, dataset_name=None, train_file=path,
                                     validation_file=path, validation_split="validation", source_lang="fr",
                                     **RESUME))
    assert snapshot(out) == before
