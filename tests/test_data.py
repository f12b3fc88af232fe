"""Tests for scratch_transformer.data.load_translation_dataset (small files written in tmp_path)."""

from __future__ import annotations

import csv
import gzip
import json
import logging
import re
from pathlib import Path

import datasets
import pytest

from scratch_transformer import data as data_module
from scratch_transformer.data import _normalize_split, load_translation_dataset

MULTI30K = Path("/work/shared/data/multi30k/raw")
LOGGER = "scratch_transformer.data"


@pytest.fixture(autouse=True)
def _private_datasets_cache(tmp_path, monkeypatch):
    """Keep the json/csv builders' Arrow caches inside tmp_path, not in ~/.cache."""
    cache = tmp_path / "hf_datasets_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(datasets.config, "DOWNLOADED_DATASETS_PATH", cache / "downloads")
    monkeypatch.setattr(datasets.config, "EXTRACTED_DATASETS_PATH", cache / "downloads" / "extracted")
    datasets.disable_progress_bars()
    yield
    datasets.enable_progress_bars()


def _write(path: Path, lines: list[str]) -> Path:
    text = "".join(line + "\n" for line in lines)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


TRAIN_DE = ["Ein Mann mit einem Hut.", "  Zwei Hunde spielen im Schnee.  ", "Eine Frau liest ein Buch über Öl."]
TRAIN_EN = ["A man with a hat.", "Two dogs play in the snow.", "\tA woman reads a book about oil."]
VAL_DE = ["Ein Kind lacht.", "Straße & Café: «naïve» — 3,5 €!"]
VAL_EN = ["A child laughs.", "Street & café: 'naive' - 3.5 EUR!"]


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    d = tmp_path / "parallel"
    d.mkdir()
    _write(d / "train.de", TRAIN_DE)
    _write(d / "train.en", TRAIN_EN)
    _write(d / "val.de.gz", VAL_DE)
    _write(d / "val.en.gz", VAL_EN)
    (d / "README.md").write_text("# not a language file\n")
    return d


# ---------------------------------------------------------------------------------------
# folder of {split}.{lang}[.gz] files
# ---------------------------------------------------------------------------------------


def test_folder_plain_and_gzip(folder):
    dd = load_translation_dataset(str(folder), "de", "en")
    assert isinstance(dd, datasets.DatasetDict)
    assert list(dd) == ["train", "val"]  # README.md ignored; train first
    for split in dd.values():
        assert split.column_names == ["de", "en"]
        assert split.features["de"] == datasets.Value("string")
        assert split.features["en"] == datasets.Value("string")
    assert dd["train"]["de"] == [s.strip() for s in TRAIN_DE]
    assert dd["train"]["en"] == [s.strip() for s in TRAIN_EN]
    assert dd["val"]["de"] == VAL_DE
    assert dd["val"]["en"] == VAL_EN


def test_folder_reversed_direction_split_order_and_cap(folder):
    dd = load_translation_dataset(folder, "en", "de", splits=["val", "train"], max_samples={"train": 2})
    assert list(dd) == ["val", "train"]
    assert dd["train"].column_names == ["en", "de"]
    assert dd["train"]["en"] == ["A man with a hat.", "Two dogs play in the snow."]
    assert len(dd["val"]) == 2


def test_folder_mismatched_line_counts_names_both_files(folder):
    _write(folder / "train.en", TRAIN_EN[:2])
    with pytest.raises(ValueError) as exc:
        load_translation_dataset(str(folder), "de", "en", splits=["train"])
    msg = str(exc.value)
    assert str(folder / "train.de") in msg and str(folder / "train.en") in msg
    assert "3 lines" in msg and "2 lines" in msg


def test_folder_missing_language_lists_available(folder):
    with pytest.raises(ValueError, match=r"\['fr'\] not present") as exc:
        load_translation_dataset(str(folder), "fr", "en")
    assert "['de', 'en']" in str(exc.value)


