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
    train_tokenizer_on_dataset,
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


# ---------------------------------------------------------------------------------------
# training from a datasets.Dataset (Arrow batches), with a cap and a cache
# ---------------------------------------------------------------------------------------


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    """The datasets cache inside tmp_path (the Arrow files of the folders loaded, and the cached tokenizers)."""
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_datasets_cache")
    datasets.disable_progress_bars()
    yield tmp_path / "hf_datasets_cache"
    datasets.enable_progress_bars()


def _parallel_folder(folder: Path, pairs: list[tuple[str, str]]) -> Path:
    folder.mkdir()
    for index, lang in enumerate(("de", "en")):
        (folder / f"train.{lang}").write_text("".join(pair[index] + "\n" for pair in pairs), encoding="utf-8")
    return folder


def _split(tmp_path, datasets_cache):
    """Multi30k's training split as the main job loads it (memory-mapped), or a synthetic one without it."""
    from scratch_transformer.data import load_translation_dataset

    if MULTI30K.is_dir():
        return load_translation_dataset(str(MULTI30K), "de", "en", splits=["train"])["train"]
    corpus = _synthetic_corpus(4000, seed=3)
    folder = _parallel_folder(tmp_path / "synthetic", list(zip(corpus[::2], corpus[1::2])))
    return load_translation_dataset(str(folder), "de", "en")["train"]


def test_training_on_a_dataset_gives_the_tokenizer_of_the_list_of_both_languages(tmp_path, datasets_cache):
    """The main job's tokenizer, once trained on list(train['de']) + list(train['en']), now on Arrow batches:
    the same tokenizer.json (merges, vocabulary, pipeline), at the main job's settings."""
    train = _split(tmp_path, datasets_cache)
    settings = dict(vocab_size=8000, min_frequency=2, model_max_length=128)
    old = train_tokenizer(list(train["de"]) + list(train["en"]), **settings)
    new = train_tokenizer_on_dataset(train, ["de", "en"], **settings)
    assert new.backend_tokenizer.to_str() == old.backend_tokenizer.to_str()
    assert new.get_vocab() == old.get_vocab() and len(new) == len(old)
    capped_above = train_tokenizer_on_dataset(train, ["de", "en"], max_sentences=len(train) + 5, cache=False,
                                              **settings)
    assert capped_above.backend_tokenizer.to_str() == old.backend_tokenizer.to_str()  # a cap above the rows: all


def test_the_cap_trains_on_the_sentences_of_a_seeded_draw_of_rows(tmp_path, datasets_cache):
    """max_sentences N: both sides of N rows drawn by the seed (numpy default_rng(seed).choice without
    replacement); each row's words are unique, so the vocabulary shows which rows were read."""
    import datasets
    import numpy as np

    rng = random.Random(0)
    words = ["".join(rng.choice("bcdfghjklmnpqrstvwxz") for _ in range(7)) for _ in range(200)]
    rows = datasets.Dataset.from_dict({"de": words[:100], "en": words[100:]})
    settings = dict(vocab_size=3000, min_frequency=1, initial_alphabet=None, cache=False)
    tok = train_tokenizer_on_dataset(rows, ["de", "en"], max_sentences=10, seed=5, **settings)
    seen = sorted(i for i in range(100) if "▁" + words[i] in tok.get_vocab())
    assert seen == sorted(np.random.default_rng(5).choice(100, size=10, replace=False).tolist())
    assert all(("▁" + words[100 + i] in tok.get_vocab()) == (i in seen) for i in range(100))  # the pairs' other side
    same = train_tokenizer_on_dataset(rows, ["de", "en"], max_sentences=10, seed=5, **settings)
    other = train_tokenizer_on_dataset(rows, ["de", "en"], max_sentences=10, seed=6, **settings)
    assert same.backend_tokenizer.to_str() == tok.backend_tokenizer.to_str()
    assert other.get_vocab() != tok.get_vocab()


def test_a_trained_tokenizer_is_reused_from_the_datasets_cache(tmp_path, datasets_cache, monkeypatch, caplog):
    """Trained once per (split fingerprint, settings), saved beside the split's Arrow files; the second call
    trains nothing and gives the same tokenizer; other settings or an in-memory split train anew."""
    import logging

    import datasets

    from scratch_transformer import tokenization
    from scratch_transformer.data import load_translation_dataset

    corpus = _synthetic_corpus(600, seed=4)
    folder = _parallel_folder(tmp_path / "pairs", list(zip(corpus[::2], corpus[1::2])))
    train = load_translation_dataset(str(folder), "de", "en")["train"]
    first = train_tokenizer_on_dataset(train, ["de", "en"], vocab_size=500)
    cached = list(Path(train.cache_files[0]["filename"]).parent.glob("tokenizer-*.json"))
    assert len(cached) == 1

    def no_training(*args, **kwargs):
        raise AssertionError("the tokenizer was trained again")

    reloaded = load_translation_dataset(str(folder), "de", "en")["train"]  # a new run: the same fingerprint
    with monkeypatch.context() as patched, caplog.at_level(logging.INFO, logger="scratch_transformer.tokenization"):
        patched.setattr(tokenization, "_train", no_training)
        again = train_tokenizer_on_dataset(reloaded, ["de", "en"], vocab_size=500)
    assert again.backend_tokenizer.to_str() == first.backend_tokenizer.to_str()
    assert [again(s).input_ids for s in SENTENCES] == [first(s).input_ids for s in SENTENCES]
    assert any("reusing" in r.getMessage() and str(cached[0]) in r.getMessage() for r in caplog.records)

    train_tokenizer_on_dataset(train, ["de", "en"], vocab_size=400)  # other settings: trained, a second file
    train_tokenizer_on_dataset(train, ["de", "en"], vocab_size=400, max_sentences=50, seed=1)
    assert len(list(cached[0].parent.glob("tokenizer-*.json"))) == 3
    in_memory = datasets.Dataset.from_dict(train.to_dict())
    with monkeypatch.context() as patched:
        patched.setattr(tokenization, "_train", no_training)
        with pytest.raises(AssertionError, match="trained again"):  # no cache files: no cache
            train_tokenizer_on_dataset(in_memory, ["de", "en"], vocab_size=500)


