"""Tests for scratch_transformer.tokenization (small corpora: each test takes well under a second)."""

from __future__ import annotations

import gzip
import random
import unicodedata
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from scratch_transformer.tokenization import (
    BASE_ALPHABET,
    SPECIAL_TOKENS,
    tokenizer_special_ids,
    train_tokenizer,
)

MULTI30K = Path("/work/shared/data/multi30k/raw")

SENTENCES = [
    "Ein Mann mit einem orangefarbenen Hut, der etwas anstarrt.",
    "Zwei Männer über Öl & Straße: «café», naïve — 3,5 €!",
    "A man in an orange hat starring at something.",
    "Příliš žluťoučký kůň úpěl ďábelské ódy.",  # Czech: seen only through BASE_ALPHABET
    "Où est l'hôtel « Le Cœur » ? Çà et là…".replace("…", "..."),  # "…" is not NFKC-stable
]


def _synthetic_corpus(n: int = 1500, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    de = ["Ein", "Mann", "Frau", "Hund", "spielt", "läuft", "über", "die", "Straße", "im", "Schnee", "mit", "einem",
          "Ball", "großen", "grünen", "Hut", "schön", "Öl", "Männer", "Kinder", "fröhlich", "Café", "und"]
    en = ["A", "man", "woman", "dog", "plays", "runs", "across", "the", "street", "in", "snow", "with", "a",
          "ball", "big", "green", "hat", "nice", "oil", "men", "children", "happy", "café", "and"]
    out = []
    for _ in range(n):
        words = de if rng.random() < 0.5 else en
        sent = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        out.append(sent + rng.choice([".", "!", "?", ","]))
    return out


def _multi30k_sample(n: int = 1000) -> list[str]:
    texts = []
    for lang in ("de", "en"):
        with gzip.open(MULTI30K / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            texts += [next(f).strip() for _ in range(n)]
    return texts


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    if (MULTI30K / "train.de.gz").is_file():
        return _multi30k_sample(1000)  # first 1000 lines per language: 2000 sentences
    return _synthetic_corpus()


@pytest.fixture(scope="module")
def tok(corpus):
    return train_tokenizer(corpus, vocab_size=1000, min_frequency=2, model_max_length=64)


def test_special_ids_are_0_to_3(tok):
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS.values()] == [0, 1, 2, 3]
    assert (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token) == ("<pad>", "<s>", "</s>", "<unk>")
    assert tokenizer_special_ids(tok) == {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 3}
    assert tok.padding_side == "right"
    assert tok.model_max_length == 64


def test_sentences_are_nfkc_stable():
    for s in SENTENCES:
        assert unicodedata.normalize("NFKC", s) == s


@pytest.mark.parametrize("sentence", SENTENCES)
def test_round_trip(tok, sentence):
    ids = tok(sentence).input_ids
    assert tok.unk_token_id not in ids
    assert tok.decode(ids, skip_special_tokens=True) == sentence


def test_nfkc_changes_are_the_only_difference(tok):
    # A non-breaking space (found in 44 Multi30k de training lines) and "…" are normalised.
    assert tok.decode(tok("Ein\u00a0Mann…").input_ids, skip_special_tokens=True) == "Ein Mann..."
    # A character never seen in training (and not in BASE_ALPHABET) becomes <unk> and is lost.
    ids = tok("Ein Ω-Mann").input_ids
    assert tok.unk_token_id in ids
    assert tok.decode(ids, skip_special_tokens=True) == "Ein -Mann"


def test_post_processor_appends_eos_only(tok):
    enc = tok("Ein Mann.")
    assert enc.input_ids[-1] == tok.eos_token_id
    assert enc.input_ids.count(tok.eos_token_id) == 1
    assert tok.bos_token_id not in enc.input_ids
    assert enc.input_ids[:-1] == tok("Ein Mann.", add_special_tokens=False).input_ids
    pair = tok("Ein Mann.", "A man.").input_ids
    assert pair.count(tok.eos_token_id) == 2 and pair[-1] == tok.eos_token_id


def test_padding_right_and_truncation_keeps_eos(tok):
    batch = tok(["Ein Mann.", "Zwei Männer über Öl & Straße."], padding=True)
    short = batch.input_ids[0]
    assert short[-1] == tok.pad_token_id and batch.attention_mask[0][-1] == 0
    long = tok(" ".join(["Hund"] * 200), truncation=True).input_ids
    assert len(long) == 64 and long[-1] == tok.eos_token_id


def test_vocab_size_at_most_requested(corpus, tok):
    assert len(tok) <= 1000
    small = train_tokenizer(corpus[:200], vocab_size=300, initial_alphabet=None)
    assert len(small) <= 300
    # Characters of BASE_ALPHABET are in the vocabulary even when the corpus lacks them.
    vocab = tok.get_vocab()
    assert all(c in vocab for c in "€«»ČŘžęł")
    assert len(BASE_ALPHABET) < 300


def test_save_and_auto_reload_identical(tmp_path, tok):
    tok.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer_special_ids(reloaded) == tokenizer_special_ids(tok)
    assert len(reloaded) == len(tok)
    assert reloaded.padding_side == "right"
    assert reloaded.model_max_length == tok.model_max_length
    for s in SENTENCES:
        assert reloaded(s).input_ids == tok(s).input_ids
        assert reloaded.decode(reloaded(s).input_ids, skip_special_tokens=True) == s
    assert reloaded(SENTENCES[0], SENTENCES[2]).input_ids == tok(SENTENCES[0], SENTENCES[2]).input_ids


def test_training_is_deterministic():
    corpus = _synthetic_corpus(1500, seed=1)
    a = train_tokenizer(corpus, vocab_size=500)
    b = train_tokenizer(iter(corpus), vocab_size=500)  # a one-shot iterator works too
    assert a.get_vocab() == b.get_vocab()
    assert a.backend_tokenizer.to_str() == b.backend_tokenizer.to_str()  # same merges, same everything


def test_bad_arguments():
    with pytest.raises(ValueError, match="too small"):
        train_tokenizer(["a b c"], vocab_size=10)
    with pytest.raises(ValueError, match="no non-empty"):
        train_tokenizer(["", ""], vocab_size=500)
    with pytest.raises(TypeError):
        train_tokenizer("just one string", vocab_size=500)
    with pytest.raises(TypeError):
        train_tokenizer(["ok", 3], vocab_size=500)