def test_folder_unknown_split_lists_found(folder):
    with pytest.raises(ValueError, match="unknown split") as exc:
        load_translation_dataset(str(folder), "de", "en", splits=["train", "test"])
    assert "'test'" in str(exc.value) and "['train', 'val']" in str(exc.value)


def test_folder_split_missing_one_side(folder):
    _write(folder / "test.de", ["Ein Satz."])
    # 'test' is not offered when loading everything ...
    assert list(load_translation_dataset(str(folder), "de", "en")) == ["train", "val"]
    # ... and asking for it names the missing file.
    with pytest.raises(FileNotFoundError, match=r"test\.en"):
        load_translation_dataset(str(folder), "de", "en", splits=["test"])


def test_folder_without_files(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match="no parallel text files"):
        load_translation_dataset(str(empty), "de", "en")


def test_nonexistent_local_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_translation_dataset(str(tmp_path / "nope"), "de", "en")
    with pytest.raises(FileNotFoundError):
        load_translation_dataset("missing_file.jsonl", "de", "en")


def test_empty_pairs_dropped_and_counted(tmp_path, caplog):
    d = tmp_path / "p"
    d.mkdir()
    _write(d / "train.de", ["eins", "", "drei", "   ", "fünf", "sechs"])
    _write(d / "train.en", ["one", "two", "", "four", "five", "\t"])
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        dd = load_translation_dataset(str(d), "de", "en")
    assert dd["train"]["de"] == ["eins", "fünf"]
    assert dd["train"]["en"] == ["one", "five"]
    msgs = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert any("dropped 4 empty pairs from split train" in m for m in msgs), msgs


def test_same_language_rejected(folder):
    with pytest.raises(ValueError, match="must differ"):
        load_translation_dataset(str(folder), "de", "de")


def test_invalid_utf8_names_file(folder):
    (folder / "train.en").write_bytes(b"ok\n\xff\xfe bad\nthird\n")
    with pytest.raises(ValueError) as exc:
        load_translation_dataset(str(folder), "de", "en", splits=["train"])
    assert str(exc.value) == f"{folder / 'train.en'} is not valid UTF-8 (line 2, byte 3): invalid start byte"


def test_folder_is_memory_mapped_arrow_reused_until_a_file_changes(folder, monkeypatch):
    """The text goes through a generator into Arrow files of the datasets cache (no list of the corpus); a
    second load finds them without reading the text; an edited file is read again."""
    first = load_translation_dataset(str(folder), "de", "en")
    for split in first.values():
        assert split.cache_files, "a folder split should be memory-mapped from the datasets cache"
        assert str(split.cache_files[0]["filename"]).startswith(str(datasets.config.HF_DATASETS_CACHE))

    def no_reading(path):
        raise AssertionError(f"{path} was read again")

    with monkeypatch.context() as patched:
        patched.setattr(data_module, "_decoded_lines", no_reading)
        again = load_translation_dataset(str(folder), "de", "en")
    assert {s: d.to_dict() for s, d in again.items()} == {s: d.to_dict() for s, d in first.items()}
    assert again["train"].cache_files == first["train"].cache_files

    _write(folder / "train.en", ["One man.", "Two dogs.", "A woman."])
    assert load_translation_dataset(str(folder), "de", "en")["train"]["en"] == ["One man.", "Two dogs.", "A woman."]


def test_folder_longer_source_is_counted_to_its_end(folder):
    _write(folder / "train.de", TRAIN_DE + ["Noch ein Satz.", "Und noch einer."])
    with pytest.raises(ValueError) as exc:
        load_translation_dataset(str(folder), "de", "en", splits=["train"])
    assert str(exc.value) == (f"line counts differ in split 'train': {folder / 'train.de'} has 5 lines but "
                              f"{folder / 'train.en'} has 3 lines")


def test_folder_lines_split_on_newline_only_bom_and_crlf(tmp_path):
    d = tmp_path / "p"
    d.mkdir()
    (d / "train.de").write_bytes("\ufeffeins\r\nzwei\u2028halb\r\ndrei".encode())  # BOM, CRLF, no final newline
    (d / "train.en").write_bytes(b"one\ntwo\x0chalf\nthree\n")
    dd = load_translation_dataset(str(d), "de", "en")
    assert dd["train"].to_dict() == {"de": ["eins", "zwei\u2028halb", "drei"], "en": ["one", "two\x0chalf", "three"]}


