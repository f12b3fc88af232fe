"""benchmarks/decoding.py: each (beams, length penalty, stopping rule) row is the sacreBLEU of translate() with those
settings."""

import json

import pytest
from conftest import MULTI30K

from benchmarks import decoding
from scratch_transformer.data import load_translation_dataset
from scratch_transformer.inference import translate
from scratch_transformer.metrics import corpus_scores


def test_rows_are_the_scores_of_those_settings_and_the_best_is_marked(tiny_model_dir, tmp_path, capsys):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import scratch_transformer  # noqa: F401

    out = tmp_path / "decoding.json"
    result = decoding.main(["--model", str(tiny_model_dir), "--num_beams", "1,2", "--length_penalty", "0.5,2.0",
                            "--max_samples", "6", "--batch_size", "4", "--output_json", str(out)])
    assert [(row["num_beams"], row["length_penalty"]) for row in result["rows"]] == [(1, 1.0), (2, 0.5), (2, 2.0)]
    val = load_translation_dataset(str(MULTI30K), "de", "en", splits=["val"])["val"].select(range(6))
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = corpus_scores(translate(model, tokenizer, list(val["de"]), batch_size=4, num_beams=2,
                                       length_penalty=2.0, no_repeat_ngram_size=0), list(val["en"]))
    assert (result["rows"][2]["bleu"], result["rows"][2]["chrf"]) == (expected["bleu"], expected["chrf"])
    assert result["best"] == max(result["rows"], key=lambda row: (row["bleu"], row["chrf"]))
    assert result["sentences"] == 6 and json.loads(out.read_text())["table"] == capsys.readouterr().out.strip()
    assert "(best)" in result["table"]


def test_stopping_rules_are_rows_of_their_own(tiny_model_dir, tmp_path):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import scratch_transformer  # noqa: F401

    result = decoding.main(["--model", str(tiny_model_dir), "--num_beams", "1,3", "--length_penalty", "1.5",
                            "--early_stopping", "false,true", "--renormalize_logits", "true", "--max_samples", "6",
                            "--batch_size", "4", "--no_repeat_ngram_size", "2",
                            "--output_json", str(tmp_path / "d.json")])
    keys = [(row["num_beams"], row["early_stopping"], row["renormalize_logits"]) for row in result["rows"]]
    assert keys == [(1, False, True), (3, False, True), (3, True, True)]  # greedy has no stopping rule
    val = load_translation_dataset(str(MULTI30K), "de", "en", splits=["val"])["val"].select(range(6))
    model = AutoModelForSeq2SeqLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    for row in result["rows"][1:]:
        expected = corpus_scores(translate(model, tokenizer, list(val["de"]), batch_size=4, num_beams=3,
                                           length_penalty=1.5, no_repeat_ngram_size=2,
                                           early_stopping=row["early_stopping"], renormalize_logits=True),
                                 list(val["en"]))
        assert (row["bleu"], row["chrf"]) == (expected["bleu"], expected["chrf"])
    assert "| 3 | 1.5 | True | True |" in result["table"]


@pytest.mark.parametrize("flags, message", [
    (["--num_beams", "0"], "--num_beams values must be >= 1"),
    (["--early_stopping", "yes"], "expected comma-separated true/false"),
    (["--num_beams", "a,4"], "expected comma-separated numbers"),
    (["--max_samples", "0"], "--max_samples must be >= 1"),
])
def test_bad_flags_are_refused(flags, message, capsys):
    with pytest.raises(SystemExit):
        decoding.parse_args(["--model", "m", *flags])
    assert message in capsys.readouterr().err
