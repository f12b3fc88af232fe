"""Loading parallel text as a :class:`datasets.DatasetDict` with one column per language.

Every input form ends up in the same shape: each split has exactly two string columns,
named after the source and target language (for example ``"de"`` and ``"en"``), with
surrounding whitespace stripped and pairs where either side is empty removed (and
counted in a log message). Tokenisation happens elsewhere.

Nothing holds a corpus as Python lists: every form is read by a `datasets` builder or generator into Arrow
files of the `datasets` cache, memory-mapped, and normalised by a batched ``map`` whose result is cached too
(stable fingerprints: a rerun on the same files reads no text). A folder's files are read line by line by
``Dataset.from_generator``, under a fingerprint of their paths, sizes and modification times.

Input forms (see :func:`load_translation_dataset`):

* a folder of line-aligned files ``{split}.{lang}`` or ``{split}.{lang}.gz``
  (for example the Multi30k ``raw`` folder: ``train.de.gz`` + ``train.en.gz``);
* a ``.jsonl`` / ``.json`` / ``.csv`` file (optionally ``.gz``), or an explicit
  ``data_files`` mapping ``split -> file(s)``;
* a Hugging Face Hub dataset id (with an optional config name such as ``"de-en"``).

Rows of JSON/CSV/Hub data may have either of two shapes: wmt16 style
``{"translation": {"de": ..., "en": ...}}`` or one column per language
``{"de": ..., "en": ...}``.
"""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import logging
import os
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import datasets
from datasets.exceptions import DatasetGenerationError
from datasets.fingerprint import Hasher

from .paths import local_parent

logger = logging.getLogger(__name__)

__all__ = ["load_translation_dataset", "release_mapped_pages"]

# Rows per Arrow record batch in the files of the text that this module writes (a folder's lines, and every
# split once normalised); `datasets` writes 1000, its default. Opening a memory-mapped Arrow file reads the
# header of every record batch, spread over the file: a rerun on 1M pairs from an empty page cache spent 10.7 s
# opening them with 1000 rows a batch, 3.2 s with 10000 (2 AMD EPYC cores, 2026-12-02, `python -m
# benchmarks.data_scale --pairs 1000000 --cold_rerun`). The tokenised splits keep the default: in one run
# their map tokenised 1M pairs 30% slower in batches of 10000, and they opened only 0.2 s faster.
ARROW_BATCH_ROWS = 10_000

# File endings understood by the "json" and "csv" builders of `datasets` (a trailing
# ".gz" is allowed on top: `datasets` decompresses it on the fly).
_FILE_BUILDERS = {".jsonl": "json", ".json": "json", ".csv": "csv"}

# Suffixes that can never be a language code of a `{split}.{lang}` file, so that files such
# as README.md or notes.txt lying in a data folder are not mistaken for a language.
_NON_LANGUAGE_SUFFIXES = frozenset(
    {"md", "txt", "rst", "json", "jsonl", "csv", "tsv", "yaml", "yml", "py", "sh", "gz", "zip", "tar", "lock",
     "arrow", "parquet", "log", "html", "xml", "sgm", "pdf"}
)

MULTI30K_HINT = ("Multi30k: clone https://github.com/multi30k/dataset and pass its data/task1/raw folder with "
                 "--dataset_name, or train on the Hub copy: --dataset_name bentrevett/multi30k --validation_split "
                 "validation --test_split test")

# Feature type of free-form JSON values (datasets >= 5); an empty tuple matches nothing.
_JSON_FEATURE = getattr(datasets, "Json", ())

# Order used when all splits of a folder are loaded: training first, then the usual
# validation names, then everything else alphabetically.
_SPLIT_ORDER = {"train": 0, "val": 1, "valid": 1, "validation": 1, "dev": 1}


# --------------------------------------------------------------------------------------
# public API
# --------------------------------------------------------------------------------------


