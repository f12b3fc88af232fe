"""The papers' BLEU (lowercased, Moses-tokenised) and benchmarks.published, which scores a finished run both ways."""

import gzip
import json

import pytest
import sacrebleu

from benchmarks import published, record
from scratch_transformer.metrics import corpus_scores, papers_bleu

pytest.importorskip("sacremoses")

HYPOTHESES = ["Ein Mann, der lacht.", "Zwei Hunde spielen im Schnee!", "Eine Frau fährt Rad."]
REFERENCES = ["ein Mann , der lacht .", "Zwei hunde spielen im Schnee !", "Eine Frau fährt ein Fahrrad."]


def test_papers_bleu_lowercases_and_tokenises_both_sides():
    moses = papers_bleu(HYPOTHESES[:2], REFERENCES[:2], "de")
    assert moses["bleu"] == 100.0  # the same tokens once lowercased and split from the punctuation
    assert corpus_scores(HYPOTHESES[:2], REFERENCES[:2])["bleu"] == 65.34  # sacreBLEU's default keeps case and spaces
    assert moses["signature"].startswith("nrefs:1|case:lc|eff:no|tok:none") and moses["signature"].endswith("moses.de")


def test_papers_bleu_is_sacrebleu_over_the_moses_tokens():
    tokens = {"Ein Mann, der lacht.": "ein mann , der lacht .", "Zwei Hunde spielen im Schnee!":
              "zwei hunde spielen im schnee !", "Eine Frau fährt Rad.": "eine frau fährt rad .",
              "ein Mann , der lacht .": "ein mann , der lacht .", "Zwei hunde spielen im Schnee !":
              "zwei hunde spielen im schnee !", "Eine Frau fährt ein Fahrrad.": "eine frau fährt ein fahrrad ."}
    expected = sacrebleu.corpus_bleu([tokens[h] for h in HYPOTHESES], [[tokens[r] for r in REFERENCES]],
                                     tokenize="none").score
    assert papers_bleu(HYPOTHESES, REFERENCES, "de")["bleu"] == round(expected, 2) < 100


@pytest.mark.parametrize("hypotheses, references, message", [(["a"], ["a", "b"], "1 predictions but 2 references"),
                                                             ([], [], "no predictions")])
def test_papers_bleu_refuses_bad_lists(hypotheses, references, message):
    with pytest.raises(ValueError, match=message):
        papers_bleu(hypotheses, references, "de")


def fake_run(tmp_path):
    data, run = tmp_path / "raw", tmp_path / "run"
    data.mkdir()
    run.mkdir()
    with gzip.open(data / "test_a.de.gz", "wt", encoding="utf-8") as handle:
        handle.write("\n".join(REFERENCES) + "\n")
    (data / "test_b.de").write_text("\n".join(REFERENCES[:2]) + "\n", encoding="utf-8")
    (run / "generated_predictions.txt").write_text("\n".join(HYPOTHESES) + "\n", encoding="utf-8")
    (run / "generated_predictions_test_b.txt").write_text("\n".join(HYPOTHESES[:2]) + "\n", encoding="utf-8")
    (run / "all_results.json").write_text(json.dumps({"train_steps": 7, "precision": "fp32", "eval_bleu": 1.0,
                                                       "test_sets": {"test_a": {"bleu": 12.3, "chrf": 45.6}}}))
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"dataset_name": str(data), "source_lang": "en", "target_lang": "de",
                                  "test_split": "test_a,test_b", "output_dir": str(run)}))
    return config, run


def test_published_scores_each_test_set_both_ways_and_records(tmp_path, capsys):
    config, run = fake_run(tmp_path)
    entry = published.main(["--config", str(config), "--record", "--results_dir", str(tmp_path / "results")])
    assert entry["languages"] == "en->de" and entry["steps"] == 7
    assert entry["test_sets"]["test_a"]["bleu"] == 12.3  # sacreBLEU: the main job's own figure
    assert entry["test_sets"]["test_a"]["papers_bleu"] == papers_bleu(HYPOTHESES, REFERENCES, "de")["bleu"]
    assert entry["test_sets"]["test_b"]["papers_bleu"] == 100.0
    assert "| test_a | 12.3 |" in capsys.readouterr().out
    saved = record.load("multi30k_en_de", tmp_path / "results")
    assert saved["runs"] == [entry] and saved["published"][0]["bleu"] == 41.02
    published.main(["--config", str(config), "--record", "--results_dir", str(tmp_path / "results")])
    assert len(record.load("multi30k_en_de", tmp_path / "results")["runs"]) == 1  # the same CPU: replaced


def test_published_refuses_a_run_whose_predictions_do_not_match_the_references(tmp_path):
    config, run = fake_run(tmp_path)
    (run / "generated_predictions_test_b.txt").write_text("one line\n", encoding="utf-8")
    with pytest.raises(ValueError, match="1 lines, but 2 references in test_b.de"):
        published.main(["--config", str(config)])
    (run / "all_results.json").unlink()
    with pytest.raises(ValueError, match="holds no all_results.json"):
        published.main(["--config", str(config)])


def test_the_en_de_config_is_the_de_en_one_reversed():
    from conftest import REPO_ROOT

    de_en = json.loads((REPO_ROOT / "configs" / "multi30k_de_en.json").read_text())
    en_de = json.loads((REPO_ROOT / "configs" / "multi30k_en_de.json").read_text())
    assert (en_de["source_lang"], en_de["target_lang"], en_de["output_dir"]) == ("en", "de", "outputs/multi30k_en_de")
    assert {k: v for k, v in en_de.items() if k not in ("source_lang", "target_lang", "output_dir")} == \
           {k: v for k, v in de_en.items() if k not in ("source_lang", "target_lang", "output_dir")}
    assert en_de["max_train_minutes"] == 25
