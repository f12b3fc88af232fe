"""configs/wmt14_en_de_base.json, the paper's base model and training on WMT 2014 English->German (docs/scale_out.md):
the file against the paper (sizes, schedule, token batches, decoding) and against the training script's parser,
then the recipe itself under torchrun (2 CPU processes, gloo) for a few steps on synthetic parallel text, with
only the sizes and the data overridden.
"""

import json
import math
import random
import re
import subprocess
import sys

import pytest
import torch
from conftest import REPO_ROOT
from helpers import subprocess_env, train_translation

from scratch_transformer.training import noam_peak_learning_rate
from scratch_transformer.translation import _parse_overrides

RECIPE = REPO_ROOT / "configs" / "wmt14_en_de_base.json"
SCRIPT = REPO_ROOT / "scripts" / "train_translation.py"
RECIPE_GPUS = 8  # the GPU count the recipe's batch is laid out for (docs/scale_out.md), as in the paper (5.2)
PAPER_TOKENS_PER_STEP = 25_000  # paper 5.1: about 25000 source and 25000 target tokens a batch

# the torchrun run: only the sizes, the data and the save interval differ from the recipe
TINY_SIZES = {"d_model": 32, "num_heads": 2, "encoder_layers": 1, "decoder_layers": 1, "d_ff": 64}
STEPS, TOKENS, PROCESSES = 4, 96, 2
TRAIN_PAIRS, HELD_OUT_PAIRS = 300, 12


def recipe() -> dict:
    return json.loads(RECIPE.read_text(encoding="utf-8"))


def tokens_per_step(values: dict, gpus: int = RECIPE_GPUS) -> int:
    """Source (and target) tokens of one optimizer step, padding included: GPUs x tokens per process x accumulation."""
    return gpus * values["max_tokens_per_batch"] * values.get("gradient_accumulation_steps", 1)


# ---------------------------------------------------------------- the file (no training)


def test_the_recipe_is_the_papers_base_model_and_training():
    values = recipe()
    model = _parse_overrides(values["config_overrides"])
    assert {key: model[key] for key in ("d_model", "num_heads", "encoder_layers", "decoder_layers", "d_ff")} == \
        {"d_model": 512, "num_heads": 8, "encoder_layers": 6, "decoder_layers": 6, "d_ff": 2048}  # Table 3, base
    assert model["dropout"] == 0.1 and model["share_encoder_decoder_embeddings"] is True  # 5.4; 3.4 joint vocabulary
    assert values["vocab_size"] == 37000  # 5.1: shared source-target BPE of about 37000 tokens
    assert (values["dataset_name"], values["dataset_config_name"]) == ("wmt/wmt14", "de-en")
    assert (values["source_lang"], values["target_lang"]) == ("en", "de")
    assert (values["validation_split"], values["test_split"]) == ("validation", "test")  # newstest2013, newstest2014
    # 5.3: Adam (0.9, 0.98, 1e-9), lrate = d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), 4000 warm-up steps
    assert (values["adam_beta1"], values["adam_beta2"], values["adam_epsilon"]) == (0.9, 0.98, 1e-9)
    assert values["lr_scheduler_type"] == "inverse_sqrt" and values["noam_factor"] == 1.0
    assert values["warmup_steps"] == 4000 and values["max_steps"] == 100_000  # 5.2: 100,000 steps
    assert noam_peak_learning_rate(512, 4000, values["noam_factor"]) == pytest.approx(6.988e-4, rel=1e-3)
    assert values["label_smoothing_factor"] == 0.1  # 5.4
    assert abs(tokens_per_step(values) - PAPER_TOKENS_PER_STEP) <= 0.1 * PAPER_TOKENS_PER_STEP  # 5.1
    assert (values["num_beams"], values["length_penalty"]) == (4, 0.6)  # 6.1
    assert values["average_last_checkpoints"] == 5 and values["save_total_limit"] >= 5  # 6.1
    assert values["precision"] == "auto"
    assert "max_train_minutes" not in values and "use_cpu" not in values  # a schedule in steps, on GPUs