def load_translation_dataset(
    dataset: str | os.PathLike | None,
    src_lang: str,
    tgt_lang: str,
    splits: Sequence[str] | None = None,
    dataset_config_name: str | None = None,
    data_files: Mapping[str, str | list[str]] | None = None,
    max_samples: Mapping[str, int] | None = None,
) -> datasets.DatasetDict:
    """Load parallel text as a ``DatasetDict`` with exactly the columns ``src_lang`` and ``tgt_lang``.

    Args:
        dataset: Where the data lives. One of

            * an existing local folder holding line-aligned files ``{split}.{lang}`` or
              ``{split}.{lang}.gz`` (line *i* of ``train.de`` translates line *i* of
              ``train.en``); the split names are taken from the file names;
            * an existing local ``.jsonl`` / ``.json`` / ``.csv`` file (``.gz`` allowed),
              loaded as the single split ``"train"``;
            * ``"json"``, ``"csv"`` or ``None`` together with ``data_files``: the data are
              those files (the builder is chosen from their suffixes, not from this name);
            * anything else that does not look like a local path is taken as a Hugging
              Face Hub dataset id and loaded with ``datasets.load_dataset(dataset,
              dataset_config_name)``. ``owner/name`` is a local path when a folder
              ``owner`` exists in the working directory.
        src_lang: Source language code, e.g. ``"de"``; becomes the first column.
        tgt_lang: Target language code, e.g. ``"en"``; becomes the second column.
        splits: Splits to return, e.g. ``("train", "val", "test_2016_flickr")``, in that
            order. ``None`` returns every split found (for a folder: every split that has
            files for both languages).
        dataset_config_name: Config name of a Hub dataset (e.g. ``"de-en"`` for wmt16).
            Ignored for local folders and files.
        data_files: Explicit ``split -> file or list of files`` of JSON Lines / JSON / CSV
            data. The `datasets` builder is chosen from the file suffixes (``.jsonl`` and
            ``.json``: "json", ``.csv``: "csv", each optionally ``.gz``), also when
            ``dataset`` is ``"json"`` or ``"csv"``; all files must have the same type. If
            ``dataset`` is a local folder, relative paths are resolved against it; if it is a
            Hub id, the files are looked up in that Hub repository (``load_dataset(dataset,
            config, data_files=...)``, builder and checks left to `datasets`).
        max_samples: Optional cap per split, ``{"train": 1000}``: keeps the first N rows of
            that split as read (before empty pairs are dropped, so a split can end up with
            slightly fewer than N rows). Splits not named are not capped; a split capped
            at 0 is returned empty.

    Returns:
        A ``datasets.DatasetDict`` whose every split has exactly two ``string`` columns
        ``[src_lang, tgt_lang]``, whitespace stripped, with no empty side. Pairs where
        either side is empty or whitespace-only are dropped and their number is logged
        (WARNING, logger ``scratch_transformer.data``).

    Raises:
        FileNotFoundError: a local path (the ``dataset`` argument, also ``owner/name``
            where the folder ``owner`` exists, or a file of ``data_files``) does not exist, or
            a file of ``data_files`` is a folder; a
            folder has no ``{split}.{lang}[.gz]`` files at all; a requested split of a folder
            lacks the file of one language (files of that split that are not read, such as
            ``train.en.bz2``, are named).
        ValueError: the two sides of a split have different line counts (both files and
            both counts are named); a split has no rows, or none left once empty pairs are
            dropped (the split and its file(s) are named; not for a split capped at 0);
            ``src_lang``/``tgt_lang`` is not present (the file and the languages, or for
            one-column-per-language data the columns, that are present are named); a
            requested split does not exist (the splits found are listed, and so are a folder's
            files of that split that are not read, such as ``val.de.bz2``); a file is not
            valid UTF-8 (file, line and byte named) or not a valid or a truncated gzip file
            (file named); a JSON Lines / JSON file is not valid JSON or has a row that is
            not an object (file, line and column named); a CSV row has more fields than the
            header, or the CSV files of one split have different headers (files and line
            named); a ``data_files`` file has an unsupported suffix, or the files mix JSON
            and CSV (the file(s) and the supported suffixes are named); the data has neither
            row shape; bad arguments (same source and target language, negative
            ``max_samples``, ...).
        Errors of ``datasets.load_dataset`` itself (e.g. an unknown Hub id, or a failure
            the files do not explain) propagate.
    """
    _check_languages(src_lang, tgt_lang)
    if isinstance(splits, str):  # a bare string would be iterated character by character
        splits = [splits]
    if splits is not None:
        splits = list(splits)
        if not splits:
            raise ValueError("splits is empty: pass None to load every split, or name at least one")
        if len(set(splits)) != len(splits):
            raise ValueError(f"splits contains duplicates: {splits}")
    if max_samples is not None:
        for name, cap in max_samples.items():
            if isinstance(cap, bool) or not isinstance(cap, int) or cap < 0:
                raise ValueError(f"max_samples[{name!r}] must be a non-negative int, got {cap!r}")
    if dataset is None and data_files is not None:
        dataset = "json"  # files only: the builder is picked from their suffixes either way
    if not isinstance(dataset, (str, os.PathLike)) or not str(dataset):
        raise ValueError(f"dataset must be a non-empty string (Hub id, folder or file), got {dataset!r}")
    dataset = os.fspath(dataset)
    local = os.path.expanduser(dataset)

    # sources: split -> the local file(s) it was read from, for messages about one split
    sources: dict[str, list[str]] = {}
    if data_files is not None:
        raw, origin, sources = _load_data_files(dataset, data_files, dataset_config_name)
    elif os.path.isdir(local):
        raw, sources = _load_parallel_folder(local, src_lang, tgt_lang, splits)
        origin = local
    elif os.path.isfile(local):
        raw, origin = _load_data_file(local), local
        sources = {"train": [local]}
    elif dataset.lower() in ("json", "csv"):
        raise ValueError(f"dataset={dataset!r} needs data_files={{split: file(s)}}")
    elif _looks_like_local_path(dataset):
        raise FileNotFoundError(
            f"dataset {dataset!r} looks like a local path but does not exist{_parent_note(dataset)} "
            "(expected a folder of {split}.{lang}[.gz] files or a .jsonl/.json/.csv file)"
            + (f". {MULTI30K_HINT}" if "multi30k" in dataset.lower() else "")
        )
    else:
        logger.info("loading Hub dataset %r (config %r)", dataset, dataset_config_name)
        raw = datasets.load_dataset(dataset, name=dataset_config_name)
        origin = f"Hub dataset {dataset!r}" + (f" config {dataset_config_name!r}" if dataset_config_name else "")

    if not isinstance(raw, datasets.DatasetDict):
        raise ValueError(f"expected a DatasetDict from {origin}, got {type(raw).__name__}")

    available = list(raw.keys())
    if splits is None:
        splits = available
    unknown = [s for s in splits if s not in raw]
    if unknown:
        raise ValueError(f"unknown split(s) {unknown} in {origin}; splits found: {available}")
    if max_samples:
        typos = [s for s in max_samples if s not in raw]
        if typos:
            raise ValueError(f"max_samples names unknown split(s) {typos} in {origin}; splits found: {available}")

    out = datasets.DatasetDict()
    for split in splits:
        ds = raw[split]
        source = ", ".join(sources[split]) if split in sources else origin
        cap = max_samples.get(split) if max_samples else None
        if cap == 0:  # asked for explicitly: an empty split
            out[split] = _normalize_split(ds.select([]), src_lang, tgt_lang, split=split, origin=source)
            continue
        if len(ds) == 0:
            raise ValueError(f"split {split!r} is empty: no rows in {source}")
        if cap is not None and cap < len(ds):
            ds = ds.select(range(cap))
        try:
            out[split] = _normalize_split(ds, src_lang, tgt_lang, split=split, origin=source)
        except UnicodeDecodeError:
            # pyarrow's JSON reader keeps invalid UTF-8 as it is; it only fails when read here.
            for path in sources.get(split, []):
                if os.path.isfile(path):
                    _read_text(path)  # raises a ValueError naming the file, line and byte
            raise
        if len(out[split]) == 0:
            read = f"{len(ds)} read" + (f", max_samples={cap}" if cap is not None and cap <= len(ds) else "")
            raise ValueError(
                f"split {split!r} has no pairs left: every row of {source} ({read}) has an empty "
                f"{src_lang!r} or {tgt_lang!r} side"
            )
    logger.info(
        "loaded %s-%s from %s: %s",
        src_lang,
        tgt_lang,
        origin,
        ", ".join(f"{s}={len(d)}" for s, d in out.items()),
    )
    return out


