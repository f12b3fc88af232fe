"""End-to-end runs of scripts/train_translation.py with tiny models (real Multi30k subset and synthetic pairs)."""

import json

import pytest
import yaml
from conftest import MULTI30K, load_script

pytestmark = pytest.mark.filterwarnings("ignore")

TINY = "d_model=64,num_heads=4,encoder_layers=2,decoder_layers=2,d_ff=128,dropout=0.0"


train_translation = load_script("train_translation")


def common_flags(output_dir, **extra):
    flags = {
        "output_dir": str(output_dir), "per_device_train_batch_size": 32, "per_device_eval_batch_size": 64,
        "logging_steps": 5, "save_steps": 20, "save_total_limit": 3, "seed": 0, "disable_tqdm": True,
        "max_source_length": 40, "max_target_length": 40, "dataloader_num_workers": 0,
    }
    flags.update(extra)
    argv = []
    for key, value in flags.items():
        argv += [f"--{key}", str(value)]
    return argv


@pytest.fixture(scope="module")
def multi30k_run(tmp_path_factory):
    if not MULTI30K.is_dir():
        pytest.skip("Multi30k not found beside the repo")
    output_dir = tmp_path_factory.mktemp("multi30k") / "run"
    argv = common_flags(
        output_dir, dataset_name=MULTI30K, validation_split="val", test_split="test_2016_flickr",
        max_train_samples=1500, max_eval_samples=40, max_predict_samples=40, config_overrides=TINY,
        vocab_size=1000, max_steps=60, warmup_steps=20, learning_rate=3e-3, eval_strategy="steps", eval_steps=30,
        num_beams=2, no_repeat_ngram_size=2, bf16=True, use_cpu=True,
    )
    results = train_translation.main(argv)
    return output_dir, results


