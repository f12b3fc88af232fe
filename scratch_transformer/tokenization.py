"""A joint (shared source/target) BPE tokenizer trained with the `tokenizers` library.

Trained from any iterable of strings (`train_tokenizer`) or from text columns of a `datasets.Dataset` read in
Arrow batches (`train_tokenizer_on_dataset`: no list of the corpus, an optional seeded cap on the rows, and the
result cached beside the dataset's Arrow files); the same text gives the same tokenizer either way.

Pipeline of the trained tokenizer:

* normaliser: format characters (Unicode category Cf: a zero-width space U+200B, a soft hyphen, a byte order
  mark, a zero-width joiner) are dropped ("Ein\\u200bMann" is "EinMann", not "Ein<unk>Mann"), then NFKC
  (unifies compatibility characters, e.g. a non-breaking space becomes a
  plain space, "…" becomes "...", a decomposed "e" + U+0301 becomes the precomposed "é"), then every
  run of whitespace (a newline, CRLF, a tab, repeated spaces) becomes one space: "Hunde\\nim" is
  "Hunde im" (tokenizers saved before this rule keep loading as they were; the pipeline and translate.py
  put one space for a newline themselves);
* pre-tokenizer: Metaspace (spaces become "▁", which starts each word), with the matching
  Metaspace decoder, so ``decode`` gives back ordinary text with single spaces;
* model: BPE with ``<unk>`` for characters never seen in training (and not in
  ``BASE_ALPHABET``);
* post-processor: appends ``</s>`` (single ``$A </s>``, pair ``$A </s> $B </s>``); no
  ``<s>`` is added: the model starts decoding from its decoder start token itself.

Special tokens have fixed ids: ``<pad>``=0, ``<s>``=1, ``</s>``=2, ``<unk>``=3.

Round trip: ``tok.decode(tok(x).input_ids, skip_special_tokens=True) == x`` holds for any
``x`` that is NFKC-stable (``unicodedata.normalize("NFKC", x) == x``), has no leading,
trailing or repeated whitespace other than single spaces, and whose characters were seen
in training or are in ``BASE_ALPHABET``. For other text the decode gives the NFKC form
(e.g. "\\u00a0" -> " ", "…" -> "...", "ﬁ" -> "fi", "\\n" -> " "). A character never seen (an emoji, a
script absent from training) is encoded as ``<unk>``: ``decode(..., skip_special_tokens=False)`` shows it,
and the pipeline and ``inference.translate`` (translate.py) warn, naming the characters
(``pipeline_scratch_transformer.unknown_characters``), since it is missing from the translation.
"""

from __future__ import annotations

import json
import logging
import os
import string
import tempfile
import unicodedata
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = ["SPECIAL_TOKENS", "BASE_ALPHABET", "train_tokenizer", "train_tokenizer_on_dataset", "tokenizer_special_ids",
           "tokenizer_fit_problem", "make_tokenizer_config_portable"]

logger = logging.getLogger(__name__)

# Order matters: the trainer gives them ids 0, 1, 2, 3 in this order.
SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}

# Characters that always get a vocabulary entry, even when the training text lacks them,
# so that e.g. "€" or "«" in a test sentence is not turned into <unk>: printable ASCII,
# the Latin-1 letters/signs and common typographic punctuation (all NFKC-stable).
BASE_ALPHABET: tuple[str, ...] = tuple(
    c
    for c in dict.fromkeys(
        string.ascii_letters
        + string.digits
        + string.punctuation
        + "".join(chr(i) for i in range(0xA1, 0x100))
        + "–—‘’‚“”„‹›«»•…€†‡‰′″ŒœŠšŽžŸčďěňřťůČĎĚŇŘŤŮąćęłńśźżĄĆĘŁŃŚŹŻőűŐŰ"
    )
    if unicodedata.normalize("NFKC", c) == c and c.isprintable()  # the NFKC normaliser would rewrite the others
)

