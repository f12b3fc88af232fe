"""Translation metrics through sacreBLEU (BLEU and chrF on detokenised text)."""

from collections.abc import Sequence

import numpy as np
import sacrebleu


def corpus_scores(predictions: Sequence[str], references: Sequence[str]) -> dict:
    """sacreBLEU corpus BLEU and chrF of detokenised hypotheses against one reference each.

    Args:
        predictions: system outputs, one string per segment.
        references: the reference translations, same length and order.
    Returns:
        {"bleu": float 0-100, "chrf": float 0-100, "bleu_signature": str, "chrf_signature": str}.
    Raises:
        ValueError: when the two lists differ in length or are empty.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")
    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    bleu_score = bleu.corpus_score(list(predictions), [list(references)])
    chrf_score = chrf.corpus_score(list(predictions), [list(references)])
    return {
        "bleu": round(bleu_score.score, 2),
        "chrf": round(chrf_score.score, 2),
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
    }


def decode_ids(tokenizer, ids) -> list[str]:
    """Token ids (n, t), possibly padded with -100 by the Trainer, -> stripped strings."""
    ids = np.asarray(ids)
    ids = np.where(ids < 0, tokenizer.pad_token_id, ids)
    return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]


def count_repeated_token_outputs(ids, special_ids=(), min_run: int = 4) -> int:
    """How many outputs repeat one token `min_run` or more times in a row (a looping rare word such as
    "communicicici..."); padding (-100) and special tokens do not count.

    Args:
        ids: generated token ids (n, t), as the Trainer returns them.
        special_ids: ids to skip (pad, bos, eos).
    """
    count, skip = 0, set(special_ids)
    for row in np.asarray(ids):
        tokens = [int(token) for token in row if token >= 0 and int(token) not in skip]
        run = 1
        for previous, token in zip(tokens, tokens[1:]):
            run = run + 1 if token == previous else 1
            if run >= min_run:
                count += 1
                break
    return count


def make_compute_metrics(tokenizer):
    """`compute_metrics` for a Seq2SeqTrainer with predict_with_generate: BLEU, chrF, mean output length (tokens)
    and the number of sentences scored (each sentence of the set once, whatever the number of processes)."""

    def compute_metrics(eval_prediction):
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        hypotheses = decode_ids(tokenizer, predictions)
        references = decode_ids(tokenizer, labels)
        scores = corpus_scores(hypotheses, references)
        lengths = [np.count_nonzero(np.asarray(row) > tokenizer.eos_token_id) for row in np.asarray(predictions)]
        return {"bleu": scores["bleu"], "chrf": scores["chrf"], "gen_len": round(float(np.mean(lengths)), 2),
                "sentences": len(hypotheses)}

    return compute_metrics
