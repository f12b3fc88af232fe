"""scripts/train_copy_task.py end to end: Trainer learns the copy task, the saved model reloads and generates alike."""

import json
import random
from types import SimpleNamespace

import pytest
import torch
from conftest import load_script as load_conftest_script
from transformers import AutoModelForSeq2SeqLM

from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration

FAST_ARGS = [
    "--max_steps", "400",
    "--warmup_steps", "100",
    "--average_every", "10",
    "--min_length", "3",
    "--max_length", "6",
    "--num_symbols", "10",
    "--train_size", "20000",
    "--eval_size", "100",
    "--monitor_size", "20",
    "--logging_steps", "200",
    "--seed", "0",
]


def load_script():
    return load_conftest_script("train_copy_task")


def check_saved_model(script, results, output_dir, max_length):
    """The saved folder reloads through the Auto class and gives the same greedy copies as the trained model."""
    saved = json.loads((output_dir / "copy_task_results.json").read_text())
    assert saved["eval_correct"] == results["eval_correct"]
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    assert isinstance(reloaded, ScratchTransformerForConditionalGeneration)
    assert reloaded.lm_head.weight is reloaded.model.decoder.embed_tokens.weight  # still tied
    sources = results["eval_sources"]
    assert script.greedy_copies(reloaded, sources) == results["predictions"]

    # the saved generation config alone (no max_new_tokens, no greedy flags) is enough to copy
    assert reloaded.generation_config.max_new_tokens == max_length + 1
    copied = [s for s, p in zip(sources, results["predictions"]) if s == p][:8]
    batch = script.collate([{"input_ids": s + [script.EOS], "labels": s + [script.EOS]} for s in copied])
    generated = reloaded.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    assert [row[1 : 1 + row[1:].index(script.EOS)] for row in generated.tolist()] == copied


def test_copy_task_learns_and_reloads(tmp_path):
    script = load_script()
    results = script.main(["--output_dir", str(tmp_path), *FAST_ARGS])
    assert results["steps"] == 400
    assert results["eval_total"] == 100
    assert results["eval_exact_match"] >= 0.95, results["history"]
    assert results["history"][-1]["loss"] < results["history"][0]["loss"]
    assert script.exact_match(results["predictions"], results["eval_sources"]) == results["eval_correct"]
    check_saved_model(script, results, tmp_path, max_length=6)


def test_held_out_sequences_are_not_in_training():
    script = load_script()
    args = script.CopyTaskArguments(num_symbols=3, min_length=2, max_length=3)
    rng = random.Random(0)
    train = script.random_sequences(20, args, rng)
    held_out = script.random_sequences(10, args, rng, exclude={tuple(s) for s in train})
    assert len({tuple(s) for s in train}) == 20
    assert not {tuple(s) for s in held_out} & {tuple(s) for s in train}
    assert all(2 <= len(s) <= 3 and all(3 <= x < 6 for x in s) for s in train + held_out)


def test_weight_averaging_callback_loads_the_mean_of_the_last_snapshots():
    script = load_script()
    torch.manual_seed(0)
    config = ScratchTransformerConfig(vocab_size=13, d_model=16, num_heads=2, encoder_layers=1, decoder_layers=1,
                                      d_ff=32, max_position_embeddings=16)
    model = ScratchTransformerForConditionalGeneration(config)
    callback = script.WeightAveragingCallback(count=2, every=10)
    weight = model.model.encoder.layers[0].ffn.fc1.weight
    seen = []
    for step in range(1, 31):
        with torch.no_grad():
            weight.add_(1.0)
            model.lm_head.weight.add_(1.0)  # tied: the decoder embedding moves too
        if step % 10 == 0:
            seen.append((weight.clone(), model.lm_head.weight.clone()))
        callback.on_step_end(None, SimpleNamespace(global_step=step, max_steps=30), None, model=model)
    callback.on_train_end(None, SimpleNamespace(global_step=30, max_steps=30), None, model=model)
    assert [step for step, _ in callback.snapshots] == [20, 30]
    torch.testing.assert_close(weight, (seen[1][0] + seen[2][0]) / 2)
    torch.testing.assert_close(model.lm_head.weight, (seen[1][1] + seen[2][1]) / 2)
    assert model.lm_head.weight is model.model.decoder.embed_tokens.weight


@pytest.mark.slow
def test_copy_task_default_run_is_perfect(tmp_path):
    """The demo as shipped: default settings reach 100% exact match on held-out sequences."""
    script = load_script()
    results = script.main(["--output_dir", str(tmp_path)])
    assert results["eval_exact_match"] == 1.0, results["history"]
    check_saved_model(script, results, tmp_path, max_length=10)