def test_bad_dataset_arguments():
    import datasets

    rows = datasets.Dataset.from_dict({"de": ["ein Hund"], "en": ["a dog"], "n": [3]})
    with pytest.raises(ValueError, match=r"column\(s\) \['fr'\] not in the dataset; its columns: \['de', 'en', 'n'\]"):
        train_tokenizer_on_dataset(rows, ["de", "fr"], vocab_size=500)
    with pytest.raises(ValueError, match="columns is empty"):
        train_tokenizer_on_dataset(rows, [], vocab_size=500)
    for bad in (0, -3, True, 2.5):
        with pytest.raises(ValueError, match="max_sentences must be None"):
            train_tokenizer_on_dataset(rows, ["de", "en"], max_sentences=bad, vocab_size=500)
    with pytest.raises(TypeError, match="column 'n' holds a int, expected str"):
        train_tokenizer_on_dataset(rows, ["de", "n"], vocab_size=500, cache=False)
    with pytest.raises(TypeError, match="datasets.Dataset"):
        train_tokenizer_on_dataset(["ein Hund"], ["de"], vocab_size=500)
    with pytest.raises(ValueError, match="no non-empty"):
        train_tokenizer_on_dataset(datasets.Dataset.from_dict({"de": ["", None]}), ["de"], vocab_size=500)


def test_release_freed_memory_returns_freed_heap_pages_to_the_os():
    """After 200 MB of small C allocations are freed behind one that stays (so that glibc cannot shrink the heap
    from its top by itself), release_freed_memory (run after BPE training) gives most of them back. In a child
    process, so that this process's heap does not matter."""
    import subprocess
    import sys

    code = (
        "import ctypes, ctypes.util\n"
        "from scratch_transformer.tokenization import release_freed_memory\n"
        "libc = ctypes.CDLL(ctypes.util.find_library('c'))\n"
        "libc.malloc.restype = ctypes.c_void_p\n"
        "libc.free.argtypes = [ctypes.c_void_p]\n"
        "def anon():\n"
        "    return next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('RssAnon')) // 1024\n"
        "blocks = [libc.malloc(1024) for _ in range(200_000)]\n"
        "for b in blocks: ctypes.memset(b, 1, 1024)\n"
        "pin = libc.malloc(1024)\n"
        "for b in blocks: libc.free(b)\n"
        "before = anon()\n"
        "assert release_freed_memory()\n"
        "print(before - anon())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert int(proc.stdout.strip()) > 100  # MB given back


@pytest.mark.parametrize("space", ["\n", "\r\n", "\t", "\u2028"])
def test_a_newline_inside_a_sentence_is_a_space(tok, space):
    """"Hunde\\nim" was read as "Hundeim": the newline was an unseen character, dropped as <unk>."""
    text = f"Zwei Hunde{space}im Schnee."
    assert tok(text)["input_ids"] == tok("Zwei Hunde im Schnee.")["input_ids"]
    assert tok.decode(tok(text)["input_ids"], skip_special_tokens=True) == "Zwei Hunde im Schnee."


def test_an_unseen_character_is_unk_named_and_kept_in_the_ids(tok):
    """An emoji never seen in training is <unk> (not dropped without a trace): the ids hold it, a decode that
    keeps special tokens shows it, and unknown_characters names it, as the pipeline's and translate()'s warning
    do."""
    from scratch_transformer.pipeline_scratch_transformer import unknown_characters

    ids = tok("Ein Hund 😀 spielt ☃.")["input_ids"]
    assert ids.count(tok.unk_token_id) == 2
    assert tok.decode(ids, skip_special_tokens=False) == "Ein Hund <unk> spielt <unk>.</s>"
    found = unknown_characters(tok, ["Ein Hund 😀 spielt ☃.", "Ein Hund.", "😀😀"])
    assert found == [["😀", "☃"], [], ["😀"]]


def test_a_tokenizer_saved_before_the_newline_rule_loads_and_encodes_as_before(tmp_path, tok):
    """Saved tokenizers (NFKC only) keep loading; they read the same ids for text without other whitespace."""
    import json

    from tokenizers import Tokenizer, normalizers

    state = json.loads(tok.backend_tokenizer.to_str())
    assert [n["type"] for n in state["normalizer"]["normalizers"]] == ["Replace", "NFKC", "Replace"]
    old = Tokenizer.from_str(tok.backend_tokenizer.to_str())
    old.normalizer = normalizers.NFKC()
    tok.save_pretrained(tmp_path)
    old.save(str(tmp_path / "tokenizer.json"))
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    assert json.loads(loaded.backend_tokenizer.to_str())["normalizer"]["type"] == "NFKC"
    for sentence in SENTENCES:
        assert loaded(sentence)["input_ids"] == tok(sentence)["input_ids"]
