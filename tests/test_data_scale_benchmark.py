"""benchmarks/data_scale.py end to end at 2000 pairs with a tiny model: the table and the JSON have every stage of
the first run and of the cached rerun, with positive times and memory, and the rerun came from the cache."""

import json
import math
import subprocess
import sys

import pytest
from conftest import REPO_ROOT
from helpers import TINY, subprocess_env

from benchmarks import data_scale
from benchmarks.data_scale import STAGES


def test_the_data_scale_benchmark_at_2000_pairs(tmp_path):
    out = tmp_path / "results.json"
    command = [sys.executable, "-m", "benchmarks.data_scale", "--pairs", "2000", "--work_dir", str(tmp_path / "work"),
               "--output_json", str(out), "--flags", "--config_overrides", TINY, "--vocab_size", "500",
               "--max_source_length", "48", "--max_target_length", "48", "--per_device_train_batch_size", "16",
               "--precision", "fp32"]
    proc = subprocess.run(command, cwd=REPO_ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    table = proc.stdout[proc.stdout.index("stage"):]
    for name in (*STAGES, "total"):
        assert any(line.split()[:1] == [name] for line in table.splitlines()), table

    result = json.loads(out.read_text())
    (entry,) = result["sizes"]
    assert entry["pairs"] == 2000 and entry["first"]["train_pairs"] == 2000
    for run in ("first", "rerun"):
        stages = entry[run]["stages"]
        assert list(stages) == list(STAGES)
        for name, figures in stages.items():
            assert math.isfinite(figures["seconds"]) and figures["seconds"] > 0, (run, name, figures)
            assert figures["peak_rss_mb"] > 0, (run, name, figures)
        assert entry[run]["to_first_step_seconds"] > 0
    log = "\n".join(entry["rerun"]["log"])
    assert "tokenizer: reusing" in log and log.count("reused the cache") == 2, log  # train and val
    assert "tokenizer cached at" in "\n".join(entry["first"]["log"])
    assert set(result["goals"]) == {"linear_in_pairs", "peak_rss_at_4.5M", "first_step_at_4.5M", "cached_rerun"}
    assert result["goals"]["peak_rss_at_4.5M"]["met"] is None  # not run at that size
    assert not (tmp_path / "work" / "hf_datasets_cache_2000").exists()  # caches removed without --keep


def test_a_cold_rerun_that_cannot_empty_the_page_cache_says_why(tmp_path):
    with pytest.raises(RuntimeError, match=r"--cold_rerun empties the page cache by writing to .*needs Linux and root"):
        data_scale.drop_page_cache(tmp_path)  # a folder: opening it for writing fails


def test_a_cold_rerun_needs_the_rerun(capsys):
    with pytest.raises(SystemExit):
        data_scale.parse_args(["--no-rerun", "--cold_rerun"])
    assert "--cold_rerun is a second rerun" in capsys.readouterr().err
