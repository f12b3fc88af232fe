"""scripts/show_run.py: a run's training curve and sample translations, written into a docs file."""

import json

import pytest
from conftest import load_script

show_run = load_script("show_run")


def fake_run(tmp_path):
    data, run = tmp_path / "raw", tmp_path / "run"
    data.mkdir()
    run.mkdir()
    (data / "test_x.de").write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    (data / "test_x.en").write_text("A dog.\nTwo cats.\n", encoding="utf-8")
    (run / "generated_predictions.txt").write_text("A dog.\nTwo cat.\n", encoding="utf-8")
    (run / "all_results.json").write_text(json.dumps({"test_bleu": 12.34}))
    history = [{"step": 50, "loss": 5.0}, {"step": 100, "loss": 4.0, "eval_bleu": 3.0}]
    (run / "trainer_state.json").write_text(json.dumps({"global_step": 100, "log_history": history}))
    return data, run


def test_curve_and_samples_go_where_asked(tmp_path, capsys):
    data, run = fake_run(tmp_path)
    docs = tmp_path / "results.md"
    docs.write_text("before\n<!-- samples -->\nold\n<!-- /samples -->\nafter\n", encoding="utf-8")
    lines = show_run.main([str(run), "--curve", str(tmp_path / "curve.png"), "--samples", "2", "--dataset_name",
                           str(data), "--split", "test_x", "--docs", str(docs)])
    assert lines == ["- Ein Hund. / A dog. / A dog.", "- Zwei Katzen. / Two cats. / Two cat."]
    assert (tmp_path / "curve.png").read_bytes()[:4] == b"\x89PNG"
    text = docs.read_text(encoding="utf-8")
    assert text.startswith("before\n<!-- samples -->\ntest_x (source / reference / ours), from a run of 100 steps, "
                           "test BLEU 12.34:\n- Ein Hund.") and text.endswith("<!-- /samples -->\nafter\n")
    assert "old" not in text and capsys.readouterr().out.count("\n") == 2


def test_a_run_without_predictions_or_with_other_lengths_is_refused(tmp_path):
    data, run = fake_run(tmp_path)
    (data / "test_x.en").write_text("A dog.\n", encoding="utf-8")
    with pytest.raises(ValueError, match="has 2 lines, test_x 2 sources and 1 references"):
        show_run.main([str(run), "--dataset_name", str(data), "--split", "test_x"])
    (run / "generated_predictions.txt").unlink()
    with pytest.raises(ValueError, match="holds no generated_predictions.txt"):
        show_run.main([str(run), "--dataset_name", str(data), "--split", "test_x"])
