"""benchmarks.compiled_decoding and benchmarks.exported_decoding run end to end at a tiny size and report
agreement that can fail (their timings are for free cores, not checked here)."""

import json

import pytest

from benchmarks import compiled_decoding, exported_decoding


@pytest.mark.slow  # compiles with inductor (~1 min on 2 cores)
def test_compiled_decoding_runs_every_mode_and_they_agree(tmp_path):
    out = tmp_path / "compiled.json"
    result = compiled_decoding.main(["--size", "tiny", "--repeats", "1", "--batch_sizes", "2", "--vocab_size", "300",
                                     "--new_tokens", "4", "--searches", "greedy", "--output_json", str(out)])
    rows = result["rows"]
    assert {(r["model"], r["mode"]) for r in rows} == {(m, mode) for m in ("ours", "marian")
                                                      for mode in compiled_decoding.MODES}
    assert all(r["same_tokens_as_dynamic"] for r in rows)
    assert json.loads(out.read_text())["rows"][0]["new_tokens_per_second"] > 0


def test_compiled_decoding_static_mode_without_compiling(tmp_path):
    result = compiled_decoding.main(["--size", "tiny", "--repeats", "1", "--batch_sizes", "2", "--vocab_size", "300",
                                     "--new_tokens", "4", "--models", "ours", "--modes", "dynamic,static",
                                     "--searches", "beam4", "--output_json", str(tmp_path / "c.json")])
    assert len(result["rows"]) == 2  # dynamic and static
    assert all(r["same_tokens_as_dynamic"] for r in result["rows"])


def test_compiled_decoding_refuses_a_run_without_its_reference():
    with pytest.raises(SystemExit):
        compiled_decoding.parse_args(["--modes", "static"])


@pytest.mark.slow  # exports twice (~10 s)
def test_exported_decoding_agrees_with_generate_on_the_tiny_model(tiny_model_dir, tmp_path):
    source = tmp_path / "src.txt"
    source.write_text("ein hund läuft\nzwei kinder spielen im park\nein mann\n", encoding="utf-8")
    reference = tmp_path / "ref.txt"
    reference.write_text("a dog runs\ntwo children play in the park\na man\n", encoding="utf-8")
    out = tmp_path / "exported.json"
    result = exported_decoding.main(["--model", str(tiny_model_dir), "--source", str(source), "--reference",
                                     str(reference), "--engines", "generate,exported", "--repeats", "1",
                                     "--max_new_tokens", "8", "--max_cache_length", "16", "--output_json", str(out)])
    assert result["sentences"] == 3
    assert result["engines"]["exported"]["same_ids_as_generate"] == 1.0
    assert result["engines"]["exported"]["sentences_per_second"] > 0
    assert json.loads(out.read_text())["engines"]["generate"]["same_text_as_generate"] == 1.0