@pytest.mark.parametrize("damage", ["truncated", "not-gzip"])
def test_folder_corrupt_gzip_names_file(folder, damage):
    data = gzip.compress(("Ein Satz.\n" * 2000).encode())
    (folder / "train.de.gz").write_bytes(data[: len(data) // 2] if damage == "truncated" else b"plain text\n")
    (folder / "train.de").unlink()
    _write(folder / "train.en", ["A sentence."] * 2000)
    with pytest.raises(ValueError) as exc:
        load_translation_dataset(str(folder), "de", "en", splits=["train"])
    assert str(exc.value).startswith(f"{folder / 'train.de.gz'} is not a valid gzip file (truncated or corrupt): ")


# ---------------------------------------------------------------------------------------
# JSON Lines / CSV files
# ---------------------------------------------------------------------------------------


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


def test_jsonl_translation_rows(tmp_path, caplog):
    rows = [
        {"id": 0, "translation": {"de": " Hallo Welt ", "en": "Hello world", "fr": "Bonjour"}},
        {"id": 1, "translation": {"de": "Guten Morgen", "en": "", "fr": "Bonjour"}},
        {"id": 2, "translation": {"de": "Danke.", "en": "Thanks."}},
    ]
    path = _write_jsonl(tmp_path / "train.jsonl", rows)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        dd = load_translation_dataset(str(path), "de", "en")
    assert list(dd) == ["train"]
    assert dd["train"].column_names == ["de", "en"]
    assert dd["train"].to_dict() == {"de": ["Hallo Welt", "Danke."], "en": ["Hello world", "Thanks."]}
    assert any("dropped 1 empty pairs" in r.getMessage() for r in caplog.records)
    with pytest.raises(ValueError, match=r"\['cs'\] not present.*\['de', 'en', 'fr'\]"):
        load_translation_dataset(str(path), "cs", "en")


def test_jsonl_data_files_splits_and_missing_language(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"translation": {"de": f"s{i}", "en": f"t{i}"}} for i in range(5)])
    valid = _write_jsonl(tmp_path / "valid.jsonl", [{"translation": {"de": "v", "en": "w"}}])
    files = {"train": str(train), "validation": [str(valid)]}
    dd = load_translation_dataset("json", "en", "de", data_files=files, max_samples={"train": 3})
    assert list(dd) == ["train", "validation"]
    assert dd["train"].to_dict() == {"en": ["t0", "t1", "t2"], "de": ["s0", "s1", "s2"]}
    assert dd["validation"].to_dict() == {"en": ["w"], "de": ["v"]}

    # builder inferred from the extension; relative paths resolved against a folder
    dd = load_translation_dataset(str(tmp_path), "de", "en", data_files={"train": "train.jsonl"})
    assert len(dd["train"]) == 5

    with pytest.raises(ValueError, match="unknown split") as exc:
        load_translation_dataset("json", "de", "en", data_files=files, splits=["test"])
    assert "['train', 'validation']" in str(exc.value)

    with pytest.raises(ValueError, match=r"\['cs'\] not present") as exc:
        load_translation_dataset("json", "cs", "en", data_files=files)
    assert "['de', 'en']" in str(exc.value)

    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_translation_dataset("json", "de", "en", data_files={"train": str(tmp_path / "nope.jsonl")})


def test_csv_one_column_per_language(tmp_path):
    path = tmp_path / "pairs.csv"
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["id", "en", "de"])
        w.writerow([1, "A man, smiling.", "Ein Mann, lächelnd."])
        w.writerow([2, "3.50", "3,50"])  # numbers stay text
        w.writerow([3, "NA", "None"])  # no pandas NA conversion
        w.writerow([4, "", "Leer"])  # empty cell -> pair dropped
    dd = load_translation_dataset(str(path), "de", "en")
    assert dd["train"].column_names == ["de", "en"]
    assert dd["train"]["de"] == ["Ein Mann, lächelnd.", "3,50", "None"]
    assert dd["train"]["en"] == ["A man, smiling.", "3.50", "NA"]

    with pytest.raises(ValueError, match=r"\['fr'\] not present") as exc:
        load_translation_dataset(str(path), "fr", "en")
    assert "columns found: ['id', 'en', 'de']" in str(exc.value)


