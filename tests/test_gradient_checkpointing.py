"""Gradient checkpointing: the layers are transformers' GradientCheckpointingLayers, so
activation_checkpointing_enable() (gradient_checkpointing_enable() before transformers 5.x renamed it) and
Trainer(activation_checkpointing=True) / Trainer(gradient_checkpointing=True) recompute each layer in backward
and give the same loss and gradients as a plain backward, dropout included."""

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments

from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer.modeling_scratch_transformer import ScratchTransformerLayer

VOCAB = 40


def make_model(**overrides):
    values = dict(vocab_size=VOCAB, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64,
                  dropout=0.2, attention_dropout=0.1, max_position_embeddings=64)
    values.update(overrides)
    torch.manual_seed(0)
    return ScratchTransformerForConditionalGeneration(ScratchTransformerConfig(**values))


def make_batch(batch: int = 4):
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, VOCAB, (batch, 9), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 5:] = 0
    labels = torch.randint(3, VOCAB, (batch, 7), generator=g)
    labels[2, 4:] = -100
    return {"input_ids": input_ids.masked_fill(attention_mask == 0, 0), "attention_mask": attention_mask,
            "labels": labels}


def loss_and_grads(model, batch, seed=1):
    model.train()
    model.zero_grad()
    torch.manual_seed(seed)
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_the_model_declares_support_and_every_layer_is_switched():
    model = make_model()
    assert model.supports_gradient_checkpointing
    model.activation_checkpointing_enable()
    layers = [m for m in model.modules() if isinstance(m, ScratchTransformerLayer)]
    assert len(layers) == 4 and all(layer.gradient_checkpointing for layer in layers)
    model.activation_checkpointing_disable()
    assert not any(layer.gradient_checkpointing for layer in layers)


@pytest.mark.parametrize("use_reentrant", [False, True])
@pytest.mark.parametrize("pre_layer_norm", [False, True])
def test_checkpointed_backward_gives_the_plain_loss_and_gradients_with_dropout(use_reentrant, pre_layer_norm):
    batch = make_batch()
    model = make_model(pre_layer_norm=pre_layer_norm)
    plain_loss, plain_grads = loss_and_grads(model, batch)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": use_reentrant})
    loss, grads = loss_and_grads(model, batch)
    assert torch.equal(loss, plain_loss)  # the recompute replays the same dropout draws
    assert grads.keys() == plain_grads.keys() and len(grads) > 40
    for name, grad in plain_grads.items():
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    # and dropout is really on: another seed gives another loss
    assert not torch.equal(loss_and_grads(model, batch, seed=2)[0], loss)


def test_checkpointing_recomputes_the_layers_in_backward():
    calls = []
    model = make_model()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    layer = model.model.encoder.layers[0]
    layer.self_attn.register_forward_hook(lambda *args: calls.append(torch.is_grad_enabled()))
    loss_and_grads(model, make_batch())
    assert len(calls) == 2  # forward, and the replay in backward


def test_generate_in_training_mode_with_checkpointing_still_uses_the_cache():
    model = make_model(dropout=0.0, attention_dropout=0.0)
    batch = make_batch()
    expected = model.eval().generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                     max_new_tokens=5)
    model.activation_checkpointing_enable()
    model.train()
    got = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=5)
    assert torch.equal(got, expected)


def _train(tmp_path, checkpointing: str | None):
    batch = make_batch(8)
    rows = [{key: value[i].tolist() for key, value in batch.items()} for i in range(8)]
    model = make_model()
    args = TrainingArguments(
        output_dir=str(tmp_path / f"gc{checkpointing}"), per_device_train_batch_size=4, max_steps=3,
        learning_rate=1e-3, **({checkpointing: True} if checkpointing else {}), report_to="none", seed=0,
        logging_steps=1, save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, use_cpu=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows))
    trainer.train()
    assert model.model.decoder.layers[1].gradient_checkpointing == bool(checkpointing)  # the Trainer switched it on
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")
@pytest.mark.parametrize("checkpointing", ["activation_checkpointing", "gradient_checkpointing"])
def test_trainer_with_gradient_checkpointing_trains_like_without(tmp_path, checkpointing):
    plain_losses, plain_params = _train(tmp_path, None)
    losses, params = _train(tmp_path, checkpointing)
    assert len(losses) == 3
    assert losses == pytest.approx(plain_losses, rel=1e-5)
    for name, value in plain_params.items():
        torch.testing.assert_close(params[name], value, atol=1e-5, rtol=1e-4, msg=name)
    moved = sum(not torch.equal(value, make_model().state_dict()[name]) for name, value in plain_params.items())
    assert moved > 40  # the three steps did train


def test_the_activation_memory_benchmark_measures_less_saved_with_checkpointing(tmp_path):
    from benchmarks.activation_memory import main

    result = main(["--d_model", "32", "--num_heads", "4", "--layers", "2", "--d_ff", "64", "--vocab_size", "50",
                   "--batch_size", "4", "--source_length", "12", "--target_length", "10",
                   "--output_json", str(tmp_path / "memory.json")])
    plain, checkpointed = result["runs"]["plain"], result["runs"]["checkpointed"]
    assert result["same_loss"] and result["max_abs_grad_difference"] == 0
    # checkpointed: each layer keeps its input (b, n, d) float32 and little more
    assert 0 < checkpointed["saved_for_backward_bytes"] < plain["saved_for_backward_bytes"] / 3
    ratio = plain["saved_for_backward_bytes"] / checkpointed["saved_for_backward_bytes"]
    assert result["saved_ratio"] == round(ratio, 2)
    assert (tmp_path / "memory.json").is_file()
