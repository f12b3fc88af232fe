"""The benchmark end to end at --size tiny, 1 repeat: the JSON holds positive finite figures, the main job's training
step (label smoothing 0.1, the precision the main job picks here) computes HF's label-smoothed loss.

`python -m benchmarks` (from the repository root) is the command; `scripts/benchmark.py` hands over to it."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from scratch_transformer.training import choose_precision, native_bf16_cpu

REPO_ROOT = Path(__file__).resolve().parent.parent
CONTENDERS = ("ours-eager", "ours-sdpa", "marian", "naive")
RATIO_KEYS = (
    "train_ours_sdpa_over_marian",
    "greedy_ours_sdpa_over_marian",
    "beam4_ours_sdpa_over_marian",
    "greedy_ours_sdpa_over_naive",
    "greedy_ours_eager_over_naive",
    "greedy_ours_eager_over_marian",
    "beam4_ours_eager_over_marian",
    "train_main_job_ours_sdpa_over_marian",
    "train_main_job_ours_eager_over_marian",
)
AS_THE_JOB_RUNS = "train_main_job_ours_eager_over_marian_eager"  # needs marian-eager, not a default contender


def _positive_finite(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def test_benchmark_tiny_end_to_end(tmp_path):
    out = tmp_path / "results_tiny.json"
    cmd = [
        sys.executable, "-m", "benchmarks",
        "--size", "tiny", "--repeats", "1", "--warmup", "0", "--threads", "1",
        "--matmul-seconds", "0.02", "--memory-runs", "1", "--output_json", str(out),
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out.exists()
    assert "| ours-sdpa |" in proc.stdout and "train_ours_sdpa_over_marian" in proc.stdout
    assert "| marian | greedy |" in proc.stdout  # the decoding time split table
    native, evidence = native_bf16_cpu()
    precision, reason = choose_precision(on_cpu=True)
    assert f"native bf16: {'yes' if native else 'no'} ({evidence}); the main job trains here in {precision}." in proc.stdout
    assert "| contender | attn | main-job step tok/s |" in proc.stdout

    result = json.loads(out.read_text())
    assert result["size"] == "tiny"
    assert result["settings"]["timing_process"] == "a fresh child process per figure"
    assert "-m benchmarks --size tiny" in result["command"]  # the command that reproduces the run
    machine = result["machine"]
    assert machine["threads"] == 1 and machine["torch"] and machine["cpu_model"]
    assert machine["native_bf16"] is native and machine["native_bf16_evidence"] == evidence
    main_job = result["settings"]["train_main_job"]
    assert main_job["precision"] == precision and main_job["precision_reason"] == reason
    assert main_job["label_smoothing"] == 0.1
    assert _positive_finite(result["matmul"]["reference_gflops"])
    assert all(_positive_finite(x) for x in result["matmul"]["square_1024"])
    assert _positive_finite(result["flops"]["train_per_step"])

    assert set(result["contenders"]) == set(CONTENDERS)
    trainable = {c["params"]["trainable"] for c in result["contenders"].values()}
    assert len(trainable) == 1, f"parameter counts differ: {trainable}"
    for name, c in result["contenders"].items():
        figures = ("train", "greedy") if name == "naive" else ("train", "train_main_job", "greedy", "beam4")
        for figure in figures:
            fig = c["figures"][figure]
            for stat in ("median", "min", "max"):
                assert _positive_finite(fig["tokens_per_s"][stat]), (name, figure, stat)
                assert _positive_finite(fig["seconds"][stat]), (name, figure, stat)
            assert _positive_finite(fig["fraction_of_matmul"]), (name, figure)
            assert _positive_finite(c["memory"][figure]["peak_rss_mb"]), (name, figure)
            assert c["memory"][figure]["peak_delta_mb"] >= 0, (name, figure)
            if not figure.startswith("train") and name != "naive":  # generate() time split into model / generate's own
                inside, total = fig["model_seconds"]["median"], fig["seconds"]["median"]
                assert 0 < inside < total, (name, figure, inside, total)
                assert _positive_finite(fig["generate_own_seconds"]["median"]), (name, figure)
        assert math.isfinite(c["final_train_loss"])
        if name != "naive":  # label-smoothed: above the plain loss's share, near ln(128) = 4.85 untrained
            assert 3 < c["final_train_main_job_loss"] < 7, name
    assert "beam4" not in result["contenders"]["naive"]["figures"]
    assert "train_main_job" not in result["contenders"]["naive"]["figures"]
    assert result["contenders"]["naive"]["final_train_main_job_loss"] is None

    for key in RATIO_KEYS:
        assert _positive_finite(result["ratios"].get(key)), key
    assert result["ratios"][AS_THE_JOB_RUNS] is None  # n/a without marian-eager


def test_main_job_ratio_with_both_models_as_the_job_runs_them(tmp_path):
    """With marian-eager among the contenders, the main-job ratio with both models on eager attention (the
    config's attn_implementation, which benchmarks.quality gives Marian too) is the two medians' quotient."""
    out = tmp_path / "results_tiny_eager.json"
    cmd = [
        sys.executable, "-m", "benchmarks", "--size", "tiny", "--repeats", "1", "--warmup", "0", "--threads", "1",
        "--no-memory", "--same-process", "--figures", "train_main_job", "--contenders", "ours-eager,marian-eager",
        "--matmul-seconds", "0.02", "--output_json", str(out),
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rates = {name: c["figures"]["train_main_job"]["tokens_per_s"]["median"] for name, c in result["contenders"].items()}
    assert result["ratios"][AS_THE_JOB_RUNS] == pytest.approx(rates["ours-eager"] / rates["marian-eager"], rel=1e-3)
    assert result["ratios"]["train_main_job_ours_eager_over_marian"] is None
    assert AS_THE_JOB_RUNS in proc.stdout


def test_benchmark_same_process_option(tmp_path):
    """--same-process times the figures here instead of in fresh children; the figures and split are still there.
    Run through scripts/benchmark.py, which hands over to `python -m benchmarks`. --seq_len sets the batch's
    sentence lengths (tiny: 6) and the tokens counted."""
    out = tmp_path / "results_tiny_same.json"
    cmd = [
        sys.executable, str(REPO_ROOT / "scripts" / "benchmark.py"),
        "--size", "tiny", "--repeats", "1", "--warmup", "0", "--threads", "1", "--no-memory", "--same-process",
        "--contenders", "ours-sdpa,marian", "--matmul-seconds", "0.02", "--seq_len", "5", "--output_json", str(out),
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["settings"]["timing_process"] == "this process"
    assert "-m benchmarks --size tiny" in result["command"]
    assert set(result["contenders"]) == {"ours-sdpa", "marian"}
    assert (result["sizes"]["src_len"], result["sizes"]["tgt_len"]) == (5, 5)
    for c in result["contenders"].values():
        assert math.isfinite(c["final_train_loss"])
        assert c["figures"]["train"]["tokens_per_call"] == result["sizes"]["batch_size"] * (5 + 5)
        for figure in ("greedy", "beam4"):
            fig = c["figures"][figure]
            assert 0 < fig["model_seconds"]["median"] < fig["seconds"]["median"], figure
    assert _positive_finite(result["ratios"]["beam4_ours_sdpa_over_marian"])


def test_seq_len_below_two_is_refused(capsys):
    from benchmarks import cli

    with pytest.raises(SystemExit):
        cli.parse_args(["--seq_len", "1"])
    assert "--seq_len must be >= 2" in capsys.readouterr().err
    assert cli.parse_args(["--seq_len", "16"]).output_json.endswith("outputs/speed_small_len16.json")


def test_benchmark_script_outside_repo_root_names_the_command(tmp_path):
    """scripts/benchmark.py from another folder: a clear refusal naming `python -m benchmarks`."""
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "benchmark.py"), "--size", "tiny"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "python -m benchmarks" in proc.stderr and str(REPO_ROOT) in proc.stderr


def test_contenders_carry_their_differences():
    """The registry builds every contender; the figures each kind has decide what is timed and measured.
    In a child process at the repository root, where `benchmarks` is importable (as under `python -m`)."""
    code = (
        "from benchmarks.contenders import ALL_CONTENDERS, SIZES, build, contender_class\n"
        "assert not contender_class('naive').supports('beam4')\n"
        "for name in ALL_CONTENDERS:\n"
        "    c = build(name, SIZES['tiny'], seed=0)\n"
        "    assert c.name == name and c.params['trainable'] > 0, name\n"
        "    assert c.splits_generate == (name != 'naive'), name\n"
        "print('ok', len(ALL_CONTENDERS))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "ok 5"


def test_main_job_step_is_label_smoothed_in_the_main_jobs_precision():
    """The train_main_job figure's loss is the label-smoothed loss (epsilon 0.1) of a forward pass in the precision
    choose_precision picks, as the main job's Trainer computes it (ours in its forward, Marian through HF's
    LabelSmoother), checked against F.cross_entropy(label_smoothing=0.1) on the float32 logits, with some labels
    -100; its step updates the weights. Dropout off (eval)
    so the two forward passes agree. In a child process at the repository root, where `benchmarks` imports."""
    code = (
        "import torch, torch.nn.functional as F\n"
        "from benchmarks.contenders import SIZES, build, make_batch, main_job_precision\n"
        "from scratch_transformer.training import choose_precision\n"
        "precision = main_job_precision()[0]\n"
        "assert precision == choose_precision(on_cpu=True)[0]\n"
        "batch = make_batch(SIZES['tiny'], 0)\n"
        "batch['labels'][:, -2:] = -100\n"
        "for name in ('ours-sdpa', 'ours-eager', 'marian'):\n"
        "    c = build(name, SIZES['tiny'], seed=0)\n"
        "    c.set_batch(batch)\n"
        "    c.model.eval()\n"
        "    loss = c.main_job_loss(batch)\n"
        "    with torch.autocast('cpu', dtype=torch.bfloat16, enabled=precision == 'bf16'):\n"
        "        logits = c.model(input_ids=batch['src'], attention_mask=batch['src_mask'],\n"
        "                         decoder_input_ids=batch['tgt_in'], use_cache=False).logits\n"
        "    if name.startswith('ours'):  # Marian adds its float32 final_logits_bias: float32 logits\n"
        "        assert logits.dtype == (torch.bfloat16 if precision == 'bf16' else torch.float32), logits.dtype\n"
        "    expected = F.cross_entropy(logits.float().flatten(0, 1), batch['labels'].flatten(), ignore_index=-100,\n"
        "                               label_smoothing=0.1)\n"
        "    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)\n"
        "    plain = F.cross_entropy(logits.float().flatten(0, 1), batch['labels'].flatten(), ignore_index=-100)\n"
        "    assert not torch.isclose(loss, plain), (name, float(loss.detach()), float(plain.detach()))\n"
        "    before = c.model.get_output_embeddings().weight.detach().clone()\n"
        "    step_loss = c.run('train_main_job')\n"
        "    assert abs(step_loss - float(loss.detach())) < 0.5 and c.model.training, (name, step_loss)\n"
        "    assert not torch.equal(before, c.model.get_output_embeddings().weight), name\n"
        "print('ok', precision)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == f"ok {choose_precision(on_cpu=True)[0]}"


def test_cpu_model_names_the_family_and_model():
    """Reports name the CPU kind: "AMD EPYC" covers kinds with and without native bf16; family/model tell them apart."""
    from benchmarks.report import cpu_model

    two_cpus = ("processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
                "\nprocessor\t: 1\ncpu family\t: 23\nmodel\t\t: 49\nmodel name\t: Other\n")
    assert cpu_model(two_cpus) == "AMD EPYC (family 25 model 17)"  # the first processor's block
    assert cpu_model("model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n") == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    assert cpu_model().strip()  # this machine
