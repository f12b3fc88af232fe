"""benchmarks/job_step.py: both models timed on the main job's own batches, alternating, and what it refuses."""

import json
import statistics

import pytest
from conftest import MULTI30K
from helpers import TINY

from benchmarks import job_step


def test_job_step_times_both_models_on_the_same_job_batches(tmp_path):
    out = tmp_path / "job_step.json"
    flags = ["--steps", "3", "--warmup", "1", "--output_json", str(out),
             "--dataset_name", str(MULTI30K), "--max_train_samples", "96", "--vocab_size", "300",
             "--per_device_train_batch_size", "16", "--config_overrides", TINY, "--precision", "fp32",
             "--max_source_length", "40", "--max_target_length", "40", "--disable_tqdm", "true"]
    result = job_step.main(flags)
    assert json.loads(out.read_text())["ours_over_marian"] == pytest.approx(result["ours_over_marian"])
    assert result["precision"] == "fp32" and result["steps"] == 3
    for side in ("ours", "marian"):
        seconds = result["seconds"][side]
        assert len(seconds) == 3 and all(s > 0 for s in seconds)  # warm-up batch not counted
        assert result["figures"][side]["mean_ms"] == pytest.approx(1000 * statistics.mean(seconds))
        assert result["figures"][side]["tokens_per_s"] == pytest.approx(result["tokens"] / sum(seconds))
    assert result["ours_over_marian"] == pytest.approx(
        result["figures"]["marian"]["mean_ms"] / result["figures"]["ours"]["mean_ms"])
    # 3 batches of 16 pairs of real Multi30k sentences, grouped by length: many tokens, little padding
    assert 3 * 16 * 2 * 5 < result["tokens"] < 3 * 16 * 2 * 40
    assert 0 <= result["padding_fraction"] < 0.3
    assert result["machine"]["cpu_model"]


def test_job_step_refuses_more_batches_than_the_set_has(tmp_path):
    flags = ["--steps", "10", "--warmup", "0", "--output_json", str(tmp_path / "x.json"),
             "--dataset_name", str(MULTI30K), "--max_train_samples", "32", "--vocab_size", "300",
             "--per_device_train_batch_size", "16", "--config_overrides", TINY, "--precision", "fp32",
             "--max_source_length", "40", "--max_target_length", "40", "--disable_tqdm", "true"]
    with pytest.raises(ValueError, match="gives 2 batches, fewer than --warmup \\+ --steps = 10"):
        job_step.main(flags)


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "--steps must be at least 1"),
    (["--output_dir", "x"], "--output_dir is set by the benchmark"),
])
def test_job_step_bad_flags(flags, message, capsys):
    with pytest.raises(SystemExit):
        job_step.parse_args(flags)
    assert message in capsys.readouterr().err
