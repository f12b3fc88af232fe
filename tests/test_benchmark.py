"""The benchmark end to end at --size tiny, 1 repeat: the JSON holds positive finite figures.

`python -m benchmarks` (from the repository root) is the command; `scripts/benchmark.py` hands over to it."""

import json
import math
import subprocess
import sys
from pathlib import Path

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
)


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

    result = json.loads(out.read_text())
    assert result["size"] == "tiny"
    assert result["settings"]["timing_process"] == "a fresh child process per figure"
    assert "-m benchmarks --size tiny" in result["command"]  # the command that reproduces the run
    machine = result["machine"]
    assert machine["threads"] == 1 and machine["torch"] and machine["cpu_model"]
    assert _positive_finite(result["matmul"]["reference_gflops"])
    assert all(_positive_finite(x) for x in result["matmul"]["square_1024"])
    assert _positive_finite(result["flops"]["train_per_step"])

    assert set(result["contenders"]) == set(CONTENDERS)
    trainable = {c["params"]["trainable"] for c in result["contenders"].values()}
    assert len(trainable) == 1, f"parameter counts differ: {trainable}"
    for name, c in result["contenders"].items():
        figures = ("train", "greedy") if name == "naive" else ("train", "greedy", "beam4")
        for figure in figures:
            fig = c["figures"][figure]
            for stat in ("median", "min", "max"):
                assert _positive_finite(fig["tokens_per_s"][stat]), (name, figure, stat)
                assert _positive_finite(fig["seconds"][stat]), (name, figure, stat)
            assert _positive_finite(fig["fraction_of_matmul"]), (name, figure)
            assert _positive_finite(c["memory"][figure]["peak_rss_mb"]), (name, figure)
            assert c["memory"][figure]["peak_delta_mb"] >= 0, (name, figure)
            if figure != "train" and name != "naive":  # generate() time split into model / generate's own
                inside, total = fig["model_seconds"]["median"], fig["seconds"]["median"]
                assert 0 < inside < total, (name, figure, inside, total)
                assert _positive_finite(fig["generate_own_seconds"]["median"]), (name, figure)
        assert math.isfinite(c["final_train_loss"])
    assert "beam4" not in result["contenders"]["naive"]["figures"]

    for key in RATIO_KEYS:
        assert _positive_finite(result["ratios"].get(key)), key


def test_benchmark_same_process_option(tmp_path):
    """--same-process times the figures here instead of in fresh children; the figures and split are still there.
    Run through scripts/benchmark.py, which hands over to `python -m benchmarks`."""
    out = tmp_path / "results_tiny_same.json"
    cmd = [
        sys.executable, str(REPO_ROOT / "scripts" / "benchmark.py"),
        "--size", "tiny", "--repeats", "1", "--warmup", "0", "--threads", "1", "--no-memory", "--same-process",
        "--contenders", "ours-sdpa,marian", "--matmul-seconds", "0.02", "--output_json", str(out),
    ]
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["settings"]["timing_process"] == "this process"
    assert "-m benchmarks --size tiny" in result["command"]
    assert set(result["contenders"]) == {"ours-sdpa", "marian"}
    for c in result["contenders"].values():
        assert math.isfinite(c["final_train_loss"])
        for figure in ("greedy", "beam4"):
            fig = c["figures"][figure]
            assert 0 < fig["model_seconds"]["median"] < fig["seconds"]["median"], figure
    assert _positive_finite(result["ratios"]["beam4_ours_sdpa_over_marian"])


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
