"""A joint (shared source/target) BPE tokenizer trained with the `tokenizers` library.

Pipeline of the trained tokenizer:

* normaliser: NFKC (unifies compatibility characters, e.g. a non-breaking space becomes a
  plain space, "…" becomes "...", a decomposed "e" + U+0301 becomes the precomposed "é");
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
(e.g. "\\u00a0" -> " ", "…" -> "...", "ﬁ" -> "fi") and unseen characters are lost as ``<unk>``.
"""

from __future__ import annotations

import string
import unicodedata
from collections.abc import Iterable, Iterator

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

__all__ = ["SPECIAL_TOKENS", "BASE_ALPHABET", "train_tokenizer", "tokenizer_special_ids"]

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
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_REPLACEMENT, prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement=_REPLACEMENT, prepend_scheme="always")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=specials,
        initial_alphabet=alphabet,
        show_progress=False,
    )
    counter = _Counter(texts)
    tok.train_from_iterator(counter, trainer=trainer)
    if counter.n == 0:
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