_REPLACEMENT = "▁"  # U+2581, the Metaspace word-start marker
# The pipeline's version, part of the cache key of a tokenizer trained on a dataset: a new normaliser rule gets a new
# one, so that a cached tokenizer of the old rule is not reused (v2: whitespace runs as one space; v3: Cf dropped).
# A tokenizer.json saved before keeps its own normaliser, hence its ids.
TOKENIZER_VERSION = "bpe-v3"


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int = 256,
    initial_alphabet: Iterable[str] | None = BASE_ALPHABET,
) -> PreTrainedTokenizerFast:
    """Train a joint BPE tokenizer and wrap it as a ``PreTrainedTokenizerFast``.

    Args:
        texts: Training sentences; pass both languages' training split (joint vocabulary).
            Any iterable of strings (a list, a generator, a ``datasets`` column); it is
            consumed once. Empty strings are skipped.
        vocab_size: Upper bound on the vocabulary size, special tokens included. BPE may
            learn fewer tokens (small corpus, ``min_frequency``): use ``len(tokenizer)``
            as the model's ``vocab_size``.
        min_frequency: A pair must occur at least this often to be merged.
        model_max_length: Stored in the tokenizer; ``truncation=True`` cuts to it.
        initial_alphabet: Characters added to the vocabulary even if absent from
            ``texts`` (default ``BASE_ALPHABET``, ~230 characters; they count towards
            ``vocab_size``). ``None`` or empty: only characters seen in ``texts``.

    Returns:
        A ``PreTrainedTokenizerFast`` with pad/bos/eos/unk = ``<pad>``/``<s>``/``</s>``/
        ``<unk>`` at ids 0/1/2/3, ``padding_side="right"``, that appends ``</s>`` to every
        encoded sequence. ``save_pretrained`` + ``AutoTokenizer.from_pretrained`` reload it.
        Training is deterministic: the same texts and arguments give the same vocabulary.

    Raises:
        ValueError: ``vocab_size`` is too small for the special tokens and the initial
            alphabet, ``min_frequency`` < 1, ``model_max_length`` < 1, or ``texts``
            contains no non-empty string.
        TypeError: an element of ``texts`` is not a string.
    """
    return _train(_Counter(texts), None, vocab_size, min_frequency, model_max_length, initial_alphabet)


def train_tokenizer_on_dataset(
    dataset,
    columns: Sequence[str],
    max_sentences: int | None = None,
    seed: int = 0,
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int = 256,
    initial_alphabet: Iterable[str] | None = BASE_ALPHABET,
    batch_size: int = 1000,
    cache: bool = True,
) -> PreTrainedTokenizerFast:
    """`train_tokenizer` on string columns of a `datasets.Dataset`, read in batches (no list of the corpus).

    The texts are every sentence of ``columns[0]`` in row order, then of ``columns[1]``, ...: with no cap this
    is the same training text as ``train_tokenizer(list(dataset[c0]) + list(dataset[c1]))``, and gives the same
    tokenizer. With ``max_sentences`` N below the number of rows, N rows drawn at random (without replacement,
    by ``seed``) give their sentences of each column: at most N sentences per column, as sentencepiece's
    ``input_sentence_size`` caps a corpus; the draw is the same for the same (rows, N, seed).

    When ``cache`` is on, `datasets` caching is enabled and the dataset lives in cache files (a memory-mapped
    split), the trained tokenizer is saved beside them as ``tokenizer-{key}.json``, the key hashing the
    dataset's fingerprint and every argument above (and the `tokenizers` version); a later call with the same
    key loads that file instead of training (logged at INFO), which gives the same tokenizer.

    Args:
        dataset: a `datasets.Dataset` holding the string columns ``columns``.
        columns: one or more column names, e.g. ``["de", "en"]`` (a joint vocabulary of both languages).
        max_sentences: ``None`` (every row) or N >= 1 rows to sample.
        seed: draws the sampled rows (unused without a cap).
        vocab_size, min_frequency, model_max_length, initial_alphabet: as for `train_tokenizer`.
        batch_size: rows read from Arrow at a time.
        cache: save and reuse the trained tokenizer beside the dataset's cache files.

    Returns:
        The tokenizer of `train_tokenizer`.

    Raises:
        ValueError: a column is missing, ``columns`` is empty, ``max_sentences`` or ``batch_size`` < 1, or an
            error of `train_tokenizer` (no non-empty text, a too small vocab_size, ...).
        TypeError: a value of a column is neither a string nor missing.
    """
    if isinstance(columns, str):
        columns = [columns]
    columns = list(columns)
    names = getattr(dataset, "column_names", None)
    if not columns:
        raise ValueError("columns is empty: name the text column(s) to train on")
    if names is None:
        raise TypeError(f"dataset must be a datasets.Dataset, got {type(dataset).__name__}")
    missing = [c for c in columns if c not in names]
    if missing:
        raise ValueError(f"column(s) {missing} not in the dataset; its columns: {names}")
    if max_sentences is not None and (isinstance(max_sentences, bool) or not isinstance(max_sentences, int)
                                      or max_sentences < 1):
        raise ValueError(f"max_sentences must be None (all rows) or a whole number >= 1, got {max_sentences!r}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")

    path = _cache_path(dataset, columns, max_sentences, seed, vocab_size, min_frequency, model_max_length,
                       initial_alphabet) if cache else None
    if path is not None and os.path.isfile(path):
        logger.info("tokenizer: reusing the one trained on the same data and settings: %s", path)
        return _wrap(Tokenizer.from_file(path), model_max_length)

    rows = None
    if max_sentences is not None and max_sentences < len(dataset):
        rows = np.sort(np.random.default_rng(seed).choice(len(dataset), size=max_sentences, replace=False))
        dataset = dataset.select(rows, keep_in_memory=True)  # an indices mapping; the text stays on disk
    length = len(dataset) * len(columns)
    tokenizer = _train(_BatchCounter(dataset, columns, batch_size), length, vocab_size, min_frequency,
                       model_max_length, initial_alphabet)
    logger.info("trained the tokenizer on %s", f"{length} sentences" if rows is None else
                f"{length} sentences of {len(rows)} rows drawn with seed {seed} (max_sentences {max_sentences})")
    if path is not None:
        folder = os.path.dirname(path)
        with tempfile.NamedTemporaryFile("w", dir=folder, prefix=".tokenizer-", suffix=".json", delete=False) as f:
            temporary = f.name
        tokenizer.backend_tokenizer.save(temporary)
        os.replace(temporary, path)  # whole or not at all: a killed run leaves no half-written tokenizer
        logger.info("tokenizer cached at %s", path)
    return tokenizer


