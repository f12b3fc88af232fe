"""scratch_transformer.arguments: the main job's dataclasses refuse bad values when they are made, naming them."""

import pytest

from scratch_transformer.arguments import DataTrainingArguments, ModelArguments, TranslationTrainingArguments


def data(**overrides):
    return DataTrainingArguments(**{"dataset_name": "some/folder", **overrides})


def training(tmp_path, **overrides):
    return TranslationTrainingArguments(**{"output_dir": str(tmp_path / "out"), "use_cpu": True, **overrides})


def test_defaults_are_the_papers_choices(tmp_path):
    args = training(tmp_path)
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.98, 1e-9)  # paper 5.3
    assert args.label_smoothing_factor == 0.1 and args.warmup_steps == 4000  # paper 5.4, 5.3
    assert getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type) == "inverse_sqrt"
    assert not args.overwrite_output_dir
    assert ModelArguments().average_last_checkpoints == 5  # paper 6.1
    decoding = data()
    assert (decoding.num_beams, decoding.length_penalty, decoding.no_repeat_ngram_size) == (None, None, None)


@pytest.mark.parametrize("overrides, message", [
    ({"dataset_name": None}, "give either --dataset_name"),
    ({"train_file": "t.jsonl"}, "not both"),
    ({"source_lang": "en", "target_lang": "en"}, "both 'en'"),
    ({"num_beams": 0}, "num_beams must be >= 1, got 0"),
    ({"no_repeat_ngram_size": -1}, "no_repeat_ngram_size must be >= 0"),
    ({"max_target_length": 0}, "max_target_length must be >= 1 token, got 0"),
    ({"max_source_length": -2}, "max_source_length must be >= 1 token, got -2"),
    ({"max_predict_samples": 0}, "max_predict_samples must be >= 1"),
])
def test_bad_data_arguments_are_refused(overrides, message):
    with pytest.raises(ValueError, match=message):
        data(**overrides)


@pytest.mark.parametrize("overrides, message", [
    ({"learning_rate": 0.0}, "learning_rate must be a finite number > 0, got 0.0"),
    ({"learning_rate": float("nan")}, "learning_rate must be a finite number > 0, got nan"),
    ({"max_train_minutes": -1.0}, "max_train_minutes must be a finite number > 0"),
    ({"warmup_steps": -1}, "warmup_steps must be a finite number >= 0"),
    ({"per_device_train_batch_size": 0}, "per_device_train_batch_size must be >= 1"),
    ({"per_device_eval_batch_size": 0}, "per_device_eval_batch_size must be >= 1"),
    ({"gradient_accumulation_steps": 0}, "gradient_accumulation_steps must be >= 1"),
    ({"label_smoothing_factor": 1.0}, r"label_smoothing_factor must be in \[0, 1\)"),
    ({"label_smoothing_factor": -0.1}, r"label_smoothing_factor must be in \[0, 1\)"),
])
def test_bad_training_arguments_are_refused_before_any_folder_exists(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        training(tmp_path, **overrides)
    assert not (tmp_path / "out").exists()


def test_precision_auto_is_resolved_and_explicit_choices_are_obeyed(tmp_path, monkeypatch):
    from scratch_transformer import training as training_module

    monkeypatch.setattr(training_module, "native_bf16_cpu", lambda: (False, "no avx512_bf16/amx_bf16/bf16 CPU flag"))
    auto = training(tmp_path)
    assert (auto.precision, auto.bf16, auto.fp16) == ("fp32", False, False)
    assert "without native bf16" in auto.precision_reason
    monkeypatch.setattr(training_module, "native_bf16_cpu", lambda: (True, "CPU flags avx512_bf16"))
    assert (training(tmp_path).precision, training(tmp_path).bf16) == ("bf16", True)
    explicit = training(tmp_path, precision="fp32")
    assert (explicit.precision, explicit.bf16, explicit.precision_reason) == ("fp32", False, "--precision fp32")
    flagged = training(tmp_path, bf16=True)
    assert (flagged.precision, flagged.precision_reason) == ("bf16", "--bf16 true")


@pytest.mark.parametrize("overrides, message", [
    ({"precision": "fp8"}, "precision must be auto, bf16, fp16 or fp32"),
    ({"precision": "fp32", "bf16": True}, "--precision fp32 and --bf16 true disagree"),
    ({"max_train_minutes": 5.0, "warmup_steps": 800}, "give warm-up as a fraction of it"),
    ({"restore_callback_states_from_checkpoint": True}, "take their state from the checkpoint themselves"),
])
def test_precision_and_budget_schedule_conflicts_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        training(tmp_path, **overrides)


def test_a_step_schedule_under_a_budget_when_asked(tmp_path):
    args = training(tmp_path, max_train_minutes=5.0, warmup_steps=800, schedule_on_budget=False)
    assert args.warmup_steps == 800


def test_several_test_splits(tmp_path):
    assert data(test_split="test_2016_flickr, test_2017_flickr").test_splits == ["test_2016_flickr",
                                                                                 "test_2017_flickr"]
    with pytest.raises(ValueError, match="--test_file is one file"):
        DataTrainingArguments(train_file="t.jsonl", test_file="x.jsonl", test_split="a,b")
