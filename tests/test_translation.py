"""End-to-end runs of scripts/train_translation.py with tiny models (real Multi30k subset and synthetic pairs)."""

import json
import shutil

import pytest
import yaml
from conftest import MULTI30K, load_script
from helpers import TINY, common_flags, steps_of_known_length, tiny_run_flags, train_translation

pytestmark = pytest.mark.filterwarnings("ignore")





@pytest.fixture(scope="module")
def multi30k_run(tmp_path_factory):
    if not MULTI30K.is_dir():
        pytest.skip("Multi30k not found beside the repo")
    output_dir = tmp_path_factory.mktemp("multi30k") / "run"
    argv = common_flags(
        output_dir, dataset_name=MULTI30K, validation_split="val",
        test_split="test_2016_flickr,test_2017_mscoco",
        max_train_samples=1500, max_eval_samples=40, max_predict_samples=40, config_overrides=TINY,
        vocab_size=1000, max_steps=60, warmup_steps=20, learning_rate=3e-3, eval_strategy="steps", eval_steps=30,
        num_beams=2, length_penalty=1.2, no_repeat_ngram_size=2, early_stopping=True, renormalize_logits=True,
        bf16=True, use_cpu=True,
    )
    results = train_translation.main(argv)
    return output_dir, results


DECODING = ("beam 2, length penalty 1.2, no repeated 2-gram, ending once 2 translations are finished, "
            "renormalised after blocking")


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
    # a class transformers 4.x knows too (5 writes TokenizersBackend): tests/test_remote_code.py
    assert json.loads((output_dir / "tokenizer_config.json").read_text())["tokenizer_class"] == "PreTrainedTokenizerFast"
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
    bleu = [r.metric_value for r in card.data.eval_results
            if r.metric_type == "bleu" and r.dataset_split == "test_2016_flickr"]
    assert bleu == [all_results["test_bleu"]]
    assert f"| {all_results['test_bleu']} |" in text
    assert f"| {DECODING} |" in text  # the test's decoding, as run
    assert "schedule: inverse_sqrt over the steps" in text and "SchedulerType" not in text  # the default (Noam)


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


# ---------------------------------------------------------------- what is tested is what is shipped