def _cache_path(dataset, columns, max_sentences, seed, vocab_size, min_frequency, model_max_length,
                initial_alphabet) -> str | None:
    """Where the tokenizer trained with these settings on ``dataset`` is cached; None if it cannot be (an
    in-memory dataset, or `datasets` caching disabled)."""
    import datasets
    from datasets.fingerprint import Hasher

    files = getattr(dataset, "cache_files", None)
    if not files or not datasets.is_caching_enabled() or not getattr(dataset, "_fingerprint", None):
        return None
    key = Hasher.hash([TOKENIZER_VERSION, dataset._fingerprint, columns, max_sentences, seed if max_sentences else None,
                       vocab_size, min_frequency, model_max_length, sorted(set(initial_alphabet or ())),
                       tokenizers.__version__])
    return os.path.join(os.path.dirname(files[0]["filename"]), f"tokenizer-{key}.json")


def _train(texts: Iterable[str | list[str]], length: int | None, vocab_size: int, min_frequency: int,
           model_max_length: int, initial_alphabet: Iterable[str] | None) -> PreTrainedTokenizerFast:
    """Check the settings, train BPE on ``texts`` (strings or batches of strings, counted as they pass: a
    `_Counter` or `_BatchCounter`) and wrap the result."""
    alphabet = sorted(set(initial_alphabet or ()))
    if any(len(c) != 1 for c in alphabet):
        raise ValueError("initial_alphabet must contain single characters")
    min_vocab = len(SPECIAL_TOKENS) + len(alphabet) + 1  # +1: the "▁" word marker
    if vocab_size < min_vocab:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: {len(SPECIAL_TOKENS)} special tokens + "
            f"{len(alphabet)} initial_alphabet characters need at least {min_vocab} "
            "(pass a smaller initial_alphabet, or None)"
        )
    if min_frequency < 1:
        raise ValueError(f"min_frequency must be >= 1, got {min_frequency}")
    if model_max_length < 1:
        raise ValueError(f"model_max_length must be >= 1, got {model_max_length}")

    specials = list(SPECIAL_TOKENS.values())
    tok = Tokenizer(models.BPE(unk_token=SPECIAL_TOKENS["unk_token"]))
    # format characters (Unicode Cf: a zero-width space, a soft hyphen, a byte order mark) dropped, NFKC, then any run
    # of whitespace (a newline, CRLF, a tab) as one space: "Hunde\nim" is two words, not "Hundeim"; "Ein\u200bMann"
    # is "EinMann", not "Ein<unk>Mann"
    tok.normalizer = normalizers.Sequence([normalizers.Replace(tokenizers.Regex(r"\p{Cf}"), ""), normalizers.NFKC(),
                                           normalizers.Replace(tokenizers.Regex(r"\s+"), " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_REPLACEMENT, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=_REPLACEMENT, prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=length)
    release_freed_memory()
    if texts.n == 0:
        raise ValueError("train_tokenizer got no non-empty training text")

    ids = {name: tok.token_to_id(token) for name, token in SPECIAL_TOKENS.items()}
    expected = {name: i for i, name in enumerate(SPECIAL_TOKENS)}
    if ids != expected:  # guaranteed by BpeTrainer (special tokens first, in order)
        raise RuntimeError(f"special token ids are {ids}, expected {expected}")

    eos = SPECIAL_TOKENS["eos_token"]
    tok.post_processor = processors.TemplateProcessing(
        single=f"$A {eos}",
        pair=f"$A {eos} $B:1 {eos}:1",
        special_tokens=[(eos, ids["eos_token"])],
    )
    return _wrap(tok, model_max_length)


def release_freed_memory() -> bool:
    """Return the C heap's free pages to the operating system: glibc's malloc_trim(0), where the C library has
    it (Linux with glibc); nothing elsewhere. Returns whether it was called.

    BPE training frees its word counts into glibc's per-thread arenas, which keep them resident: at 1,000,000
    synthetic WMT-like pairs 0.7 GB stayed in the process after training and added to the peak of the first
    training step (benchmarks/data_scale.py: 5.5 GB without the trim, 5.0 GB with it, 2026-12-01, AMD EPYC)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


def _wrap(tok: Tokenizer, model_max_length: int) -> PreTrainedTokenizerFast:
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,  # keep "Hut , der" as written; decode is exact
        **SPECIAL_TOKENS,
    )


def tokenizer_special_ids(tok: PreTrainedTokenizerBase) -> dict[str, int]:
    """Special token ids of ``tok`` as config keyword arguments.

    Returns:
        ``{"pad_token_id": ..., "bos_token_id": ..., "eos_token_id": ..., "unk_token_id": ...}``
        (0, 1, 2, 3 for a tokenizer from :func:`train_tokenizer`), e.g. for
        ``MyConfig(vocab_size=len(tok), **tokenizer_special_ids(tok))``.

    Raises:
        ValueError: the tokenizer lacks one of these special tokens.
    """
    out = {f"{name}_id": getattr(tok, f"{name}_id") for name in SPECIAL_TOKENS}
    missing = [k for k, v in out.items() if v is None]
    if missing:
        raise ValueError(f"tokenizer has no {missing}; special tokens: {tok.special_tokens_map}")
    return out


def tokenizer_fit_problem(config, tokenizer, own_tokenizer=None) -> str | None:
    """Why `tokenizer` does not fit a model of `config` (a config object or its dict), or None when it does.

    It does not fit when it has more tokens than the model's vocab_size (those ids have no embedding), when its
    pad / eos / bos ids differ from the config's (the model would pad, stop or start with another token), or,
    given the tokenizer the model was trained with (`own_tokenizer`), when its vocabulary differs from that one
    (the same id would name another token: the embeddings read the wrong words). The message names the sizes,
    the ids or a token whose id differs, e.g. "the tokenizer has 9000 tokens but the model's vocabulary 8000"."""
    def value(name):
        return config.get(name) if isinstance(config, dict) else getattr(config, name, None)

    vocab_size = value("vocab_size")
    if vocab_size is not None and len(tokenizer) > vocab_size:
        return (f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary {vocab_size} (vocab_size): "
                f"ids from {vocab_size} on have no embedding")
    for name in ("pad_token_id", "eos_token_id", "bos_token_id"):
        expected, given = value(name), getattr(tokenizer, name, None)
        if expected is not None and given is not None and expected != given:
            return f"the tokenizer's {name} is {given} but the model's is {expected} (special ids differ)"
    if own_tokenizer is not None:
        own, other = own_tokenizer.get_vocab(), tokenizer.get_vocab()
        if own != other:
            moved = sorted((token for token in other if own.get(token) != other[token]), key=lambda t: other[t])
            example = next((t for t in moved if t in own), moved[0] if moved else None)
            where = (f"e.g. {example!r} is {other[example]} here, {own[example]} in the model's own"
                     if example in own else f"e.g. {example!r} ({other.get(example)}) is not in the model's own")
            return (f"its vocabulary is not the one the model was trained with: {len(moved)} of {len(other)} tokens "
                    f"have another id ({where}); the embeddings would read other words")
    return None


# What transformers 5 writes as the class of a tokenizer.json tokenizer, and the name transformers 4.x knows it by
# (5 reads that name too: its transformers.PreTrainedTokenizerFast is TokenizersBackend).
_V5_ONLY_CLASS, _PORTABLE_CLASS = "TokenizersBackend", "PreTrainedTokenizerFast"
_MODEL_INPUT_NAMES = ["input_ids", "attention_mask"]


def make_tokenizer_config_portable(folder: str | os.PathLike) -> bool:
    """Make the tokenizer saved in ``folder`` load with ``AutoTokenizer`` on transformers 4.x as on 5.x.

    transformers 5 writes ``"tokenizer_class": "TokenizersBackend"`` into tokenizer_config.json, a class 4.x does
    not have ("Tokenizer class TokenizersBackend does not exist"); it becomes ``"PreTrainedTokenizerFast"``,
    4.x's class for a tokenizer.json, which 5 loads as the same TokenizersBackend. And 4.x's class also returns
    ``token_type_ids``, which generate() refuses: ``"model_input_names": ["input_ids", "attention_mask"]`` (what
    5 returns) is written where none is. The main job calls this on every folder it saves (the Trainer's
    ``save_model``); the file is replaced whole (a temporary file renamed over it).

    Returns:
        True when tokenizer_config.json was changed; False when there is none or it already loads on both.
    """
    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.isfile(path):
        return False
    with open(path, encoding="utf-8") as f:
        config = json.load(f)
    changed = dict(config)
    if changed.get("tokenizer_class") == _V5_ONLY_CLASS:
        changed["tokenizer_class"] = _PORTABLE_CLASS
    changed.setdefault("model_input_names", _MODEL_INPUT_NAMES)
    if changed == config:
        return False
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, prefix=".tokenizer_config-", suffix=".json",
                                     delete=False) as f:
        json.dump(changed, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")
    os.replace(f.name, path)
    return True


class _Counter:
    """Iterates over non-empty training texts and counts them (to detect an empty corpus)."""

    def __init__(self, texts: Iterable[str]):
        if isinstance(texts, str):
            raise TypeError("texts must be an iterable of strings, not a single string")
        self._texts = texts
        self.n = 0

    def __iter__(self) -> Iterator[str]:
        for i, text in enumerate(self._texts):
            if not isinstance(text, str):
                raise TypeError(f"texts[{i}] is {type(text).__name__}, expected str")
            if text:
                self.n += 1
                yield text


class _BatchCounter:
    """Iterates over the non-empty texts of columns of a `datasets.Dataset`, a batch (list) at a time, column
    after column, and counts them; missing values (None) are skipped like empty strings."""

    def __init__(self, dataset, columns: Sequence[str], batch_size: int):
        self._dataset, self._columns, self._batch_size = dataset, columns, batch_size
        self.n = 0

    def __iter__(self) -> Iterator[list[str]]:
        for column in self._columns:
            data = self._dataset.select_columns([column])
            for start in range(0, len(data), self._batch_size):
                values = data[start : start + self._batch_size][column]
                texts = [text for text in values if text]
                bad = next((text for text in texts if not isinstance(text, str)), None)
                if bad is not None:
                    raise TypeError(f"column {column!r} holds a {type(bad).__name__}, expected str")
                self.n += len(texts)
                if texts:
                    yield texts