def release_mapped_pages(*splits: datasets.Dataset) -> int:
    """Drop this process's resident pages of the splits' memory-mapped Arrow files; returns the bytes advised.

    Reading a memory-mapped split (BPE training over every sentence, tokenisation in this process) maps its
    pages into the process, and they stay in its resident set, counted in its RSS, as long as the split is
    open: at 4,500,000 synthetic WMT-like pairs about 1 GB of text stayed resident after tokenizer training
    and added to the peak of the first training step (benchmarks/data_scale.py). This advises the kernel
    (Linux ``madvise(MADV_DONTNEED)``) that the read-only mappings of those files are not needed now: the
    pages leave the process's page tables and stay in the page cache, and a later read maps them back, so the
    splits stay usable and give the same rows. Writable mappings are left alone (dropping their pages could
    lose data); elsewhere than Linux with a C library that has ``madvise`` this does nothing and returns 0.

    Args:
        splits: `datasets.Dataset` objects; in-memory ones (no cache files) are skipped.

    Returns:
        The total length in bytes of the mappings advised (0 if none, or not supported here).
    """
    import ctypes
    import ctypes.util

    paths = {os.path.realpath(f["filename"]) for split in splits for f in getattr(split, "cache_files", ())}
    if not paths or not os.path.exists("/proc/self/maps"):
        return 0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return 0
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    dontneed = 4  # MADV_DONTNEED on Linux
    advised = 0
    with open("/proc/self/maps") as maps:
        for line in maps:  # "start-end perms offset dev inode   pathname"
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or "w" in fields[1] or fields[5].rstrip("\n") not in paths:
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if madvise(start, end - start, dontneed) == 0:
                advised += end - start
    return advised


# --------------------------------------------------------------------------------------
# shared normalisation (every input form goes through this)
# --------------------------------------------------------------------------------------


def _clean(value: Any) -> str:
    """Text of one cell, whitespace stripped; ``None`` becomes ``""``."""
    if value is None:
        return ""
    if not isinstance(value, str):
        value = str(value)
    return value.strip()


def _extract_pairs(batch: dict[str, list], src_lang: str, tgt_lang: str, mode: str) -> dict[str, list[str]]:
    """Batched ``map`` function: pick the two languages, strip, drop pairs with an empty side."""
    if mode == "translation":
        pairs = (
            (t.get(src_lang), t.get(tgt_lang)) if isinstance(t, Mapping) else (None, None)
            for t in batch["translation"]
        )
    elif mode == "mixed":  # each row's own shape: its language columns, else its translation dict
        empty: dict[str, Any] = {}
        rows = len(batch["translation"])
        columns = [batch.get(lang, [None] * rows) for lang in (src_lang, tgt_lang)]
        pairs = (
            tuple(column[i] if column[i] is not None else (t if isinstance(t, Mapping) else empty).get(lang)
                  for column, lang in zip(columns, (src_lang, tgt_lang)))
            for i, t in enumerate(batch["translation"])
        )
    else:
        pairs = zip(batch[src_lang], batch[tgt_lang])
    out_src: list[str] = []
    out_tgt: list[str] = []
    for s, t in pairs:
        s, t = _clean(s), _clean(t)
        if s and t:
            out_src.append(s)
            out_tgt.append(t)
    return {src_lang: out_src, tgt_lang: out_tgt}