def test_every_key_of_the_recipe_is_an_argument_of_the_training_script(tmp_path):
    values = recipe()
    model_args, data_args, training_args = train_translation.parse_args([str(RECIPE)])
    for key, value in values.items():
        parsed = next(getattr(args, key) for args in (model_args, data_args, training_args) if hasattr(args, key))
        parsed = getattr(parsed, "value", parsed)  # enums (lr_scheduler_type, eval_strategy) -> their string
        if key != "precision":  # auto is resolved for this machine
            assert parsed == value, key
    misspelt = tmp_path / "misspelt.json"
    misspelt.write_text(json.dumps({**values, "lenght_penalty": 0.6}), encoding="utf-8")
    with pytest.raises(ValueError, match="unknown argument.*lenght_penalty"):
        train_translation.parse_args([str(misspelt)])


def test_fewer_gpus_keep_the_batch_with_accumulation():
    """docs/scale_out.md: 1 GPU with 8 accumulation steps (or 2 with 4, 4 with 2) takes the same tokens a step."""
    values = recipe()
    for gpus in (1, 2, 4):
        rescaled = {**values, "gradient_accumulation_steps": RECIPE_GPUS // gpus}
        assert tokens_per_step(rescaled, gpus) == tokens_per_step(values)


# ---------------------------------------------------------------- the recipe under torchrun


WORDS = ("house dog cat tree water light night day city man woman child book table road river song bird "
         "green old small big red new good long fast cold").split()


def write_synthetic_folder(folder, seed: int = 0) -> None:
    """train/validation/test.{en,de}: line-aligned made-up sentences of 3-10 words, the German side a fixed
    word-for-word substitution of the English one read backwards (something for the model to learn)."""
    rng = random.Random(seed)
    german = {word: word[::-1] + "en" for word in WORDS}
    folder.mkdir()
    for split, count in (("train", TRAIN_PAIRS), ("validation", HELD_OUT_PAIRS), ("test", HELD_OUT_PAIRS)):
        english = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 10))) for _ in range(count)]
        (folder / f"{split}.en").write_text("\n".join(english) + "\n", encoding="utf-8")
        (folder / f"{split}.de").write_text("\n".join(" ".join(german[w] for w in reversed(s.split()))
                                                      for s in english) + "\n", encoding="utf-8")


def tiny_overrides(text: str) -> str:
    """The recipe's config_overrides with the sizes of TINY_SIZES; every other field (dropout, shared
    embeddings, ...) as the recipe has it."""
    fields = dict(item.split("=", 1) for item in text.split(","))
    fields.update({key: str(value) for key, value in TINY_SIZES.items()})
    return ",".join(f"{key}={value}" for key, value in fields.items())


@pytest.fixture(scope="module")
def recipe_run(tmp_path_factory):
    """configs/wmt14_en_de_base.json under torchrun, 2 CPU processes, STEPS steps on synthetic pairs: the model
    and vocabulary shrunk, token batches of TOKENS per process, a checkpoint every step (to average them), data
    loading in the main process (worker processes add about a third to this run's time); the schedule, optimizer,
    loss, decoding, validation and test are the recipe's. Returns (output dir, log text)."""
    root = tmp_path_factory.mktemp("wmt14_recipe")
    data, out, log_path = root / "data", root / "run", root / "torchrun.log"
    write_synthetic_folder(data)
    flags = {"dataset_name": data, "output_dir": out, "config_overrides": tiny_overrides(recipe()["config_overrides"]),
             "vocab_size": 300, "max_steps": STEPS, "max_tokens_per_batch": TOKENS, "save_steps": 1,
             "logging_steps": 1, "max_source_length": 32, "max_target_length": 32, "preprocessing_num_workers": 1,
             "dataloader_num_workers": 0, "per_device_eval_batch_size": 8, "disable_tqdm": True}
    argv = [str(RECIPE)] + [str(part) for key, value in flags.items() for part in (f"--{key}", value)]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(PROCESSES),
               str(SCRIPT), *argv]
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run(command, cwd=REPO_ROOT, env=subprocess_env(), stdout=log, stderr=subprocess.STDOUT,
                              timeout=300)
    text = log_path.read_text(encoding="utf-8")
    assert done.returncode == 0, text[-4000:]
    return out, text