def test_end_to_end_run_writes_every_output(multi30k_run):
    output_dir, results = multi30k_run
    expected = ["config.json", "model.safetensors", "generation_config.json", "configuration_scratch_transformer.py",
                "modeling_scratch_transformer.py", "tokenizer.json", "tokenizer_config.json", "all_results.json",
                "generated_predictions.txt", "training_curve.png", "README.md"]
    for name in expected:
        assert (output_dir / name).is_file(), name
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    losses = [entry["loss"] for entry in history if "loss" in entry]
    assert len(losses) >= 5 and losses[-1] < losses[0] - 0.5, losses
    all_results = json.loads((output_dir / "all_results.json").read_text())
    assert all_results["test_samples"] == 40 and all_results["test_num_beams"] == 2
    predictions = (output_dir / "generated_predictions.txt").read_text(encoding="utf-8").splitlines()
    assert len(predictions) == 40
    assert (output_dir / "training_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    config = json.loads((output_dir / "config.json").read_text())
    tokenizer_json = json.loads((output_dir / "tokenizer.json").read_text())
    assert config["vocab_size"] == len(tokenizer_json["model"]["vocab"])
    assert set(config["auto_map"]) == {"AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM"}
    generation = json.loads((output_dir / "generation_config.json").read_text())
    assert generation["num_beams"] == 2 and generation["max_length"] == 40
    assert generation["no_repeat_ngram_size"] == 2


def test_test_predictions_are_the_saved_model_decoded_in_fp32(multi30k_run):
    """Training ran under bf16 autocast; the final test decodes the saved fp32 weights, so a user who
    loads the folder and translates the test sources gets exactly generated_predictions.txt."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from scratch_transformer.data import load_translation_dataset
    from scratch_transformer.inference import translate

    output_dir, _ = multi30k_run
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    test = load_translation_dataset(MULTI30K, "de", "en", splits=["test_2016_flickr"],
                                    max_samples={"test_2016_flickr": 40})["test_2016_flickr"]
    ours = translate(model, tokenizer, list(test["de"]), batch_size=64, max_source_length=40)
    predictions = (output_dir / "generated_predictions.txt").read_text(encoding="utf-8").splitlines()
    assert ours == predictions


def test_model_card_metadata_matches_results(multi30k_run):
    from huggingface_hub import ModelCard

    output_dir, _ = multi30k_run
    text = (output_dir / "README.md").read_text(encoding="utf-8")
    metadata = yaml.safe_load(text.split("---")[1])
    assert metadata["language"] == ["de", "en"]
    card = ModelCard.load(output_dir / "README.md")
    all_results = json.loads((output_dir / "all_results.json").read_text())
    bleu = [r.metric_value for r in card.data.eval_results if r.metric_type == "bleu"]
    assert bleu == [all_results["test_bleu"]]
    assert f"| {all_results['test_bleu']} |" in text
    assert "| beam 2, length penalty 1, no repeated 2-gram |" in text  # the test's decoding, as run
    assert "inverse_sqrt schedule" in text and "SchedulerType" not in text  # the default (Noam)


def test_fine_tune_from_checkpoint_keeps_tokenizer(multi30k_run, tmp_path):
    output_dir, _ = multi30k_run
    argv = common_flags(
        tmp_path / "ft", model_name_or_path=output_dir, dataset_name=MULTI30K, validation_split="val",
        test_split="test_2016_flickr", max_train_samples=200, max_eval_samples=10, max_predict_samples=10,
        max_steps=5, warmup_steps=2, learning_rate=1e-3, num_beams=1, average_last_checkpoints=0,
    )
    results = train_translation.main(argv)
    assert (tmp_path / "ft" / "tokenizer.json").read_text() == (output_dir / "tokenizer.json").read_text()
    assert results["all_results"]["num_parameters"] == json.loads(
        (output_dir / "all_results.json").read_text())["num_parameters"]
    history = json.loads((tmp_path / "ft" / "trainer_state.json").read_text())["log_history"]
    assert history[0]["loss"] < 6.0  # starts from the trained weights, not from scratch (ln 1000 = 6.9)


def test_memorisation_reaches_bleu_above_90(tmp_path):
    """A tiny model that fits 64 pairs must score > 90 BLEU on them through generate + sacreBLEU."""
    words_de = ["Hund", "Katze", "Mann", "Frau", "Kind", "Ball", "Haus", "Auto", "rot", "blau", "läuft", "spielt"]
    words_en = ["dog", "cat", "man", "woman", "child", "ball", "house", "car", "red", "blue", "runs", "plays"]
    import random

    rng = random.Random(0)
    rows = []
    for _ in range(64):
        idx = [rng.randrange(len(words_de)) for _ in range(rng.randint(3, 6))]
        rows.append({"translation": {"de": " ".join(words_de[i] for i in idx).capitalize() + ".",
                                     "en": " ".join(words_en[i] for i in idx).capitalize() + "."}})
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    argv = common_flags(
        tmp_path / "mem", train_file=path, validation_file=path, test_file=path, train_split="train",
        validation_split="validation", test_split="test", config_overrides=TINY, vocab_size=300,
        tokenizer_min_frequency=1, per_device_train_batch_size=16, max_steps=320, warmup_steps=40,
        learning_rate=3e-3, label_smoothing_factor=0.0, num_beams=1, save_strategy="no", do_eval=False,
        average_last_checkpoints=0, train_sampling_strategy="group_by_length",  # must not reorder predictions
    )
    results = train_translation.main(argv)
    assert results["test_bleu"] > 90, results["examples"]


def _batch_max_lengths(indices, lengths, batch_size):
    return [max(lengths[i] for i in indices[k : k + batch_size]) for k in range(0, len(indices), batch_size)]


def _sweep_correlation(batch_max, run=50):
    """Mean Pearson correlation between a batch's position within each run of `run` batches and its length."""
    import torch

    corrs = []
    for k in range(0, len(batch_max) - run + 1, run):
        y = torch.tensor(batch_max[k : k + run], dtype=torch.float64)
        x = torch.arange(run, dtype=torch.float64)
        corrs.append(torch.corrcoef(torch.stack([x, y]))[0, 1].item())
    return sum(corrs) / len(corrs)


def test_length_grouped_sampler_groups_lengths_but_shuffles_batch_order():
    """Batches hold similar lengths (little padding) but come in random order, not in HF's 50-batch
    sweeps from long to short, and the order is a function of (seed, epoch) only."""
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from scratch_transformer.translation import EpochSeededLengthGroupedSampler

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(3, 41, (29000,), generator=generator).tolist()
    batch_size = 128
    sampler = EpochSeededLengthGroupedSampler(batch_size, dataset=None, lengths=lengths, seed=42)
    indices = list(sampler)
    assert sorted(indices) == list(range(len(lengths)))
    assert indices == list(sampler)  # same (seed, epoch): same order
    sampler.set_epoch(1)
    assert indices != list(sampler)

    ours = _batch_max_lengths(indices, lengths, batch_size)
    assert ours[0] == max(lengths)  # the longest batch first, so memory errors show at once
    padding = sum(m * min(batch_size, len(lengths) - k * batch_size) for k, m in enumerate(ours)) / sum(lengths) - 1
    assert padding < 0.05  # uniform lengths 3..40: random batches would pad ~80%
    assert abs(_sweep_correlation(ours)) < 0.2

    stock = LengthGroupedSampler(batch_size, lengths=lengths, generator=torch.Generator().manual_seed(42))
    assert _sweep_correlation(_batch_max_lengths(list(stock), lengths, batch_size)) < -0.9  # HF's sweep


translate_script = load_script("translate")


def test_translate_script_rejects_bad_input_before_work(multi30k_run, tmp_path, capsys):
    output_dir, _ = multi30k_run
    model = str(output_dir)
    bad = {
        "unrecognized arguments: --bogus": ["--model", model, "--bogus", "3", "Ein Hund."],
        "--num_beams must be >= 1": ["--model", model, "--num_beams", "0", "Ein Hund."],
        "no such folder": ["--model", str(tmp_path / "missing"), "Ein Hund."],
        "its folder does not exist": ["--model", model, "--output_file", str(tmp_path / "no" / "x.txt"), "Ein Hund."],
    }
    for message, argv in bad.items():
        with pytest.raises(SystemExit):
            translate_script.main(argv)
        assert message in capsys.readouterr().err, message
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Grüße\n".encode("latin-1"))
    with pytest.raises(SystemExit, match="not UTF-8 text"):
        translate_script.main(["--model", model, "--input_file", str(latin1)])


def test_translate_script_files_empty_and_byte_order_mark(multi30k_run, tmp_path):
    output_dir, _ = multi30k_run
    model = str(output_dir)
    empty, out = tmp_path / "empty.txt", tmp_path / "out.txt"
    empty.write_text("")
    assert translate_script.main(["--model", model, "--input_file", str(empty), "--output_file", str(out)]) == []
    assert out.read_text() == ""
    plain, bom = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_text("Zwei Hunde spielen im Schnee.\n\nEin Mann.\n", encoding="utf-8")
    bom.write_text("Zwei Hunde spielen im Schnee.\n\nEin Mann.\n", encoding="utf-8-sig")
    expected = translate_script.main(["--model", model, "--input_file", str(plain), "--num_beams", "1"])
    assert len(expected) == 3 and expected[1] == ""
    assert translate_script.main(["--model", model, "--input_file", str(bom), "--num_beams", "1"]) == expected


def test_translate_function_and_pipeline_edge_cases(multi30k_run):
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from scratch_transformer import TranslationPipeline
    from scratch_transformer.inference import translate

    output_dir, _ = multi30k_run
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(output_dir), AutoTokenizer.from_pretrained(output_dir)
    with pytest.raises(ValueError, match="one string"):
        translate(model, tokenizer, "Ein Hund.")
    with pytest.raises(ValueError, match="num_return_sequences"):
        translate(model, tokenizer, ["Ein Hund.", "Eine Frau."], num_return_sequences=2)
    with pytest.raises(ValueError, match="num_beams"):
        translate(model, tokenizer, ["Ein Hund."], num_beams=0)
    pipe = TranslationPipeline(model=model, tokenizer=tokenizer)
    assert pipe("") == [{"translation_text": ""}]
    assert pipe([]) == []
    assert pipe("Ein Hund.", num_beams=1) == [{"translation_text": translate(model, tokenizer, ["Ein Hund."],
                                                                             num_beams=1)[0]}]


def test_negative_no_repeat_ngram_size_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="no_repeat_ngram_size must be >= 0"):
        train_translation.main(common_flags(tmp_path / "run", dataset_name=MULTI30K, no_repeat_ngram_size=-1))