def test_unsupported_file_type(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("de\ten\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        load_translation_dataset(str(path), "de", "en")


def _write_csv(path: Path, rows: list[list[str]]) -> Path:
    text_io = gzip.open(path, "wt", encoding="utf-8", newline="") if path.name.endswith(".gz") else open(
        path, "w", encoding="utf-8", newline="")
    with text_io as f:
        csv.writer(f).writerows(rows)
    return path


def _builder_name(path: Path) -> str:
    """The dataset name that matches the file, so that a test checks a message, not the builder choice."""
    return "csv" if ".csv" in path.name else "json"


def test_csv_data_files_with_the_json_default_name(tmp_path):
    """translation.py passes dataset "json" whatever the files are: the suffix picks the builder."""
    train = _write_csv(tmp_path / "train.csv", [["de", "en"], ["Hallo", "Hello"], ["Ja", "Yes"]])
    valid = _write_csv(tmp_path / "valid.csv.gz", [["en", "de"], ["Thanks", "Danke"]])
    for name in ("json", None):
        dd = load_translation_dataset(name, "de", "en", data_files={"train": str(train), "validation": str(valid)})
        assert dd["train"].to_dict() == {"de": ["Hallo", "Ja"], "en": ["Hello", "Yes"]}
        assert dd["validation"].to_dict() == {"de": ["Danke"], "en": ["Thanks"]}
    # and "csv" with JSON Lines files reads them as JSON
    jsonl = _write_jsonl(tmp_path / "train.jsonl", [{"de": "Baum", "en": "tree"}])
    assert load_translation_dataset("csv", "de", "en", data_files={"train": str(jsonl)})["train"]["en"] == ["tree"]


@pytest.mark.parametrize("name", ["train.txt", "train.tsv", "train"])
def test_data_files_unsupported_suffix_refused(tmp_path, name):
    path = tmp_path / name
    path.write_text(json.dumps({"de": "Hallo", "en": "Hello"}) + "\n")  # valid JSON Lines all the same
    with pytest.raises(ValueError) as exc:
        load_translation_dataset("json", "de", "en", data_files={"train": str(path)})
    assert str(exc.value) == (
        f"data_files['train']: unsupported file type: {path} "
        "(supported suffixes: .jsonl, .json, .csv, each optionally .gz)"
    )


def test_data_files_mixed_suffixes_refused(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"de": "Hallo", "en": "Hello"}])
    valid = _write_csv(tmp_path / "valid.csv", [["de", "en"], ["Ja", "Yes"]])
    with pytest.raises(ValueError) as exc:
        load_translation_dataset("json", "de", "en", data_files={"train": str(train), "validation": str(valid)})
    msg = str(exc.value)
    assert msg.startswith(f"data_files mix file types: {train} is JSON but {valid} is CSV"), msg
    assert "supported suffixes: .jsonl, .json, .csv, each optionally .gz" in msg


@pytest.mark.parametrize("content", ["", "\n\n", "de,en\n"], ids=["empty", "blank-lines", "csv-header-only"])
def test_empty_validation_file_refused(tmp_path, content):
    suffix = "csv" if "," in content else "jsonl"
    train = _write_csv(tmp_path / "train.csv", [["de", "en"], ["Hallo", "Hello"]]) if suffix == "csv" else (
        _write_jsonl(tmp_path / "train.jsonl", [{"de": "Hallo", "en": "Hello"}]))
    valid = tmp_path / f"valid.{suffix}"
    valid.write_text(content)
    with pytest.raises(ValueError) as exc:
        load_translation_dataset(_builder_name(valid), "de", "en",
                                 data_files={"train": str(train), "validation": str(valid)})
    assert str(exc.value) == f"split 'validation' is empty: no rows in {valid}"


