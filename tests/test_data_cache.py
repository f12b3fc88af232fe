"""A rerun of the data steps (load, tokenizer, tokenisation) on the same files reads no text, trains no tokenizer
and tokenises nothing: everything comes back from the datasets cache, as the log says per split."""

import json
import logging
import random

import datasets
import pytest
import transformers
from helpers import TINY, common_flags, train_translation

from scratch_transformer import data as data_module
from scratch_transformer import tokenization, translation


@pytest.fixture
def datasets_cache(tmp_path, monkeypatch):
    cache = tmp_path / "hf_datasets_cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    datasets.disable_progress_bars()
    yield cache
    datasets.enable_progress_bars()


def _folder(path, pairs=300):
    rng = random.Random(0)
    words = ["Hund", "Mann", "Frau", "läuft", "spielt", "Ball", "dog", "man", "woman", "runs", "plays", "ball"]
    path.mkdir()
    for split, n in (("train", pairs), ("val", 20)):
        for lang in ("de", "en"):
            lines = (" ".join(rng.choice(words) for _ in range(rng.randint(2, 9))) + "." for _ in range(n))
            (path / f"{split}.{lang}").write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def _data_steps(folder, output_dir, **flags):
    """The main job's steps up to the tokenised splits: load_data, build_tokenizer_and_model, _tokenize."""
    model_args, data_args, training_args = train_translation.parse_args(common_flags(
        output_dir, dataset_name=folder, validation_split="val", test_split="val", do_predict="false",
        config_overrides=TINY, vocab_size=300, tokenizer_min_frequency=1, max_steps=1, **flags))
    raw = translation.load_data(data_args, training_args)
    tokenizer, _, _ = translation.build_tokenizer_and_model(model_args, data_args, training_args, raw, None)
    return tokenizer, translation._tokenize(raw, tokenizer, data_args, training_args)


def _pipeline(tokenizer):
    """tokenizer.json less the truncation/padding state that a call leaves on the backend."""
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    return {key: value for key, value in state.items() if key not in ("truncation", "padding")}


def _tokenised_messages(records):
    return [r.getMessage() for r in records if r.getMessage().startswith("tokenised ")]


@pytest.mark.parametrize("workers", [None, 2], ids=["in-process", "2-workers"])
def test_a_rerun_reuses_the_arrow_files_the_tokenizer_and_the_tokenised_splits(tmp_path, datasets_cache, monkeypatch,
                                                                               caplog, workers):
    folder = _folder(tmp_path / "pairs")
    extra = {"preprocessing_num_workers": workers} if workers else {}
    with caplog.at_level(logging.INFO, logger="scratch_transformer"):
        tokenizer, first = _data_steps(folder, tmp_path / "run1", **extra)
    messages = _tokenised_messages(caplog.records)
    assert len(messages) == 2 and all("written to" in m for m in messages), messages
    caplog.clear()

    def refuse(what):
        def refused(*args, **kwargs):
            raise AssertionError(f"the rerun {what}")
        return refused

    monkeypatch.setattr(data_module, "_decoded_lines", refuse("read the text files"))
    monkeypatch.setattr(tokenization, "_train", refuse("trained the tokenizer"))
    monkeypatch.setattr(transformers.PreTrainedTokenizerBase, "__call__", refuse("tokenised"))
    with caplog.at_level(logging.INFO, logger="scratch_transformer"):
        again_tokenizer, again = _data_steps(folder, tmp_path / "run2", **extra)
    messages = _tokenised_messages(caplog.records)
    assert [m.split(",")[0] for m in messages] == ["tokenised train: 300 pairs", "tokenised val: 20 pairs"]
    assert all("reused the cache" in m for m in messages), messages
    assert _pipeline(again_tokenizer) == _pipeline(tokenizer)
    for split in ("train", "val"):
        assert again[split].cache_files == first[split].cache_files
        assert again[split].to_dict() == first[split].to_dict()
        assert again[split].column_names == ["input_ids", "attention_mask", "labels"]


def test_other_maximum_lengths_tokenise_again(tmp_path, datasets_cache, caplog):
    folder = _folder(tmp_path / "pairs", pairs=50)
    _data_steps(folder, tmp_path / "run1")
    with caplog.at_level(logging.INFO, logger="scratch_transformer"):
        _, shorter = _data_steps(folder, tmp_path / "run2", max_source_length=5, max_target_length=5)
    assert all("written to" in m for m in _tokenised_messages(caplog.records))
    assert max(len(ids) for ids in shorter["train"]["input_ids"]) == 5


def test_tokenizer_max_sentences_trains_on_a_seeded_subset_and_is_checked(tmp_path, datasets_cache, caplog):
    from scratch_transformer.arguments import ModelArguments

    folder = _folder(tmp_path / "pairs", pairs=120)
    with caplog.at_level(logging.INFO, logger="scratch_transformer"):
        _data_steps(folder, tmp_path / "run", tokenizer_max_sentences=50)
    messages = [r.getMessage() for r in caplog.records]
    assert any("from 100 sentences (50 training pairs)" in m for m in messages), messages
    assert any("50 rows drawn with seed 0 (max_sentences 50)" in m for m in messages), messages
    with pytest.raises(ValueError, match="tokenizer_max_sentences must be >= 1"):
        ModelArguments(tokenizer_max_sentences=0)


def _record_batch_rows(dataset):
    """Rows of each Arrow record batch in the files behind a memory-mapped dataset."""
    import pyarrow as pa

    rows = []
    for cache_file in dataset.cache_files:
        with pa.memory_map(cache_file["filename"]) as source:
            rows += [batch.num_rows for batch in pa.ipc.open_stream(source)]
    return rows


def test_a_folders_text_is_written_in_record_batches_of_arrow_batch_rows(tmp_path, datasets_cache, monkeypatch):
    """Opening a memory-mapped Arrow file reads every record batch's header: a folder's text (read, then
    normalised) is written in batches of data.ARROW_BATCH_ROWS rows (datasets' default is 1000), so that a rerun
    on a large corpus reads few places of the file; the rows read back are the lines."""
    monkeypatch.setattr(data_module, "ARROW_BATCH_ROWS", 250)
    folder = _folder(tmp_path / "pairs", pairs=1100)
    train = data_module.load_translation_dataset(str(folder), "de", "en")["train"]
    assert _record_batch_rows(train) == [250, 250, 250, 250, 100]
    assert train["de"] == (folder / "train.de").read_text(encoding="utf-8").splitlines()