def test_recipe_run_keeps_the_recipes_model_and_decoding(recipe_run):
    out, _ = recipe_run
    config = json.loads((out / "config.json").read_text())
    assert {key: config[key] for key in TINY_SIZES} == TINY_SIZES  # overridden
    assert config["dropout"] == 0.1 and config["attention_dropout"] == 0.0  # the recipe's
    assert config["share_encoder_decoder_embeddings"] is True and config["tie_word_embeddings"] is True
    assert config["vocab_size"] <= 300
    generation = json.loads((out / "generation_config.json").read_text())
    assert generation["num_beams"] == 4 and generation["length_penalty"] == 0.6
    assert generation.get("no_repeat_ngram_size", 0) == 0
    results = json.loads((out / "all_results.json").read_text())
    assert results["test_num_beams"] == 4 and results["test_samples"] == HELD_OUT_PAIRS  # the 'test' split
    assert results["eval_sentences"] == HELD_OUT_PAIRS  # the 'validation' split, each sentence once


def test_recipe_run_trains_with_the_recipes_optimizer_and_noam_schedule(recipe_run):
    out, _ = recipe_run
    args = torch.load(out / "training_args.bin", weights_only=False)  # the Trainer's arguments, as trained
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon) == (0.9, 0.98, 1e-9)
    assert args.label_smoothing_factor == 0.1 and args.max_grad_norm == 0.0 and args.world_size == PROCESSES
    assert args.warmup_steps == 4000 and args.max_tokens_per_batch == TOKENS
    peak = noam_peak_learning_rate(TINY_SIZES["d_model"], 4000)  # eq. 3 with the overridden d_model
    assert args.learning_rate == pytest.approx(peak, rel=1e-12)
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    logged = {entry["step"]: entry for entry in history if "loss" in entry}
    assert sorted(logged) == list(range(1, STEPS + 1))
    for step, entry in logged.items():
        # HF's scheduler is one step behind eq. 3's step_num: step k trains with d^-0.5 * (k - 1) * warmup^-1.5
        assert entry["learning_rate"] == pytest.approx(peak * (step - 1) / 4000, rel=1e-6, abs=1e-15), step
    results = json.loads((out / "all_results.json").read_text())
    assert results["lr_schedule"] == f"inverse_sqrt over the steps, 4000 warm-up steps, peak learning rate {peak:g}"


def test_recipe_run_reaches_its_steps_on_token_batches_with_finite_loss(recipe_run):
    out, log = recipe_run
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == STEPS
    found = re.search(rf"token batches: at most {TOKENS} tokens per process and batch .*, (\d+) global batches of "
                      rf"{PROCESSES} process\(es\) per epoch", log)
    assert found, "no token-batch line in the log"
    global_batches = int(found.group(1))
    sentence_batches = math.ceil(TRAIN_PAIRS / (PROCESSES * 8))  # what per_device_train_batch_size 8 would give
    assert global_batches != sentence_batches
    losses = {entry["step"]: entry for entry in state["log_history"] if "loss" in entry}
    for step, entry in losses.items():
        assert entry["epoch"] == pytest.approx(step / global_batches), step  # one step = one global token batch
        assert math.isfinite(entry["loss"]) and entry["loss"] > 0, step
    results = json.loads((out / "all_results.json").read_text())
    assert math.isfinite(results["train_loss"]) and results["train_samples"] == TRAIN_PAIRS
    assert math.isfinite(results["eval_loss"])
    card = (out / "README.md").read_text(encoding="utf-8")
    assert f"{STEPS} steps of batches of up to {TOKENS} source and {TOKENS} target tokens x {PROCESSES}" in card
    checkpoints = sorted(path.name for path in out.glob("checkpoint-*"))
    assert checkpoints == [f"checkpoint-{step}" for step in range(1, STEPS + 1)]  # save_total_limit 5 keeps them
    averaging = json.loads((out / "averaging_results.json").read_text())
    assert math.isfinite(averaging["averaged_bleu"])  # the last STEPS checkpoints were averaged and compared
