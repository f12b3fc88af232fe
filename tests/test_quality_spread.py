"""benchmarks/quality_spread.py: runs gathered from quality.json files, one side of a file, and run folders; the
means, sample standard deviations, the difference of the means with Welch's standard error; refused inputs."""

import json
import math
import shlex

import pytest

from benchmarks import quality_spread

CPU = "Intel(R) Xeon(R) Processor (family 6 model 167)"


def run(model_type, bleu_2016, steps, eval_bleu, seed=None):
    command = "python scripts/train_translation.py configs/multi30k_de_en.json --output_dir x"
    return {"model_type": model_type, "steps": steps, "eval_bleu": eval_bleu,
            "command": command + (f" --seed {seed}" if seed is not None else ""),
            "test_sets": {"test_2016_flickr": {"bleu": bleu_2016, "chrf": 60.0},
                          "test_2017_flickr": {"bleu": bleu_2016 - 5, "chrf": 57.0},
                          "test_2017_mscoco": {"bleu": bleu_2016 - 14, "chrf": 51.0}}}


def quality_json(path, ours, marian, cpu=CPU, commit="abc1234", passthrough=()):
    path.write_text(json.dumps({"commit": commit, "machine": {"cpu_model": cpu}, "passthrough": list(passthrough),
                                "runs": {"ours": ours, "marian": marian}}))
    return str(path)


def run_folder(path, model_type, bleu_2016, steps):
    path.mkdir()
    (path / "all_results.json").write_text(json.dumps({
        "eval_bleu": 39.0, "test_sets": {"test_2016_flickr": {"bleu": bleu_2016, "chrf": 60.0}}}))
    (path / "trainer_state.json").write_text(json.dumps({"global_step": steps}))
    (path / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["X"]}))
    return str(path)


def test_means_standard_deviations_and_the_welch_margin(tmp_path, capsys):
    first = quality_json(tmp_path / "a.json", run("scratch_transformer", 41.0, 8000, 39.8),
                         run("marian", 40.5, 5600, 39.3, seed=1), passthrough=["--seed", "1"])
    second = quality_json(tmp_path / "b.json", run("scratch_transformer", 42.0, 8100, 39.9, seed=2),
                          run("marian", 40.0, 5700, 39.0, seed=2))
    folder = run_folder(tmp_path / "ours3", "scratch_transformer", 43.0, 8200)
    result = quality_spread.main([first, second, f"{folder}=75d7240", "--output_json", str(tmp_path / "s.json")])

    ours, marian = result["sides"]["ours"]["test_2016_flickr"], result["sides"]["marian"]["test_2016_flickr"]
    assert (ours["n"], ours["mean"], ours["std"], ours["min"], ours["max"]) == (3, 42.0, 1.0, 41.0, 43.0)
    assert (marian["n"], marian["mean"]) == (2, 40.25)
    assert marian["std"] == pytest.approx(math.sqrt(0.125))
    margin = result["margin"]["test_2016_flickr"]
    assert margin["difference"] == pytest.approx(1.75)
    assert margin["standard_error"] == pytest.approx(math.sqrt(1.0 / 3 + 0.125 / 2))
    # the run folder has no test_2017 scores: its side's mean there is of the two runs that have them
    assert result["sides"]["ours"]["test_2017_flickr"]["n"] == 2
    assert result["sides"]["ours"]["val"]["mean"] == pytest.approx((39.8 + 39.9 + 39.0) / 3)
    seeds = {(r["source"], r["seed"]) for r in result["runs"]}
    assert (f"{first}:ours", 1) in seeds and (f"{second}:ours", 2) in seeds and (folder, None) in seeds
    assert {r["commit"] for r in result["runs"]} == {"abc1234", "75d7240"}
    assert result["cpu_model"] == CPU
    table = capsys.readouterr().out
    assert "**+1.75** ± 0.63" in table and "42.00 ± 1.00 (41.00-43.00, n 3)" in table
    assert json.loads((tmp_path / "s.json").read_text())["margin"]["test_2016_flickr"]["difference"] == \
        pytest.approx(1.75)


def test_one_side_of_a_file(tmp_path):
    both = quality_json(tmp_path / "a.json", run("scratch_transformer", 41.0, 8000, 39.8),
                        run("marian", 40.5, 5600, 39.3))
    other = quality_json(tmp_path / "b.json", run("scratch_transformer", 30.0, 8000, 39.8),
                         run("marian", 40.0, 5600, 39.3))
    result = quality_spread.main([both, f"{other}:marian"])
    assert result["sides"]["ours"]["test_2016_flickr"]["n"] == 1
    assert result["sides"]["ours"]["test_2016_flickr"]["std"] is None
    assert result["margin"]["test_2016_flickr"]["standard_error"] is None
    assert result["sides"]["marian"]["test_2016_flickr"]["mean"] == pytest.approx(40.25)


@pytest.mark.parametrize("make_sources, message", [
    (lambda p: [quality_json(p / "a.json", run("scratch_transformer", 41, 1, 39), run("marian", 40, 1, 39)),
                quality_json(p / "b.json", run("scratch_transformer", 41, 1, 39), run("marian", 40, 1, 39),
                             cpu="AMD EPYC (family 25 model 17)")], "different CPUs"),
    (lambda p: [quality_json(p / "a.json", run("scratch_transformer", 41, 1, 39), None)], "no run of marian"),
    (lambda p: [str(p / "missing.json")], "no such file or run folder"),
    (lambda p: [quality_json(p / "a.json", run("scratch_transformer", 41, 1, 39), None) + ":bart"],
     "unknown side 'bart'"),
    (lambda p: [quality_json(p / "a.json", run("scratch_transformer", 41, 1, 39), None) + ":marian"],
     "no finished run of marian"),
    (lambda p: [str((p / "empty").mkdir() or p / "empty")], "holds no all_results.json"),
])
def test_bad_sources_are_refused_with_the_reason(tmp_path, make_sources, message):
    with pytest.raises(ValueError, match=message):
        quality_spread.main(make_sources(tmp_path))


def test_the_seed_is_read_from_the_command():
    assert quality_spread._seed(shlex.join(["x", "--seed", "7"])) == 7
    assert quality_spread._seed("x --seed=3 --max_steps 5") == 3
    assert quality_spread._seed("x --max_steps 5") is None