def test_fine_tune_tests_and_ships_the_inherited_decoding(multi30k_run, tmp_path):
    """No decoding flags: the fine-tune's test decodes with the checkpoint's beam 2, length penalty 1.2 and
    no repeated 2-gram, early stopping and renormalisation, and saves them; translating the saved folder gives
    generated_predictions.txt."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from scratch_transformer.data import load_translation_dataset
    from scratch_transformer.inference import translate

    output_dir, _ = multi30k_run
    tuned = tmp_path / "ft"
    argv = common_flags(tuned, model_name_or_path=output_dir, dataset_name=MULTI30K, validation_split="val",
                        test_split="test_2016_flickr", max_train_samples=200, max_eval_samples=10,
                        max_predict_samples=64, max_steps=3, warmup_steps=1, learning_rate=1e-3,
                        average_last_checkpoints=0)
    train_translation.main(argv)
    generation = json.loads((tuned / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["no_repeat_ngram_size"]) == (2, 1.2, 2)
    assert (generation["early_stopping"], generation["renormalize_logits"]) == (True, True)
    assert json.loads((tuned / "all_results.json").read_text())["test_num_beams"] == 2
    assert f"| {DECODING} |" in (tuned / "README.md").read_text()
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(tuned), AutoTokenizer.from_pretrained(tuned)
    test = load_translation_dataset(MULTI30K, "de", "en", splits=["test_2016_flickr"],
                                    max_samples={"test_2016_flickr": 64})["test_2016_flickr"]
    shipped = translate(model, tokenizer, list(test["de"]), batch_size=64, max_source_length=40)
    assert shipped == (tuned / "generated_predictions.txt").read_text(encoding="utf-8").splitlines()


# ---------------------------------------------------------------- evaluation never overwrites a model


def folder_bytes(folder):
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


def evaluate_flags(model_dir, output_dir, **extra):
    return common_flags(output_dir, model_name_or_path=model_dir, dataset_name=MULTI30K, validation_split="val",
                        test_split="test_2016_flickr", max_eval_samples=10, max_predict_samples=20, do_train=False,
                        **extra)


def test_evaluating_a_model_in_place_is_refused_and_leaves_it_untouched(multi30k_run, tmp_path):
    output_dir, _ = multi30k_run
    model_dir = tmp_path / "model"
    shutil.copytree(output_dir, model_dir)
    before = folder_bytes(model_dir)
    with pytest.raises(ValueError, match=r"already holds a model.*--overwrite_output_dir"):
        train_translation.main(evaluate_flags(model_dir, model_dir))
    assert folder_bytes(model_dir) == before


def test_evaluating_in_place_when_asked_rewrites_results_but_not_weights(multi30k_run, tmp_path):
    output_dir, _ = multi30k_run
    model_dir = tmp_path / "model"
    shutil.copytree(output_dir, model_dir)
    before = folder_bytes(model_dir)
    train_translation.main(evaluate_flags(model_dir, model_dir, overwrite_output_dir=True))
    after = folder_bytes(model_dir)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "generation_config.json"):
        assert after[name] == before[name], name
    assert len(after["generated_predictions.txt"].decode().splitlines()) == 20
    assert b"README.md" not in before or after["README.md"]  # a card, beside the model it describes


def test_evaluation_into_a_new_folder_writes_results_but_no_card(multi30k_run, tmp_path):
    output_dir, _ = multi30k_run
    results_dir = tmp_path / "eval"
    train_translation.main(evaluate_flags(output_dir, results_dir))
    names = {path.name for path in results_dir.iterdir()}
    assert {"all_results.json", "generated_predictions.txt"} <= names
    assert "README.md" not in names and "model.safetensors" not in names  # no card about weights not there


# ---------------------------------------------------------------- refused before training, nothing left behind


@pytest.mark.parametrize("extra, message", [
    ({"max_target_length": 0}, "max_target_length must be >= 1 token, got 0"),
    ({"max_source_length": -3}, "max_source_length must be >= 1 token, got -3"),
    ({"learning_rate": -1}, "learning_rate must be a finite number > 0, got -1"),
    ({"learning_rate": "nan"}, "learning_rate must be a finite number > 0, got nan"),
    ({"max_train_minutes": 0}, "max_train_minutes must be a finite number > 0, got 0"),
    ({"warmup_steps": -5}, "warmup_steps must be a finite number >= 0, got -5"),
    ({"label_smoothing_factor": 1.5}, r"label_smoothing_factor must be in \[0, 1\), got 1.5"),
    ({"max_eval_samples": 0}, "max_eval_samples must be >= 1"),
])
def test_bad_training_flags_are_refused_before_anything_is_written(tmp_path, extra, message):
    out = tmp_path / "run"
    with pytest.raises(ValueError, match=message):
        train_translation.main(tiny_run_flags(out, **extra))
    assert not out.exists()


def test_a_run_into_a_folder_another_run_writes_is_refused_and_a_finished_run_lets_it_go(tmp_path):
    """Two runs into one folder would train into the same checkpoints: the second is refused before it reads
    anything (the first run's pid in the message); a run that ended, however, holds nothing."""
    import os

    pytest.importorskip("fcntl")
    from scratch_transformer.checkpoints import lock_output_dir, unlock_output_dir

    out = tmp_path / "run"
    other_run = lock_output_dir(str(out))  # as a run in progress holds it (here this process: flock is per open file)
    try:
        with pytest.raises(ValueError, match=rf"output_dir .*run is in use by another run \(pid {os.getpid()},"):
            train_translation.main(tiny_run_flags(out, do_eval=False, do_predict=False))
        assert not out.exists()
    finally:
        unlock_output_dir(other_run)
    train_translation.main(tiny_run_flags(out, do_eval=False, do_predict=False))
    assert (out / "model.safetensors").is_file()
    unlock_output_dir(lock_output_dir(str(out)))  # the finished run released it


def test_a_failing_start_removes_the_empty_output_folder_it_made(tmp_path, monkeypatch):
    """Whatever fails after the folder was made (here the optimizer), a new folder with no file in it goes."""
    import torch

    def broken_adam(*args, **kwargs):
        raise ValueError("Invalid learning rate")

    monkeypatch.setattr(torch.optim, "AdamW", broken_adam)
    monkeypatch.setattr(torch.optim, "Adam", broken_adam)
    out = tmp_path / "run"
    with pytest.raises(ValueError, match="Invalid learning rate"):
        train_translation.main(tiny_run_flags(out))
    assert not out.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    with pytest.raises(ValueError, match="Invalid learning rate"):
        train_translation.main(tiny_run_flags(kept))
    assert kept.is_dir()  # a folder the user made is left where it was


def test_hf_generic_names_in_config_overrides(tmp_path):
    out = tmp_path / "run"
    overrides = "hidden_size=32,num_attention_heads=2,encoder_layers=1,num_hidden_layers=1,intermediate_size=64"
    train_translation.main(tiny_run_flags(out, config_overrides=overrides, do_eval=False, do_predict=False))
    config = json.loads((out / "config.json").read_text())
    assert (config["d_model"], config["num_heads"], config["decoder_layers"], config["d_ff"]) == (32, 2, 1, 64)


def test_resuming_from_a_finished_model_folder_is_refused(multi30k_run, tmp_path):
    output_dir, _ = multi30k_run
    with pytest.raises(ValueError, match=r"no optimizer or scheduler state.*--model_name_or_path"):
        train_translation.main(tiny_run_flags(tmp_path / "run", resume_from_checkpoint=output_dir,
                                              config_overrides=None))
    assert not (tmp_path / "run").exists()


def test_script_prints_a_refusal_without_traceback(tmp_path):
    import subprocess
    import sys

    from conftest import REPO_ROOT

    out = tmp_path / "run"
    done = subprocess.run([sys.executable, REPO_ROOT / "scripts" / "train_translation.py",
                           *tiny_run_flags(out, learning_rate=-1)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    expected = "train_translation.py: error: learning_rate must be a finite number > 0, got -1.0"
    assert done.stderr.strip().splitlines()[-1] == expected
    assert "Traceback" not in done.stderr and not out.exists()


# ---------------------------------------------------------------- several test sets, a looping word counted


def test_every_test_split_is_scored_written_and_carded(multi30k_run):
    from huggingface_hub import ModelCard

    output_dir, _ = multi30k_run
    results = json.loads((output_dir / "all_results.json").read_text())
    assert list(results["test_sets"]) == ["test_2016_flickr", "test_2017_mscoco"]
    headline = results["test_sets"]["test_2016_flickr"]
    assert (headline["bleu"], headline["chrf"], headline["sentences"]) == (results["test_bleu"],
                                                                            results["test_chrf"], 40)
    assert isinstance(headline["repeated_token_outputs"], int)
    mscoco = (output_dir / "generated_predictions_test_2017_mscoco.txt").read_text(encoding="utf-8").splitlines()
    assert len(mscoco) == 40 and results["test_sets"]["test_2017_mscoco"]["sentences"] == 40
    card = ModelCard.load(output_dir / "README.md")
    rows = {(r.dataset_split, r.metric_type): r.metric_value for r in card.data.eval_results}
    assert rows[("test_2017_mscoco", "bleu")] == results["test_sets"]["test_2017_mscoco"]["bleu"]
    assert rows[("test_2016_flickr", "chrf")] == results["test_chrf"]
    text = (output_dir / "README.md").read_text(encoding="utf-8")
    assert "| test_2017_mscoco |" in text and "| test_2016_flickr |" in text


def test_precision_and_schedule_are_recorded(multi30k_run):
    output_dir, _ = multi30k_run
    results = json.loads((output_dir / "all_results.json").read_text())
    assert results["precision"] == "bf16" and results["precision_reason"] == "--bf16 true"
    assert results["lr_schedule"].startswith("inverse_sqrt over the steps, 20 warm-up steps")
    assert "in bf16 (--bf16 true)" in (output_dir / "README.md").read_text(encoding="utf-8")


# ---------------------------------------------------------------- the schedule follows the time budget


def budget_run_flags(output_dir, **extra):
    return tiny_run_flags(output_dir, max_steps=1_000_000, max_train_minutes=0.15, lr_scheduler_type="linear",
                          warmup_steps=0.2, learning_rate=1e-3, logging_steps=1, do_eval=False, do_predict=False,
                          per_device_train_batch_size=8, **extra)


def final_learning_rate(output_dir):
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    rates = [entry["learning_rate"] for entry in history if "learning_rate" in entry]
    return rates, json.loads((output_dir / "trainer_state.json").read_text())["global_step"]


def test_a_budget_run_ends_at_the_end_of_its_learning_rate_schedule(tmp_path, monkeypatch):
    """9 s of training in steps of 0.125 s (the budget's clock simulated: the machine's speed does not matter),
    max_steps out of reach: 72 steps, and the linear decay reaches (within 5% of the peak) its end value, 0, when
    the budget runs out."""
    steps_of_known_length(monkeypatch, 0.125)
    train_translation.main(budget_run_flags(tmp_path / "run"))
    rates, steps = final_learning_rate(tmp_path / "run")
    assert steps == 72
    assert max(rates) > 0.9e-3  # warm-up reached the peak
    assert rates[-1] <= 0.05 * 1e-3, rates[-5:]
    assert rates.index(max(rates)) < len(rates) * 0.4  # the peak came early (warm-up 20% of the time)


def test_a_resumed_budget_run_continues_the_clock(tmp_path, monkeypatch):
    """The training time travels in the checkpoint: a run resumed from a checkpoint taken part-way trains only
    for the rest of the budget, on the rest of the schedule."""
    steps_of_known_length(monkeypatch, 0.125)  # 72 steps in the 9 s, whatever the machine
    first = tmp_path / "first"
    train_translation.main(budget_run_flags(first, save_strategy="steps", save_steps=20, save_total_limit=100))
    checkpoints = sorted(first.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    middle = checkpoints[len(checkpoints) // 2]
    saved = json.loads((middle / "trainer_state.json").read_text())
    seconds = saved["stateful_callbacks"]["WallClockBudgetCallback"]["attributes"]["training_seconds"]
    assert seconds == 0.125 * int(middle.name.split("-")[1]) < 9
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copytree(middle, resumed / middle.name)
    train_translation.main(budget_run_flags(resumed, save_strategy="steps", save_steps=20))
    results = json.loads((resumed / "all_results.json").read_text())
    assert results["train_minutes_excluding_eval"] == 0.15  # the whole budget, not more
    assert json.loads((resumed / "trainer_state.json").read_text())["global_step"] == 72
    rates, _ = final_learning_rate(resumed)
    assert rates[-1] <= 0.05 * 1e-3


# ---------------------------------------------------------------- a config file and flags


def test_config_file_then_flags_that_win(tmp_path):
    config = tmp_path / "job.json"
    config.write_text(json.dumps({"dataset_name": str(MULTI30K), "max_train_minutes": 25, "warmup_steps": 0.3,
                                  "output_dir": "from_file", "num_beams": 4, "precision": "fp32"}))
    model_args, data_args, training_args = train_translation.parse_args(
        [str(config), "--max_train_minutes", "12.5", "--output_dir", str(tmp_path / "half")])
    assert training_args.max_train_minutes == 12.5 and training_args.output_dir == str(tmp_path / "half")
    assert data_args.num_beams == 4 and training_args.precision == "fp32" and training_args.warmup_steps == 0.3
    config.write_text(json.dumps({"dataset_name": str(MULTI30K), "max_trian_minutes": 25}))
    with pytest.raises(ValueError, match="unknown argument.*max_trian_minutes"):
        train_translation.parse_args([str(config)])


def test_the_shipped_config_parses_with_a_half_budget(tmp_path):
    from conftest import REPO_ROOT

    _, data_args, training_args = train_translation.parse_args(
        [str(REPO_ROOT / "configs" / "multi30k_de_en.json"), "--max_train_minutes", "12.5",
         "--output_dir", str(tmp_path / "x")])
    assert training_args.max_train_minutes == 12.5 and training_args.schedule_on_budget
    assert data_args.test_splits == ["test_2016_flickr", "test_2017_flickr", "test_2017_mscoco"]
    assert training_args.precision in ("bf16", "fp32") and training_args.precision_reason


def test_greedy_drops_an_inherited_length_penalty_and_early_stopping_but_keeps_the_rest():
    from types import SimpleNamespace

    from transformers import GenerationConfig

    from scratch_transformer.translation import _resolve_decoding

    model = SimpleNamespace(generation_config=GenerationConfig(num_beams=4, length_penalty=1.2, early_stopping=True,
                                                               renormalize_logits=True, no_repeat_ngram_size=3))
    flags = dict(num_beams=1, length_penalty=None, no_repeat_ngram_size=None, early_stopping=None,
                 renormalize_logits=None, max_target_length=40)
    decoding = _resolve_decoding(SimpleNamespace(model_name_or_path="ckpt"), SimpleNamespace(**flags), model)
    assert decoding == {"num_beams": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 3, "early_stopping": False,
                        "renormalize_logits": True}
    beams = _resolve_decoding(SimpleNamespace(model_name_or_path="ckpt"), SimpleNamespace(**{**flags, "num_beams": 2}),
                              model)
    assert (beams["length_penalty"], beams["early_stopping"]) == (1.2, True)


def test_an_empty_dataset_name_unsets_the_configs_for_data_files(tmp_path):
    from conftest import REPO_ROOT

    config = str(REPO_ROOT / "configs" / "multi30k_de_en.json")
    files = ["--train_file", "train.jsonl", "--validation_file", "val.jsonl", "--output_dir", str(tmp_path / "x")]
    _, data_args, _ = train_translation.parse_args([config, "--dataset_name", "", *files])
    assert data_args.dataset_name is None and data_args.train_file == "train.jsonl"
    with pytest.raises(ValueError, match='not both and not neither \\(--dataset_name "" unsets a config file'):
        train_translation.parse_args([config, *files])


def test_greedy_over_the_shipped_config_drops_its_beam_settings_with_a_log_line(caplog):
    """`--num_beams 1` after configs/multi30k_de_en.json (length penalty 1.2, early stopping): a greedy run, not a
    refusal; the dropped settings are named in the log; the n-gram block and renormalisation stay."""
    import logging
    from types import SimpleNamespace

    from conftest import REPO_ROOT
    from transformers import GenerationConfig

    from scratch_transformer.translation import _resolve_decoding

    _, data_args, _ = train_translation.parse_args([str(REPO_ROOT / "configs" / "multi30k_de_en.json"),
                                                    "--num_beams", "1"])
    model = SimpleNamespace(generation_config=GenerationConfig())
    with caplog.at_level(logging.INFO, logger="scratch_transformer.translation"):
        decoding = _resolve_decoding(SimpleNamespace(model_name_or_path=None), data_args, model)
    assert decoding == {"num_beams": 1, "length_penalty": 1.0, "no_repeat_ngram_size": 3, "early_stopping": False,
                        "renormalize_logits": True}
    assert "greedy search (num_beams 1): dropping the beam-search settings length_penalty 1.2, early_stopping True" \
        in caplog.text


def test_the_shipped_decoding_is_the_search_ctranslate2_runs(tmp_path):
    """The main job's saved decoding: beam 4 that ends once 4 translations are finished and renormalises after
    the n-gram block, so that a CTranslate2 conversion has no decoding difference to log."""
    from conftest import REPO_ROOT
    from transformers import GenerationConfig

    from scratch_transformer.ctranslate2_engine import decoding_differences

    _, data_args, _ = train_translation.parse_args(
        [str(REPO_ROOT / "configs" / "multi30k_de_en.json"), "--output_dir", str(tmp_path / "x")])
    assert (data_args.num_beams, data_args.early_stopping, data_args.renormalize_logits) == (4, True, True)
    shipped = GenerationConfig(num_beams=data_args.num_beams, length_penalty=data_args.length_penalty,
                               no_repeat_ngram_size=data_args.no_repeat_ngram_size,
                               early_stopping=data_args.early_stopping,
                               renormalize_logits=data_args.renormalize_logits)
    assert decoding_differences(shipped) == []
    assert decoding_differences(GenerationConfig(num_beams=4, no_repeat_ngram_size=3)) != []


def test_a_missing_multi30k_folder_says_where_to_get_it(tmp_path):
    out = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match=r"does not exist.*github.com/multi30k/dataset.*bentrevett/multi30k"):
        train_translation.main(tiny_run_flags(out, dataset_name=str(tmp_path / "shared" / "data" / "multi30k" / "raw")))
    assert not out.exists()