def test_empty_jsonl_file_refused(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("")
    with pytest.raises(ValueError) as exc:  # was a bare StopIteration
        load_translation_dataset(str(path), "de", "en")
    assert str(exc.value) == f"split 'train' is empty: no rows in {path}"
    gz = tmp_path / "train.jsonl.gz"
    gz.write_bytes(gzip.compress(b""))
    with pytest.raises(ValueError, match=rf"^split 'train' is empty: no rows in {re.escape(str(gz))}$"):
        load_translation_dataset(str(gz), "de", "en")


def test_split_of_only_empty_pairs_refused(tmp_path):
    train = _write_jsonl(tmp_path / "train.jsonl", [{"de": "Hallo", "en": "Hello"}])
    valid = _write_jsonl(tmp_path / "valid.jsonl", [{"de": "Hallo", "en": " "}, {"de": "", "en": "Yes"}])
    with pytest.raises(ValueError) as exc:
        load_translation_dataset("json", "de", "en", data_files={"train": str(train), "validation": str(valid)})
    assert str(exc.value) == (
        f"split 'validation' has no pairs left: every row of {valid} (2 read) has an empty 'de' or 'en' side"
    )
    with pytest.raises(ValueError, match=r"every row of .*valid\.jsonl \(1 read, max_samples=1\)"):
        load_translation_dataset("json", "de", "en", data_files={"validation": str(valid)},
                                 max_samples={"validation": 1})


def test_folder_empty_split_refused(folder):
    _write(folder / "val.de.gz", [])
    _write(folder / "val.en.gz", [])
    with pytest.raises(ValueError) as exc:  # was an empty split without columns: "Column 'de' doesn't exist."
        load_translation_dataset(str(folder), "de", "en")
    assert str(exc.value) == f"split 'val' is empty: no rows in {folder / 'val.de.gz'}, {folder / 'val.en.gz'}"
    # a split capped at 0 is asked for: it comes back empty, with both columns
    dd = load_translation_dataset(str(folder), "de", "en", splits=["train"], max_samples={"train": 0})
    assert dd["train"].column_names == ["de", "en"] and len(dd["train"]) == 0


@pytest.mark.parametrize(
    "name, text, expected",
    [
        ("train.jsonl", '{"de": "a", "en": "b"}\n\n{"de": "c", "en": "d"}\n{"de": "e" "en": "f"}\n',
         "line 4, column 12: not valid JSON (Expecting ',' delimiter)"),
        ("train.jsonl", '{"de": "a", "en": "b"}\n{"de": "c", "en": "d"\n',
         "line 2, column 22: not valid JSON (Expecting ',' delimiter)"),
        ("train.jsonl", '{"de": "a", "en": "b"}\n["c", "d"]\n',
         "line 2: a JSON list, expected one object ({...}) per line"),
        ("train.json", '[\n  {"de": "a", "en": "b"},\n  {"de": "c", "en": }\n]\n',
         "line 3, column 21: not valid JSON (Expecting value)"),
    ],
    ids=["missing-comma", "unterminated", "not-an-object", "json-array"],
)
def test_malformed_json_names_file_and_line(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ValueError) as exc:  # was DatasetGenerationError (ArrowInvalid "in row N")
        load_translation_dataset("json", "de", "en", data_files={"train": str(path)})
    assert str(exc.value) == f"{path} {expected}"


def test_csv_without_language_columns_names_file_and_columns(tmp_path):
    train = _write_csv(tmp_path / "train.csv", [["de", "en"], ["Hallo", "Hello"]])
    valid = _write_csv(tmp_path / "valid.csv", [["de", "en"], ["Ja", "Yes"]])
    test = _write_csv(tmp_path / "test.csv", [["source", "target"], ["Nein", "No"]])
    files = {"train": str(train), "validation": str(valid), "test": str(test)}
    with pytest.raises(ValueError) as exc:
        load_translation_dataset("csv", "de", "en", data_files=files)
    msg = str(exc.value)
    assert msg.startswith(f"split 'test' of {test}: language(s) ['de', 'en'] not present"), msg
    assert msg.endswith("columns found: ['source', 'target']"), msg
    assert str(train) not in msg and str(valid) not in msg


def test_csv_row_with_extra_fields_names_file_and_line(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("de,en\nHallo,Hello\nJa, gut,Yes\n")
    with pytest.raises(ValueError) as exc:  # was DatasetGenerationError (pandas "Expected 2 fields in line 3")
        load_translation_dataset(str(path), "de", "en")
    assert str(exc.value) == (
        f"{path} line 3: 3 fields but the header has 2 (['de', 'en']); quote fields that contain a comma"
    )


def test_csv_files_of_one_split_with_different_headers(tmp_path):
    first = _write_csv(tmp_path / "part1.csv", [["de", "en"], ["Hallo", "Hello"]])
    second = _write_csv(tmp_path / "part2.csv", [["en", "de"], ["Yes", "Ja"]])
    with pytest.raises(ValueError) as exc:  # was datasets.table.CastError
        load_translation_dataset("csv", "de", "en", data_files={"train": [str(first), str(second)]})
    assert str(exc.value) == (
        f"the CSV files of split 'train' have different headers: {first} has ['de', 'en'] "
        f"but {second} has ['en', 'de']"
    )


@pytest.mark.parametrize("name", ["train.jsonl", "train.csv", "train.jsonl.gz"])
def test_non_utf8_file_names_file(tmp_path, name):
    text = '{"de": "Hallo", "en": "Hello"}\n{"de": "Straße", "en": "street"}\n' if ".jsonl" in name else (
        "de,en\nHallo,Hello\nStraße,street\n")
    data = text.encode("latin-1")
    path = tmp_path / name
    path.write_bytes(gzip.compress(data) if name.endswith(".gz") else data)
    byte, line = data.index(b"\xdf"), 2 if ".jsonl" in name else 3
    with pytest.raises(ValueError) as exc:  # was UnicodeDecodeError / DatasetGenerationError without the file
        load_translation_dataset(_builder_name(path), "de", "en", data_files={"train": str(path)})
    assert str(exc.value) == f"{path} is not valid UTF-8 (line {line}, byte {byte}): invalid continuation byte"


@pytest.mark.parametrize("name", ["train.jsonl.gz", "train.csv.gz"])
@pytest.mark.parametrize("damage", ["truncated", "not-gzip"])
def test_corrupt_gzip_names_file(tmp_path, name, damage):
    row = '{"de": "Hallo", "en": "Hello"}\n' if ".jsonl" in name else "Hallo,Hello\n"
    data = gzip.compress(((row if ".jsonl" in name else "de,en\n" + row) + row * 500).encode())
    path = tmp_path / name
    path.write_bytes(data[: len(data) // 2] if damage == "truncated" else b"plain text, no gzip header\n")
    with pytest.raises(ValueError) as exc:  # was a bare EOFError / DatasetGenerationError
        load_translation_dataset(_builder_name(path), "de", "en", data_files={"train": str(path)})
    assert str(exc.value).startswith(f"{path} is not a valid gzip file (truncated or corrupt): "), str(exc.value)


# ---------------------------------------------------------------------------------------
# the shared normaliser and the Hub code path (no network: load_dataset is replaced)
# ---------------------------------------------------------------------------------------


def test_normalize_split_translation_feature_and_columns(caplog):
    wmt_like = datasets.Dataset.from_dict(
        {"translation": [{"de": " Haus ", "en": "house"}, {"de": "Baum", "en": " "}, {"de": "Hund", "en": "dog"}]},
        features=datasets.Features({"translation": datasets.Translation(languages=["de", "en"])}),
    )
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = _normalize_split(wmt_like, "en", "de", split="train", origin="test")
    assert out.column_names == ["en", "de"]
    assert out.to_dict() == {"en": ["house", "dog"], "de": ["Haus", "Hund"]}
    assert any("dropped 1 empty pairs from split train" in r.getMessage() for r in caplog.records)

    columns = datasets.Dataset.from_dict({"de": ["a ", None, "c"], "en": ["x", "y", "z\n"], "score": [1.0, 2.0, 3.0]})
    out = _normalize_split(columns, "de", "en")
    assert out.to_dict() == {"de": ["a", "c"], "en": ["x", "z"]}
    assert out.features == datasets.Features({"de": datasets.Value("string"), "en": datasets.Value("string")})

    with pytest.raises(ValueError, match=r"languages available \(translation dict\): \['de', 'en'\]"):
        _normalize_split(wmt_like, "fr", "en")
    with pytest.raises(ValueError, match=r"\['fr'\] not present.*columns found: \['de', 'en', 'score'\]"):
        _normalize_split(columns, "de", "fr")


def test_hub_id_path_uses_load_dataset(monkeypatch):
    calls = []
    fake = datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"translation": [{"de": "Hallo", "en": "Hello"}] * 4}),
            "validation": datasets.Dataset.from_dict({"translation": [{"de": "Tschüss", "en": "Bye"}]}),
        }
    )

    def fake_load_dataset(path, name=None, **kwargs):
        calls.append((path, name, kwargs))
        return fake

    monkeypatch.setattr(data_module.datasets, "load_dataset", fake_load_dataset)
    dd = load_translation_dataset("wmt16", "de", "en", dataset_config_name="de-en", splits=["train"],
                                  max_samples={"train": 2})
    assert calls == [("wmt16", "de-en", {})]
    assert list(dd) == ["train"]
    assert dd["train"].to_dict() == {"de": ["Hallo", "Hallo"], "en": ["Hello", "Hello"]}
    with pytest.raises(ValueError, match=r"unknown split.*\['train', 'validation'\]"):
        load_translation_dataset("someone/pairs", "de", "en", splits=["test"])