def _row_shape(ds: datasets.Dataset, src_lang: str, tgt_lang: str, where: str) -> str:
    """Decide how to read the two languages from the rows of ``ds``.

    Returns ``"columns"`` (one column per language), ``"translation"`` (wmt16 style
    ``translation`` dict) or ``"mixed"`` (rows of both shapes, e.g. one JSON Lines file: each row is read
    in its own shape). Raises ValueError listing the languages present otherwise, or for language columns
    that hold lists (a JSON object of lists).
    """
    features = ds.features
    column_langs = [name for name, feat in features.items() if isinstance(feat, datasets.Value)]
    listed = [lang for lang in (src_lang, tgt_lang)
              if lang in features and isinstance(features[lang], (datasets.Sequence, datasets.List, list))]
    if listed:  # {"de": [...], "en": [...]}: a JSON object of lists is read as one row of lists
        raise ValueError(
            f"{where}: column(s) {listed} hold lists of sentences, not one sentence per row (a JSON object of "
            "lists?); write one {\"de\": ..., \"en\": ...} object per row (JSON Lines, or a JSON list of objects)"
        )
    if src_lang in column_langs and tgt_lang in column_langs:
        return "mixed" if "translation" in features else "columns"

    translation_langs: list[str] = []
    if "translation" in features:
        feat = features["translation"]
        if isinstance(feat, datasets.Translation):
            translation_langs = list(feat.languages)
        elif isinstance(feat, Mapping):  # json rows give a plain dict of Value features
            translation_langs = [k for k, v in feat.items() if isinstance(v, datasets.Value)]
        elif isinstance(feat, _JSON_FEATURE):
            # json rows whose translation dicts do not all have the same keys are typed as
            # free-form Json in recent `datasets`: collect the languages from the rows.
            translation_langs = _json_translation_languages(ds, where)
        elif isinstance(feat, datasets.TranslationVariableLanguages):
            raise ValueError(
                f"{where}: the 'translation' column has variable languages per row "
                "(TranslationVariableLanguages), which is not supported; convert it to "
                "{'translation': {lang: text}} rows or one column per language"
            )
        else:
            raise ValueError(
                f"{where}: the 'translation' column must hold a {{language: text}} dict, "
                f"found feature {feat!r}"
            )
        if src_lang in translation_langs and tgt_lang in translation_langs:
            # rows of both shapes in one file ({"translation": {...}} and {"de": ..., "en": ...}): read each
            return "mixed" if src_lang in column_langs or tgt_lang in column_langs else "translation"

    # Report what is there: the string columns (minus 'translation') and the translation keys.
    present = sorted(
        set(translation_langs)
        | {n for n in column_langs if features[n].dtype in ("string", "large_string")}
    )
    missing = [lang for lang in (src_lang, tgt_lang) if lang not in present]
    if translation_langs:
        raise ValueError(
            f"{where}: language(s) {missing} not present; languages available (translation dict): {present}"
        )
    raise ValueError(
        f"{where}: language(s) {missing} not present: expected a column per language "
        f"(or a 'translation' column of {{language: text}} dicts); columns found: {list(features)}"
    )


def _json_translation_languages(ds: datasets.Dataset, where: str) -> list[str]:
    """Union of the keys of a free-form (Json) 'translation' column; rows must be dicts or null."""
    keys: set[str] = set()
    rows = (row for start in range(0, len(ds), 1000) for row in ds[start : start + 1000]["translation"])
    for i, row in enumerate(rows):
        if row is None:
            continue
        if not isinstance(row, Mapping):
            raise ValueError(
                f"{where}: row {i}: the 'translation' column must hold a {{language: text}} dict, "
                f"found {type(row).__name__}"
            )
        keys.update(row)
    return sorted(keys)


def _normalize_split(
    ds: datasets.Dataset, src_lang: str, tgt_lang: str, split: str = "train", origin: str = "data"
) -> datasets.Dataset:
    """Bring one split to exactly the columns ``[src_lang, tgt_lang]`` (strings, stripped).

    Accepts rows ``{"translation": {src: ..., tgt: ...}}`` (dict or ``Translation``
    feature) or one column per language; other columns are discarded. Pairs where either
    side is empty/whitespace-only/missing are dropped and counted in a WARNING log record
    ("dropped N empty pairs from split S of ORIGIN").

    Raises:
        ValueError: a language is not present (lists the languages that are), or the
            'translation' column has an unsupported shape.
    """
    where = f"split {split!r} of {origin}"
    mode = _row_shape(ds, src_lang, tgt_lang, where)
    features = datasets.Features({src_lang: datasets.Value("string"), tgt_lang: datasets.Value("string")})
    n_before = len(ds)
    if n_before == 0:  # map() on no rows would return no columns at all
        return datasets.Dataset.from_dict({src_lang: [], tgt_lang: []}, features=features)
    out = ds.map(
        _extract_pairs,
        batched=True,
        fn_kwargs={"src_lang": src_lang, "tgt_lang": tgt_lang, "mode": mode},
        batch_size=ARROW_BATCH_ROWS,
        writer_batch_size=ARROW_BATCH_ROWS,
        remove_columns=ds.column_names,
        features=features,
        desc=f"normalising {split}",
    )
    dropped = n_before - len(out)
    if dropped:
        logger.warning(
            "dropped %d empty pairs from split %s of %s (%d of %d pairs kept)",
            dropped,
            split,
            origin,
            len(out),
            n_before,
        )
    return out


# --------------------------------------------------------------------------------------
# folder of line-aligned files
# --------------------------------------------------------------------------------------


