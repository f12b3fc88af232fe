"""scratch_transformer.metrics: sacreBLEU scores, decoding Trainer predictions, the Trainer's compute_metrics."""

import numpy as np
import pytest
import sacrebleu
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import EvalPrediction, PreTrainedTokenizerFast

from scratch_transformer.metrics import corpus_scores, count_repeated_token_outputs, decode_ids, make_compute_metrics

HYPOTHESES = ["A dog runs across the grass.", "Two men play football.", "A woman sits."]
REFERENCES = ["A dog is running across the grass.", "Two men are playing soccer.", "A woman sits on a bench."]


def test_corpus_scores_are_sacrebleus():
    scores = corpus_scores(HYPOTHESES, REFERENCES)
    assert scores["bleu"] == round(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, 2)
    assert scores["chrf"] == round(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, 2)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")
    assert corpus_scores(REFERENCES, REFERENCES)["bleu"] == 100.0


@pytest.mark.parametrize("hypotheses, references, message", [
    (HYPOTHESES[:2], REFERENCES, "2 predictions but 3 references"),
    ([], [], "no predictions to score"),
])
def test_corpus_scores_refuses_mismatched_or_empty_lists(hypotheses, references, message):
    with pytest.raises(ValueError, match=message):
        corpus_scores(hypotheses, references)


@pytest.fixture(scope="module")
def word_tokenizer():
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "a": 4, "dog": 5, "runs": 6, "cat": 7}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def test_decode_ids_reads_trainer_padding_as_pad(word_tokenizer):
    ids = np.array([[1, 4, 5, 6, 2, -100], [1, 7, 2, -100, -100, -100]])  # the Trainer pads with -100
    assert decode_ids(word_tokenizer, ids) == ["a dog runs", "cat"]


def test_compute_metrics_scores_each_sentence_once(word_tokenizer):
    predictions = np.array([[1, 4, 5, 6, 2], [1, 7, 2, 0, 0]])
    labels = np.array([[4, 5, 6, 2, -100], [4, 7, 2, -100, -100]])
    metrics = make_compute_metrics(word_tokenizer)(EvalPrediction(predictions=predictions, label_ids=labels))
    expected = corpus_scores(["a dog runs", "cat"], ["a dog runs", "a cat"])
    assert metrics["bleu"] == expected["bleu"] and metrics["chrf"] == expected["chrf"]
    assert metrics["sentences"] == 2
    assert metrics["gen_len"] == 2.0  # ids above the special tokens and padding: (3 + 1) / 2


def test_outputs_that_repeat_a_token_four_times_are_counted():
    ids = np.array([[1, 9, 9, 9, 9, 2, -100],   # a looping subword: counted
                    [1, 9, 9, 9, 8, 9, 2],      # three in a row: not
                    [1, 5, 0, 0, 0, 0, -100],   # padding repeats: not
                    [7, 7, 7, 7, 7, 7, 7]])     # counted once
    assert count_repeated_token_outputs(ids, special_ids=[0, 1, 2]) == 2