# ---------------------------------------------------------------------------------------
# the real Multi30k folder
# ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="Multi30k raw folder not available")
def test_real_multi30k():
    dd = load_translation_dataset(str(MULTI30K), "de", "en", splits=("train", "val", "test_2016_flickr"))
    # No Multi30k pair has an empty side, so nothing is dropped.
    assert {s: len(d) for s, d in dd.items()} == {"train": 29000, "val": 1014, "test_2016_flickr": 1000}
    assert dd["train"].column_names == ["de", "en"]
    assert dd["train"][0] == {
        "de": "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
        "en": "Two young, White males are outside near many bushes.",
    }
    assert dd["test_2016_flickr"][0]["en"] == "A man in an orange hat starring at something."
    assert all(s == s.strip() and s for s in dd["train"]["de"][:2000])


def _resident_file_bytes() -> int:
    """RssFile of /proc/self/status: this process's resident pages of mapped files, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux /proc")
def test_release_mapped_pages_drops_read_text_from_the_resident_set_and_keeps_the_rows(tmp_path):
    """After reading a memory-mapped split, its pages are resident in this process; release_mapped_pages (called
    after BPE training and tokenisation) drops them, and the split still reads the same rows."""
    from scratch_transformer.data import release_mapped_pages

    padding = "x" * 2000
    datasets.Dataset.from_dict({"de": [f"{i} {padding}" for i in range(20_000)]}).save_to_disk(tmp_path / "split")
    split = datasets.load_from_disk(str(tmp_path / "split"))  # memory-mapped, about 40 MB of text
    assert split.cache_files
    assert sum(len(s) for batch in split.iter(batch_size=1000) for s in batch["de"]) > 40_000_000
    before = _resident_file_bytes()
    advised = release_mapped_pages(split)
    after = _resident_file_bytes()
    assert advised >= 40_000_000
    assert before - after >= 30_000_000, (before, after)
    assert split[12345]["de"] == f"12345 {padding}"
    assert release_mapped_pages(datasets.Dataset.from_dict({"de": ["a"]})) == 0  # in memory: nothing mapped
