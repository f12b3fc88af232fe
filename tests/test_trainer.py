"""scratch_transformer.trainer: length-grouped training batches in shuffled order, the learning-rate schedule on a
training-time budget (the gathering of each sentence once across processes is tested end to end in
test_scale_out.py)."""

import functools

import torch
from transformers import Seq2SeqTrainingArguments as TrainingArguments
from transformers.trainer_pt_utils import LengthGroupedSampler

from scratch_transformer.trainer import EpochSeededLengthGroupedSampler, TranslationTrainer
from scratch_transformer.training import WallClockBudgetCallback


def _batch_max_lengths(indices, lengths, batch_size):
    return [max(lengths[i] for i in indices[k : k + batch_size]) for k in range(0, len(indices), batch_size)]


def _sweep_correlation(batch_max, run=50):
    """Mean Pearson correlation between a batch's position within each run of `run` batches and its length."""
    corrs = []
    for k in range(0, len(batch_max) - run + 1, run):
        y = torch.tensor(batch_max[k : k + run], dtype=torch.float64)
        x = torch.arange(run, dtype=torch.float64)
        corrs.append(torch.corrcoef(torch.stack([x, y]))[0, 1].item())
    return sum(corrs) / len(corrs)


def test_length_grouped_sampler_groups_lengths_but_shuffles_batch_order():
    """Batches hold similar lengths (little padding) but come in random order, not in HF's 50-batch
    sweeps from long to short, and the order is a function of (seed, epoch) only."""
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


def test_a_budget_callback_lays_the_schedule_on_the_clock(tmp_path):
    """With a WallClockBudgetCallback, create_scheduler builds the time-based schedule: the learning rate depends
    on the fraction of the budget used, not on the step count."""
    model = torch.nn.Linear(2, 2)
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, lr_scheduler_type="linear", warmup_steps=0.5,
                             learning_rate=1.0, report_to="none")
    args.schedule_on_budget = True
    budget = WallClockBudgetCallback(max_minutes=1.0)
    trainer = TranslationTrainer(model=model, args=args, callbacks=[budget])
    trainer.create_optimizer_and_scheduler(num_training_steps=10)
    optimizer, scheduler = trainer.optimizer, trainer.lr_scheduler
    budget.elapsed_at_last_step = 15.0  # a quarter of the budget: half-way through the warm-up
    scheduler.step()
    assert abs(optimizer.param_groups[0]["lr"] - 0.5) < 1e-6
    budget.elapsed_at_last_step = 45.0  # half-way through the decay, whatever the step count
    scheduler.step()
    assert abs(optimizer.param_groups[0]["lr"] - 0.5) < 1e-6
    plain = TranslationTrainer(model=torch.nn.Linear(2, 2), args=TrainingArguments(
        output_dir=str(tmp_path), use_cpu=True, lr_scheduler_type="linear", warmup_steps=0, learning_rate=1.0,
        report_to="none"))
    plain.create_optimizer_and_scheduler(num_training_steps=10)
    plain.lr_scheduler.step()
    assert abs(plain.optimizer.param_groups[0]["lr"] - 0.9) < 1e-6  # no budget: HF's schedule over the steps


def test_label_smoothing_goes_to_our_model_and_stays_hf_for_marian(tmp_path):
    """With label_smoothing_factor, TranslationTrainer hands eps to our model's fused loss (the model gets the
    labels and `label_smoothing`), which equals HF's LabelSmoother on the logits; a model whose forward has
    no such argument (Marian) keeps HF's path. The training loss value is the same either way."""
    from transformers import MarianConfig, MarianMTModel
    from transformers.trainer_pt_utils import LabelSmoother

    from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration

    torch.manual_seed(0)
    ours = ScratchTransformerForConditionalGeneration(ScratchTransformerConfig(
        vocab_size=40, d_model=16, num_heads=2, encoder_layers=1, decoder_layers=1, d_ff=32, dropout=0.0,
        attention_dropout=0.0))
    marian = MarianMTModel(MarianConfig(vocab_size=40, d_model=16, encoder_layers=1, decoder_layers=1,
                                        encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                        decoder_ffn_dim=32, dropout=0.0, pad_token_id=0, decoder_start_token_id=0,
                                        max_position_embeddings=16))
    labels = torch.randint(1, 40, (3, 6))
    labels[0, 4:] = -100
    inputs = {"input_ids": torch.randint(1, 40, (3, 5)), "attention_mask": torch.ones(3, 5, dtype=torch.long),
              "labels": labels,  # and the decoder's inputs, as the collator gives them: labels shifted right
              "decoder_input_ids": torch.cat([torch.zeros(3, 1, dtype=torch.long), labels[:, :-1].clamp(min=0)], 1)}
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, label_smoothing_factor=0.1, report_to="none")
    for model, fused in ((ours, True), (marian, False)):
        model.eval()
        seen = {}
        forward = model.forward

        @functools.wraps(forward)
        def spy(*a, **kw):
            seen.update(kw)
            return forward(*a, **kw)

        model.forward = spy
        trainer = TranslationTrainer(model=model, args=args)
        loss = trainer.compute_loss(model, dict(inputs), num_items_in_batch=torch.tensor(15))
        assert ("label_smoothing" in seen) is fused and ("labels" in seen) is fused
        assert trainer.label_smoother is not None  # restored for evaluation's loss
        model.forward = forward
        with torch.no_grad():
            logits = model(**{k: v for k, v in inputs.items()}).logits
        expected = LabelSmoother(epsilon=0.1)({"logits": logits}, labels, num_items_in_batch=torch.tensor(15))
        torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-5)