def _scan_parallel_folder(folder: str) -> dict[str, dict[str, str]]:
    """Map ``split -> lang -> path`` for the ``{split}.{lang}[.gz]`` files of ``folder``."""
    found: dict[str, dict[str, str]] = {}
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.startswith(".") or not os.path.isfile(path):
            continue
        base = name[: -len(".gz")] if name.endswith(".gz") else name
        split, dot, lang = base.rpartition(".")
        if not dot or not split or not lang or lang.lower() in _NON_LANGUAGE_SUFFIXES:
            continue
        langs = found.setdefault(split, {})
        if lang in langs:
            raise ValueError(
                f"two files for split {split!r}, language {lang!r}: {langs[lang]} and {path}; keep only one"
            )
        langs[lang] = path
    return found


def _unread_hint(folder: str, splits: Sequence[str]) -> str:
    """A note naming the files of ``folder`` that look like one of ``splits`` but are not read as its
    ``{split}.{lang}[.gz]`` files (``train.de.bz2``, ``train.de.txt``, ``train.tsv``); "" if there are none."""
    unread = []
    for name in sorted(os.listdir(folder)):
        if not os.path.isfile(os.path.join(folder, name)):
            continue
        split, _, lang = name.removesuffix(".gz").rpartition(".")
        for wanted in splits:
            if name.startswith(f"{wanted}.") and (split != wanted or lang.lower() in _NON_LANGUAGE_SUFFIXES):
                unread.append(name)
                break
    if not unread:
        return ""
    return (f"; not read: {', '.join(unread)} (only {{split}}.{{lang}} text files, plain or .gz, are: "
            "decompress or convert the others)")


def _split_sort_key(split: str) -> tuple[int, str]:
    return (_SPLIT_ORDER.get(split, 2), split)


def _read_text(path: str) -> str:
    """Whole text of a UTF-8 file (``.gz`` decompressed, a leading byte order mark dropped).

    Raises ValueError naming the file when it cannot be read, is not a valid (or is a
    truncated) gzip file, or is not valid UTF-8 (with the line and byte of the first bad byte).
    """
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            with open(path, "rb") as f:
                data = f.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise ValueError(f"{path} is not a valid gzip file (truncated or corrupt): {e}") from e
    except OSError as e:
        raise ValueError(f"cannot read {path}: {e}") from e
    try:
        return data.decode("utf-8-sig")  # drops a leading byte order mark if present
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ValueError(f"{path} is not valid UTF-8 (line {line}, byte {e.start}): {e.reason}") from e


class _ParallelTextError(ValueError):
    """A problem with a file of a parallel folder, raised inside the Arrow generator (which `datasets` wraps in
    a DatasetGenerationError) and re-raised as it is."""


def _open_lines(path: str):
    """The file opened for reading bytes (``.gz`` decompressed on the fly); iterating it splits on ``\\n`` only."""
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _decoded_lines(path: str) -> Iterator[str]:
    """Lines of a UTF-8 text file (``.gz`` decompressed), one at a time, without their ``\\n``.

    Splitting on ``\\n`` only (not ``str.splitlines``) keeps line counts equal to what ``wc -l`` reports even
    if a sentence contains U+2028, U+0085, form feeds etc.; a trailing ``\\r`` (CRLF files) is removed later by
    stripping. A leading byte order mark is dropped. A UTF-8 sequence never contains the byte ``\\n``, so
    decoding line by line is decoding the whole file.

    Raises:
        _ParallelTextError (a ValueError) naming the file: it cannot be read, is not a valid (or is a
            truncated) gzip file, or is not valid UTF-8 (with the line and file byte offset of the first bad byte).
    """
    offset = 0
    try:
        with _open_lines(path) as f:
            for lineno, raw in enumerate(f, 1):
                start = 0
                if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    start = 3
                try:
                    text = raw[start:].decode("utf-8")
                except UnicodeDecodeError as e:
                    raise _ParallelTextError(f"{path} is not valid UTF-8 (line {lineno}, byte "
                                             f"{offset + start + e.start}): {e.reason}") from e
                offset += len(raw)
                yield text[:-1] if text.endswith("\n") else text
    except (EOFError, zlib.error, gzip.BadGzipFile) as e:
        raise _ParallelTextError(f"{path} is not a valid gzip file (truncated or corrupt): {e}") from e
    except OSError as e:
        raise _ParallelTextError(f"cannot read {path}: {e}") from e


def _is_empty(path: str) -> bool:
    """True for a file without a single line (a broken file is not empty: reading it reports the problem)."""
    try:
        with _open_lines(path) as f:
            return not f.read(1)
    except (EOFError, zlib.error, OSError):
        return False


def _parallel_lines(split: str, src_path: str, tgt_path: str, src_lang: str, tgt_lang: str) -> Iterator[dict[str, str]]:
    """Generator of ``{src_lang: line, tgt_lang: line}`` rows of two line-aligned files, read in step (for
    ``datasets.Dataset.from_generator``: no file is held in memory).

    Raises:
        _ParallelTextError: the files have different line counts (both files and both counts named; the longer
            one is read to its end to count it), or a problem of `_decoded_lines`.
    """
    src_lines, tgt_lines = _decoded_lines(src_path), _decoded_lines(tgt_path)
    for n, (s, t) in enumerate(itertools.zip_longest(src_lines, tgt_lines), 1):
        if s is None or t is None:
            longer = src_lines if t is None else tgt_lines
            total = n + sum(1 for _ in longer)
            src_n, tgt_n = (total, n - 1) if t is None else (n - 1, total)
            raise _ParallelTextError(f"line counts differ in split {split!r}: {src_path} has {src_n} lines but "
                                     f"{tgt_path} has {tgt_n} lines")
        yield {src_lang: s, tgt_lang: t}


