"""benchmarks/results/*.json and the tables made from them: the docs agree with the files, a figure changed in a
file makes the check fail, and --record replaces the entry it supersedes."""

import json
import shutil

import pytest
from conftest import REPO_ROOT

from benchmarks import record, tables
from benchmarks.quality_spread import load_source, summarise


def test_every_table_in_the_docs_is_its_results_file():
    for doc in tables.DOCS:
        _, changed = tables.fill((REPO_ROOT / doc).read_text(encoding="utf-8"))
        assert changed == [], f"{doc}: {changed} out of date: run python -m benchmarks.tables"
    assert tables.main(["--check"]) == 0


def test_a_changed_figure_is_caught(tmp_path):
    shutil.copytree(REPO_ROOT / "benchmarks" / "results", tmp_path / "results")
    quality = json.loads((tmp_path / "results" / "quality.json").read_text())
    quality["runs"][0]["test_sets"]["test_2016_flickr"]["bleu"] += 1.0
    (tmp_path / "results" / "quality.json").write_text(json.dumps(quality))
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    new, changed = tables.fill(readme, tmp_path / "results")
    assert changed == ["quality-at-a-glance"] and new != readme
    assert tables.fill(new, tmp_path / "results")[1] == []


def test_markers_must_be_balanced_and_known():
    with pytest.raises(ValueError, match="unknown table 'nope'"):
        tables.fill("<!-- table:nope -->\n<!-- /table:nope -->")
    with pytest.raises(ValueError, match="unbalanced"):
        tables.fill("<!-- table:speed -->\n")


def test_the_results_files_are_the_current_ones():
    """One file per benchmark, each with a table made from it, and no results_*.json left beside them; the quality
    file lists runs of the current config, in the form quality_spread reads, both sides on at least one CPU."""
    from benchmarks.tables import TABLES

    files = sorted(p.stem for p in (REPO_ROOT / "benchmarks" / "results").glob("*.json"))
    assert {"quality", "job_step", "inference_engines", "activation_memory", "exported_decoding"} <= set(files)
    assert set(files) <= {benchmark for benchmark, _ in TABLES.values()}
    assert not list((REPO_ROOT / "benchmarks").glob("results_*.json"))
    runs = load_source(str(REPO_ROOT / "benchmarks" / "results" / "quality.json"))
    assert {run["side"] for run in runs} == {"ours", "marian"}
    assert all(run["cpu_model"] and run["commit"] and run["steps"] for run in runs)
    paired = [cpu for cpu in {run["cpu_model"] for run in runs}
              if {run["side"] for run in runs if run["cpu_model"] == cpu} == {"ours", "marian"}]
    assert paired
    for cpu in paired:
        summary = summarise([run for run in runs if run["cpu_model"] == cpu])
        assert summary["sides"]["ours"]["test_2016_flickr"]["n"] >= 1


def test_record_replaces_the_entry_it_supersedes_and_keeps_the_others(tmp_path):
    key = lambda run: (run["cpu_model"], run["precision"])
    record.record("job_step", [{"cpu_model": "A", "precision": "fp32", "ms": 1}], key, tmp_path, command="c1")
    record.record("job_step", [{"cpu_model": "B", "precision": "fp32", "ms": 2}], key, tmp_path)
    path = record.record("job_step", [{"cpu_model": "A", "precision": "fp32", "ms": 3}], key, tmp_path, command="c2")
    saved = json.loads(path.read_text())
    assert saved["runs"] == [{"cpu_model": "A", "precision": "fp32", "ms": 3}, {"cpu_model": "B", "precision": "fp32",
                                                                              "ms": 2}]
    assert saved["command"] == "c2" and path == tmp_path / "job_step.json"
    (tmp_path / "bad.json").write_text("[]")
    with pytest.raises(ValueError, match="not a results file"):
        record.load("bad", tmp_path)


def test_quality_spread_records_a_pair_into_the_quality_file(tmp_path, monkeypatch):
    from benchmarks import quality_spread

    pair = {"commit": "abc1234", "date": "2026-12-08 10:00 UTC", "machine": {"cpu_model": "CPU X"},
            "passthrough": ["--seed", "5"],
            "runs": {side: {"steps": steps, "eval_bleu": 30.0, "precision": "fp32", "folder": "f",
                            "test_sets": {"test_2016_flickr": {"bleu": bleu, "chrf": 50.0}}}
                     for side, steps, bleu in (("ours", 100, 31.0), ("marian", 90, 30.0))}}
    (tmp_path / "quality.json").write_text(json.dumps(pair))
    monkeypatch.setattr(record, "RESULTS_DIR", tmp_path / "results")
    quality_spread.main([str(tmp_path / "quality.json"), "--record"])
    quality_spread.main([str(tmp_path / "quality.json"), "--record"])  # the same pair again: replaced, not added
    saved = record.load("quality", tmp_path / "results")["runs"]
    assert [(r["side"], r["seed"], r["commit"], r["cpu_model"]) for r in saved] == [
        ("ours", 5, "abc1234", "CPU X"), ("marian", 5, "abc1234", "CPU X")]
    assert "folder" not in saved[0]
    assert {r["side"] for r in load_source(str(tmp_path / "results" / "quality.json"))} == {"ours", "marian"}
