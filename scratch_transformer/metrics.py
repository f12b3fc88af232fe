"""Translation metrics through sacreBLEU (BLEU and chrF on detokenised text), and BLEU as papers on Multi30k
report it (lowercased, Moses-tokenised)."""

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


def papers_bleu(predictions: Sequence[str], references: Sequence[str], lang: str) -> dict:
    """Corpus BLEU as the Multi30k literature scores it: hypotheses and references lowercased and tokenised with
    the Moses tokeniser (sacremoses, no aggressive hyphen splitting, no escaping), then BLEU over those tokens
    (sacreBLEU with tokenize="none", lowercase=True). fairseq's `generate.py --remove-bpe` scores the same way on
    data prepared by the Moses scripts (e.g. Wu et al. 2021, LividWo/Revisit-MMT). Not comparable with sacreBLEU's
    default (mixed case, 13a tokens on detokenised text): tokenised, lowercased BLEU is typically higher.

    Args:
        predictions: detokenised system outputs, one string per segment.
        references: the detokenised references, same length and order.
        lang: the target language code for the tokeniser's rules (e.g. "de").
    Returns:
        {"bleu": float 0-100, "signature": str}: the sacreBLEU signature with "+moses.<lang>" appended.
    Raises:
        ValueError: the two lists differ in length or are empty.
        ImportError: sacremoses is not installed (pip install sacremoses).
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions but {len(references)} references")
    if not predictions:
        raise ValueError("no predictions to score")
    try:
        from sacremoses import MosesTokenizer
    except ImportError:
        raise ImportError("the papers' BLEU needs sacremoses: pip install sacremoses") from None
    moses = MosesTokenizer(lang=lang)

    def tokens(text: str) -> str:
        return moses.tokenize(text.lower(), escape=False, return_str=True)

    bleu = sacrebleu.metrics.BLEU(tokenize="none", lowercase=True)
    score = bleu.corpus_score([tokens(t) for t in predictions], [[tokens(t) for t in references]])
    return {"bleu": round(score.score, 2), "signature": f"{bleu.get_signature()}|moses.{lang}"}


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