def _read_parallel_files(split: str, src_path: str, tgt_path: str, src_lang: str, tgt_lang: str) -> datasets.Dataset:
    """Two line-aligned files as a memory-mapped Arrow dataset with the columns ``[src_lang, tgt_lang]``.

    Written once by ``datasets.Dataset.from_generator`` into the `datasets` cache; its fingerprint is made of
    the files' paths, sizes and modification times (and the languages), so a rerun on the same files loads the
    Arrow file again without reading the text, and an edited file is read anew.

    Raises:
        ValueError: line counts differ, or a file is not valid UTF-8 / not valid gzip (see `_parallel_lines`).
    """
    stats = [(os.path.abspath(p), os.stat(p).st_size, os.stat(p).st_mtime_ns) for p in (src_path, tgt_path)]
    # the version tag stands for the code of the generator: change it with that code, so old caches are not reused
    fingerprint = Hasher.hash(["parallel-folder-v1", stats, src_lang, tgt_lang])
    features = datasets.Features({src_lang: datasets.Value("string"), tgt_lang: datasets.Value("string")})
    if all(_is_empty(path) for path in (src_path, tgt_path)):  # the builder refuses to write no rows
        return datasets.Dataset.from_dict({src_lang: [], tgt_lang: []}, features=features)
    try:
        return datasets.Dataset.from_generator(
            _parallel_lines, features=features, fingerprint=fingerprint, writer_batch_size=ARROW_BATCH_ROWS,
            gen_kwargs={"split": split, "src_path": src_path, "tgt_path": tgt_path, "src_lang": src_lang,
                        "tgt_lang": tgt_lang},
        )
    except DatasetGenerationError as e:
        cause = e.__cause__
        while cause is not None and not isinstance(cause, _ParallelTextError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise ValueError(str(cause)) from cause


def _load_parallel_folder(
    folder: str, src_lang: str, tgt_lang: str, splits: Sequence[str] | None
) -> tuple[datasets.DatasetDict, dict[str, list[str]]]:
    """Read the requested splits of a folder of line-aligned files (raw, not yet normalised).

    Returns the splits and, for each, the two files it was read from (for messages).
    """
    found = _scan_parallel_folder(folder)
    if not found:
        raise FileNotFoundError(
            f"no parallel text files in {folder}: expected files named {{split}}.{{lang}} or "
            f"{{split}}.{{lang}}.gz, e.g. train.{src_lang}.gz and train.{tgt_lang}.gz "
            "(for .jsonl/.json/.csv data pass the file itself or data_files=...)"
        )
    languages = sorted({lang for langs in found.values() for lang in langs})
    missing = [lang for lang in (src_lang, tgt_lang) if lang not in languages]
    if missing:
        raise ValueError(f"language(s) {missing} not present in {folder}; languages available: {languages}")
    complete = sorted((s for s, langs in found.items() if src_lang in langs and tgt_lang in langs), key=_split_sort_key)
    if not complete:
        raise ValueError(
            f"no split in {folder} has files for both {src_lang!r} and {tgt_lang!r}; "
            f"files found: { {s: sorted(langs) for s, langs in sorted(found.items())} }"
        )
    if splits is None:
        splits = complete
    unknown = [s for s in splits if s not in found]
    if unknown:
        raise ValueError(
            f"unknown split(s) {unknown} in {folder}; splits found for {src_lang}-{tgt_lang}: {complete}"
            + _unread_hint(folder, unknown)
        )

    out = datasets.DatasetDict()
    sources: dict[str, list[str]] = {}
    for split in splits:
        langs = found[split]
        for lang in (src_lang, tgt_lang):
            if lang not in langs:
                raise FileNotFoundError(
                    f"split {split!r} in {folder} has no {lang!r} file (expected "
                    f"{os.path.join(folder, f'{split}.{lang}')} or .gz; it has {sorted(langs)}); "
                    f"splits found for {src_lang}-{tgt_lang}: {complete}" + _unread_hint(folder, [split])
                )
        src_path, tgt_path = langs[src_lang], langs[tgt_lang]
        out[split] = _read_parallel_files(split, src_path, tgt_path, src_lang, tgt_lang)
        sources[split] = [src_path, tgt_path]
    return out, sources


# --------------------------------------------------------------------------------------
# JSON / CSV files
# --------------------------------------------------------------------------------------


_SUPPORTED_SUFFIXES = ", ".join(_FILE_BUILDERS) + ", each optionally .gz"


def _builder_for(path: str, where: str = "") -> str:
    """Name of the `datasets` builder ("json" or "csv") for a file, from its suffix."""
    name = path.lower()
    if name.endswith(".gz"):
        name = name[: -len(".gz")]
    for ext, builder in _FILE_BUILDERS.items():
        if name.endswith(ext):
            return builder
    raise ValueError(f"{where}unsupported file type: {path} (supported suffixes: {_SUPPORTED_SUFFIXES})")


def _is_remote_or_glob(path: str) -> bool:
    return "://" in path or any(c in path for c in "*?[")


def _csv_string_features(files: list[str]) -> datasets.Features | None:
    """Read the CSV header(s) so every column is loaded as string.

    Without this, pandas turns a column of numbers into int/float (losing "3.50" -> 3.5)
    and words like "NA" or "None" into nulls. Returns None when the headers cannot be
    read locally (remote/glob paths) or disagree; `datasets` then infers types itself.
    """
    header: list[str] | None = None
    for path in files:
        if _is_remote_or_glob(path) or not os.path.isfile(path):
            return None
        opener = gzip.open if path.endswith(".gz") else open
        try:
            with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
                row = next(csv.reader(f), None)
        except (OSError, UnicodeDecodeError, csv.Error, EOFError, zlib.error):
            return None
        if row is None:
            return None
        if header is None:
            header = row
        elif row != header:
            return None
    if not header or len(set(header)) != len(header) or any(not h for h in header):
        return None
    return datasets.Features({h: datasets.Value("string") for h in header})


_EMPTY = "empty"  # what _json_problem/_csv_problem return for a file without rows


def _json_problem(path: str, text: str) -> str | None:
    """First thing in ``text`` that the json builder cannot read, as a message; None if none found.

    JSON Lines: every non-blank line must be one JSON object. A file starting with ``[``
    (or a pretty-printed ``{``) is checked as one JSON document instead.
    """

    def as_document() -> str | None:
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            return f"{path} line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})"
        rows = doc if isinstance(doc, list) else [doc]
        if not rows:
            return _EMPTY
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                return f"{path}: row {i} is a JSON {type(row).__name__}, expected an object ({{...}})"
        return None

    if text.lstrip().startswith("["):
        return as_document()
    first = True
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            if first and line.strip() == "{":  # one pretty-printed object, not JSON Lines
                return as_document()
            return f"{path} line {lineno}, column {e.colno}: not valid JSON ({e.msg})"
        if not isinstance(row, dict):
            return f"{path} line {lineno}: a JSON {type(row).__name__}, expected one object ({{...}}) per line"
        first = False
    return None


def _csv_problem(path: str, text: str) -> str | None:
    """First row of ``text`` with more fields than the header, or a quote never closed (or no row at all), as
    a message."""
    reader = csv.reader(text.split("\n"), strict=True)
    start = 1  # the line where the row being read begins (a quoted field may run over several)
    try:
        header = next(reader)
        rows = 0
        start = reader.line_num + 1
        for row in reader:
            start = reader.line_num + 1
            rows += bool(row)
            if len(row) > len(header):
                return (
                    f"{path} line {reader.line_num}: {len(row)} fields but the header has {len(header)} "
                    f"({header}); quote fields that contain a comma"
                )
    except csv.Error as e:
        if "unexpected end of data" in str(e):
            return f"{path} line {start}: a quoted field (\") opened on this line is never closed"
        if reader.line_num > start:  # the row ran over several lines: a quote opened at its start
            return (f"{path} line {start}: a quoted field (\") opened on this line runs on to line "
                    f"{reader.line_num}, where the CSV breaks ({e}); close the quote")
        return f"{path} line {reader.line_num}: not valid CSV ({e})"
    return None if rows else _EMPTY


def _diagnose_file(builder: str, split: str, paths: list[str], path: str) -> str | None:
    """Why the ``builder`` could not read ``path`` (a message naming it), or None if no reason is found.

    ``paths`` are all files of ``split``; an empty one is reported as an empty split when it
    is the split's only file.
    """
    if _is_remote_or_glob(path) or not os.path.isfile(path):
        return None
    try:
        text = _read_text(path)
    except ValueError as e:
        return str(e)
    problem = _EMPTY if not text.strip() else (_json_problem if builder == "json" else _csv_problem)(path, text)
    if problem == _EMPTY:
        if len(paths) == 1:
            return f"split {split!r} is empty: no rows in {path}"
        return f"{path} has no rows (one of the files of split {split!r}: {paths})"
    return problem


def _load_with_builder(builder: str, data_files: dict[str, list[str]]) -> datasets.DatasetDict:
    """``datasets.load_dataset(builder, data_files=...)``, one split at a time.

    One split at a time, so that splits whose files have different columns (e.g. a CSV
    without the language columns) each reach the column check with their own columns. When
    the builder fails, the split's files are examined and the problem found is raised as a
    ValueError naming the file (and line); otherwise the builder's error propagates.
    """
    out = datasets.DatasetDict()
    for split, paths in data_files.items():
        kwargs: dict[str, Any] = {}
        if builder == "csv":
            features = _csv_string_features(paths)
            if features is not None:
                kwargs["features"] = features
            kwargs["na_filter"] = False  # empty cells -> "" (dropped and counted), "NA"/"None" stay text
        try:
            out[split] = datasets.load_dataset(builder, data_files={split: paths}, **kwargs)[split]
        except Exception as e:  # noqa: BLE001 - re-raised unless a file explains it
            # The builders' own errors name neither the file nor the line (ArrowInvalid "in row 0",
            # a bare StopIteration for an empty file, ...): look at the files ourselves.
            for path in paths:
                problem = _diagnose_file(builder, split, paths, path)
                if problem:
                    raise ValueError(problem) from e
            if builder == "csv":
                problem = _csv_header_mismatch(split, paths)
                if problem:
                    raise ValueError(problem) from e
            raise
    return out


def _csv_header_mismatch(split: str, paths: list[str]) -> str | None:
    """A message if the local CSV files of one split do not all have the same header."""
    headers: list[tuple[str, list[str]]] = []
    for path in paths:
        if _is_remote_or_glob(path) or not os.path.isfile(path):
            return None
        try:
            row = next(csv.reader(_read_text(path).split("\n")), None)
        except (ValueError, csv.Error):
            return None
        headers.append((path, row or []))
    for path, header in headers[1:]:
        if header != headers[0][1]:
            return (
                f"the CSV files of split {split!r} have different headers: {headers[0][0]} has "
                f"{headers[0][1]} but {path} has {header}"
            )
    return None


def _load_data_file(path: str) -> datasets.DatasetDict:
    """One local .jsonl/.json/.csv file -> DatasetDict with the single split 'train'."""
    return _load_with_builder(_builder_for(path), {"train": [path]})


def _load_data_files(
    dataset: str, data_files: Mapping[str, str | list[str]], config: str | None
) -> tuple[datasets.DatasetDict, str, dict[str, list[str]]]:
    """Load ``data_files``; returns the splits, a description of the origin and each split's file(s)."""
    if not isinstance(data_files, Mapping) or not data_files:
        raise ValueError(f"data_files must be a non-empty mapping split -> file(s), got {data_files!r}")
    files: dict[str, list[str]] = {}
    for split, value in data_files.items():
        paths = [value] if isinstance(value, (str, os.PathLike)) else list(value)
        if not paths:
            raise ValueError(f"data_files[{split!r}] is empty")
        files[str(split)] = [os.fspath(p) for p in paths]

    local = os.path.expanduser(dataset)
    if os.path.isfile(local):
        raise ValueError(f"dataset={dataset!r} is a file; pass either a file as dataset or data_files, not both")
    if dataset.lower() in ("json", "csv") or os.path.isdir(local):
        base = local if os.path.isdir(local) else None
        for split, paths in files.items():
            resolved = []
            for p in paths:
                p = os.path.expanduser(p)
                if base is not None and not os.path.isabs(p) and not _is_remote_or_glob(p):
                    p = os.path.join(base, p)
                if not _is_remote_or_glob(p) and os.path.isdir(p):
                    raise FileNotFoundError(
                        f"data_files[{split!r}]: {p} is a folder, not a file (a folder of {{split}}.{{lang}}[.gz] "
                        "files is passed as dataset, not in data_files)"
                    )
                if not _is_remote_or_glob(p) and not os.path.isfile(p):
                    raise FileNotFoundError(f"data_files[{split!r}]: file not found: {p}")
                resolved.append(p)
            files[split] = resolved
        # The builder comes from the suffixes, also for dataset "json"/"csv": callers such as
        # translation.py pass "json" whatever the files are.
        first: tuple[str, str] | None = None
        for split, paths in files.items():
            for p in paths:
                builder = _builder_for(p, where=f"data_files[{split!r}]: ")
                if first is None:
                    first = (builder, p)
                elif builder != first[0]:
                    raise ValueError(
                        f"data_files mix file types: {first[1]} is {first[0].upper()} but {p} is "
                        f"{builder.upper()}; use one type for all splits (supported suffixes: "
                        f"{_SUPPORTED_SUFFIXES})"
                    )
        assert first is not None
        raw = _load_with_builder(first[0], files)
        return raw, f"data_files {files}", files
    if _looks_like_local_path(dataset):
        raise FileNotFoundError(f"dataset folder {dataset!r} does not exist{_parent_note(dataset)}")
    # A Hub repository plus a selection of its files.
    logger.info("loading Hub dataset %r (config %r) with data_files %s", dataset, config, files)
    raw = datasets.load_dataset(dataset, name=config, data_files=files)
    return raw, f"Hub dataset {dataset!r} data_files {files}", {}


# --------------------------------------------------------------------------------------
# small checks
# --------------------------------------------------------------------------------------


def _check_languages(src_lang: str, tgt_lang: str) -> None:
    for name, lang in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if not isinstance(lang, str) or not lang.strip():
            raise ValueError(f"{name} must be a non-empty language code, got {lang!r}")
    if src_lang == tgt_lang:
        raise ValueError(f"src_lang and tgt_lang are both {src_lang!r}; they must differ (they name the columns)")


def _parent_note(dataset: str) -> str:
    parent = local_parent(dataset)
    return f" (the folder {parent}/ exists here, so {dataset!r} is read as a path in it, not as a Hub id)" if parent \
        else ""


def _looks_like_local_path(dataset: str) -> bool:
    """True for strings that cannot be a Hub id (``name`` or ``owner/name``), and for ``owner/name`` when a local
    folder ``owner`` exists (``data/raw`` with a ``data/`` folder here: a path, never a Hub request)."""
    name = dataset.lower()
    return (
        local_parent(dataset) is not None
        or os.path.isabs(dataset)
        or dataset.startswith((".", "~"))
        or "\\" in dataset
        or dataset.count("/") > 1
        or name.endswith(tuple(_FILE_BUILDERS))
        or name.endswith(tuple(ext + ".gz" for ext in _FILE_BUILDERS))
        or name.endswith(".gz")
    )
