"""benchmarks/gpu_check.py rehearsed on the CPU at tiny sizes, as the GPU machine would run it: without the
`datasets` package (its image has none), every part giving a row, the table printed and gpu.json written."""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import MULTI30K, REPO_ROOT

# The GPU image has no `datasets`: hide it from this process before anything looks for it.
HIDE_DATASETS = textwrap.dedent("""
    import importlib.abc, importlib.util, runpy, sys
    _find_spec = importlib.util.find_spec
    def find_spec(name, package=None):
        return None if name.split(".")[0] == "datasets" else _find_spec(name, package)
    importlib.util.find_spec = find_spec
    class Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "datasets":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Hide())
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
""")


def run_check(tmp_path, *flags, hide_datasets=False, timeout=300):
    command = [sys.executable, "benchmarks/gpu_check.py", "--device", "cpu", "--tiny", "--data", str(MULTI30K),
               "--results_dir", str(tmp_path), "--threads", "1", *flags]
    if hide_datasets:
        command[1:1] = ["-c", HIDE_DATASETS]
    return subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(autouse=True)
def needs_multi30k():
    if not MULTI30K.is_dir():
        pytest.skip("Multi30k not found beside the repo")


def test_cpu_rehearsal_without_datasets_runs_every_part(tmp_path):
    done = run_check(tmp_path, "--compile", "false", "--attention", "eager,sdpa,flash_attention_2",
                     hide_datasets=True)  # flex_attention and the compiled cache compile for minutes on a CPU
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    result = json.loads((tmp_path / "gpu.json").read_text())
    (run,) = result["runs"]
    assert run["size"] == "tiny" and run["failed"] == 0 and run["environment"]["datasets"] is None
    rows = {(r["part"], r["check"]): r for r in run["rows"]}
    parts = [part for part, _ in rows]
    assert {"model", "attention", "train", "generate", "wmt14"} <= set(parts)
    assert all(r["ok"] for r in run["rows"] if r["ok"] is not None), run["rows"]
    assert rows[("attention", "flash_attention_2 = eager")]["ok"] is None  # skipped: not installed / no CUDA
    ranges = rows[("environment", "versions within pyproject's ranges")]
    assert ranges["ok"] is None and ranges["figures"].startswith("datasets not installed")  # hidden here
    train = run["train"]
    assert train["loop"].startswith("Seq2SeqTrainer on lists") and train["steps"] >= 1  # as many as 3 s allow
    assert train["steps_per_second"] > 0 and 0 < train["last_loss"] <= train["first_loss"] < 7  # ln(300) = 5.7
    assert {(g["search"], g["mode"]) for g in run["generate"]} == {
        ("greedy", "dynamic"), ("greedy", "static"), ("beam4", "dynamic"), ("beam4", "static")}
    assert all(g["new_tokens_per_second"] > 0 and g["same_ids_as_dynamic"] for g in run["generate"])
    for step in run["wmt14"]:
        assert step["median_ms"] > 0 and step["tflop_per_step"] > 0 and step["estimate"] is None  # no GPU peak
    assert "| part | check | result | figures |" in done.stdout and "0 failed" in done.stdout
    from benchmarks.tables import gpu

    assert gpu(result)[2] == "| no GPU run yet | | | | | | |"  # a rehearsal is no result
    table = gpu({"runs": [{**run, "size": "full"}]})
    assert len(table) == 2 + len(run["rows"]) and table[2].startswith(f"| {run['environment']['device_name']} |")


def test_a_failing_part_is_a_fail_row_and_the_others_still_run(tmp_path, monkeypatch, capsys):
    from benchmarks import gpu_check

    def broken(args, device, rows, figures):
        raise RuntimeError("CUDA error: an illegal memory access\nsecond line")

    monkeypatch.setitem(gpu_check.PARTS, "model", broken)
    result = gpu_check.main(["--device", "cpu", "--tiny", "--parts", "model,wmt14", "--results_dir", str(tmp_path),
                             "--threads", "1"])
    assert result["failed"] == 1
    failed = [r for r in result["rows"] if r["ok"] is False]
    assert failed == [{"part": "model", "check": "(the part raised)", "ok": False,
                       "figures": "RuntimeError: CUDA error: an illegal memory access"}]
    assert "RuntimeError" in result["errors"]["model"]  # the traceback is kept in gpu.json
    assert [r["ok"] for r in result["rows"] if r["part"] == "wmt14"] == [True, True]
    out = capsys.readouterr().out
    assert "| model | (the part raised) | FAIL |" in out and "1 failed" in out


@pytest.mark.parametrize("flags, message", [
    (["--parts", "generate", "--data", "EMPTY"], "missing train.de.gz, train.en.gz"),
    (["--parts", "model,nonsense"], "--parts: unknown nonsense"),
    (["--train_seconds", "0"], "--train_seconds must be > 0"),
    (["--device", "gpu"], "--device 'gpu': not a torch device"),
    (["--device", "meta"], "--device 'meta': this check runs on cuda or cpu"),
    (["--threads", "0"], "--threads must be >= 1"),
])
def test_bad_arguments_are_refused_in_one_line_before_any_work(tmp_path, capsys, flags, message):
    from benchmarks import gpu_check

    (tmp_path / "EMPTY").mkdir()
    flags = [str(tmp_path / f) if f == "EMPTY" else f for f in flags]
    with pytest.raises(SystemExit) as exit_:
        gpu_check.parse_args(["--device", "cpu", "--tiny", *flags])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_cuda_asked_where_torch_sees_none_is_refused(capsys, monkeypatch):
    import torch

    from benchmarks import gpu_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit):
        gpu_check.parse_args([])
    assert "torch sees no CUDA device (torch.cuda.is_available() is False)" in capsys.readouterr().err


@pytest.mark.slow
def test_cpu_rehearsal_with_the_main_job_flex_and_the_compiled_static_cache(tmp_path):
    """The path the GPU takes where `datasets` is installed (scripts/train_translation.py), flex_attention and
    the compiled static cache: minutes of compilation on a CPU."""
    done = run_check(tmp_path, "--attention", "eager,sdpa,flex_attention", timeout=1200)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    (run,) = json.loads((tmp_path / "gpu.json").read_text())["runs"]
    assert run["failed"] == 0 and run["train"]["loop"] == "main_job"
    assert {g["mode"] for g in run["generate"]} == {"dynamic", "static-compiled"}
