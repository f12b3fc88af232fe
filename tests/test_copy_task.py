"""scripts/train_copy_task.py end to end: Trainer learns the copy task, the saved model reloads and generates alike."""

import importlib.util
import json
import sys

import pytest
import torch
from conftest import REPO_ROOT
from transformers import AutoModelForSeq2SeqLM


def load_script():
    """scripts/ is not a package: load the script as a module from its file."""
    spec = importlib.util.spec_from_file_location("train_copy_task", REPO_ROOT / "scripts" / "train_copy_task.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def check_saved_model(script, results, output_dir):
    """The saved folder reloads through the Auto class and gives the same greedy copies as the trained model."""
    saved = json.loads((output_dir / "copy_task_results.json").read_text())
    assert saved["eval_correct"] == results["eval_correct"]
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    assert type(reloaded).__name__ == "ScratchTransformerForConditionalGeneration"
    assert not reloaded.training
    assert reloaded.generate.__self__ is reloaded  # GenerationMixin present
    sources = results["eval_sources"]
    assert script.greedy_copies(reloaded, sources) == results["predictions"]
    assert script.exact_match(results["predictions"], sources) == results["eval_correct"]
    # the saved generation config alone (no max_new_tokens passed) is enough to copy
    batch = script.collate([{"input_ids": s + [script.EOS], "labels": s + [script.EOS]} for s in sources[:8]])
    with torch.no_grad():
        default = reloaded.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    explicit = reloaded.generate(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
        max_new_tokens=batch["input_ids"].size(1) + 1, do_sample=False, num_beams=1,
    )
    assert torch.equal(default, explicit)


def test_copy_task_learns_and_reloads(tmp_path):
    script = load_script()
    results = script.main([
        "--output_dir", str(tmp_path),
        "--max_steps", "250",
        "--warmup_steps", "50",
        "--min_length", "3",
        "--max_length", "6",
        "--num_symbols", "10",
        "--train_size", "20000",
        "--eval_size", "100",
        "--monitor_size", "20",
        "--logging_steps", "250",
        "--seed", "0",
    ])
    assert results["steps"] == 250
    assert results["eval_total"] == 100
    assert results["eval_exact_match"] >= 0.95, results["history"]
    assert results["history"][-1]["loss"] < results["history"][0]["loss"]
    check_saved_model(script, results, tmp_path)


def test_held_out_sequences_are_not_in_training():
    script = load_script()
    args = script.CopyTaskArguments(num_symbols=3, min_length=2, max_length=3)
    rng = __import__("random").Random(0)
    train = script.random_sequences(20, args, rng)
    held_out = script.random_sequences(10, args, rng, exclude={tuple(s) for s in train})
    assert len({tuple(s) for s in train}) == 20
    assert not {tuple(s) for s in held_out} & {tuple(s) for s in train}
    assert all(2 <= len(s) <= 3 and all(3 <= x < 6 for x in s) for s in train + held_out)


@pytest.mark.slow
def test_copy_task_default_run_is_perfect(tmp_path):
    """The demo as shipped: default settings reach 100% exact match on held-out sequences."""
    script = load_script()
    results = script.main(["--output_dir", str(tmp_path)])
    assert results["eval_exact_match"] == 1.0, results["history"]
    check_saved_model(script, results, tmp_path)
