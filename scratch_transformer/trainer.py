"""The main job's Trainer: HF's Seq2SeqTrainer with length-grouped, shuffled training batches (of a number of
sentences, or of a number of tokens: batching.py) and evaluation that scores every sentence once, in dataset
order, on any number of processes."""

import inspect
import logging
from functools import partial

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader, SequentialSampler
from transformers import Seq2SeqTrainer
from transformers.trainer_pt_utils import LengthGroupedSampler
from transformers.trainer_utils import seed_worker

from .batching import TokenBatchSampler, padding_fraction, pair_lengths
from .tokenization import make_tokenizer_config_portable
from .training import WallClockBudgetCallback, budget_schedule

logger = logging.getLogger(__name__)


def length_grouped_indices(lengths: np.ndarray, batch_size: int, generator: torch.Generator) -> np.ndarray:
    """HF's `get_length_grouped_indices` on a numpy array, giving the same indices for the same generator state.

    A random permutation (one `torch.randperm` draw from `generator`), cut into mega-batches of
    min(P // (4 batch_size), 50) (at least 1) batches, each sorted by decreasing length (stable: equal lengths
    keep their permuted order, as Python's sorted(reverse=True) does); then the longest pair of all is swapped
    with the first pair of the first mega-batch. HF sorts Python lists with a key per index; this sorts numpy
    arrays, which takes a second, not minutes, at millions of pairs.

    Args:
        lengths: (P,) int array, a pair's length in tokens. batch_size: pairs per (global) batch.

    Returns:
        (P,) int64 array of the indices 0..P-1, each once.
    """
    lengths = np.asarray(lengths)
    mega_batch_mult = max(min(len(lengths) // (batch_size * 4), 50), 1)
    indices = torch.randperm(len(lengths), generator=generator).numpy()
    megabatch_size = mega_batch_mult * batch_size
    megabatches = [indices[i : i + megabatch_size] for i in range(0, len(lengths), megabatch_size)]
    megabatches = [mb[np.argsort(-lengths[mb], kind="stable")] for mb in megabatches]
    if not megabatches:
        return indices.astype(np.int64)
    maximums = np.array([lengths[mb[0]] for mb in megabatches])
    max_idx = int(np.argmax(maximums))  # the first of equal maxima, as torch.argmax
    megabatches[0][0], megabatches[max_idx][0] = megabatches[max_idx][0], megabatches[0][0]
    return np.concatenate(megabatches).astype(np.int64)


def takes_label_smoothing(model) -> bool:
    """Whether `model`'s forward takes a `label_smoothing` argument for its own loss (ours does; HF's don't)."""
    return "label_smoothing" in inspect.signature(model.forward).parameters


class EpochSeededLengthGroupedSampler(LengthGroupedSampler):
    """Length-grouped batches in shuffled order; the order depends only on (seed, epoch).

    HF's `get_length_grouped_indices` sorts each mega-batch of 50 batches by length and returns its
    batches longest-first, so training runs in 50-step sweeps from long to short sentences. With it,
    the main job's greedy output length on the validation set swung between 10 and 24 tokens from one
    evaluation to the next (loops on long inputs); with shuffled batches (and attention dropout) it
    stayed within 13.9-16.5 from step 1000 on and the validation loss was lower at every evaluation.
    Here the full batches are shuffled after grouping (as fairseq does), which keeps the padding
    saving and removes the sweep; the longest batch stays first and a short last batch stays last.
    Seeding by (seed, epoch), like accelerate's seedable sampler, makes a run resumed mid-epoch
    replay the interrupted epoch's batches exactly, and every process draw the same order.

    `lengths` is a (P,) numpy array (`length_grouped_indices` does HF's grouping on it); the indices are
    yielded from numpy arrays, a chunk at a time, so that no Python list of P indices is built.
    """

    def __init__(self, batch_size, dataset, lengths, seed):
        super().__init__(batch_size, dataset=dataset, lengths=np.asarray(lengths))
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch):  # called by the Trainer (through accelerate's DataLoaderShard) every epoch
        self.epoch = epoch

    def epoch_indices(self) -> np.ndarray:
        """This epoch's (P,) order of the pair indices."""
        self.generator = torch.Generator().manual_seed(self.seed + self.epoch)
        indices = length_grouped_indices(self.lengths, self.batch_size, generator=self.generator)
        n_full = len(indices) // self.batch_size
        batches = indices[: n_full * self.batch_size].reshape(n_full, self.batch_size)
        # batch 0 holds the longest sequence (memory errors show at once): keep it first, shuffle the rest
        order = np.array([0] + (torch.randperm(n_full - 1, generator=self.generator) + 1).tolist()
                         if n_full else [], dtype=np.int64)
        return np.concatenate([batches[order].reshape(-1), indices[n_full * self.batch_size :]])

    def __iter__(self):
        indices = self.epoch_indices()
        for start in range(0, len(indices), 1 << 16):
            yield from indices[start : start + (1 << 16)].tolist()


class TranslationTrainer(Seq2SeqTrainer):
    """Seq2SeqTrainer whose `group_by_length` groups by max(source, target) length, for training only.

    HF groups by the source length alone, which leaves the targets padded by 48% on Multi30k
    (their logits over the whole vocabulary are the costliest part of a step); grouping by the
    longer side leaves 12%. Groups are of the global batch (all processes, all accumulation steps),
    so N processes of batch b see the same batches as one process of batch N * b. With a training-time
    budget (WallClockBudgetCallback) the learning-rate schedule is laid out on it. Evaluation and the
    test translate and score every sentence exactly once, in dataset order, on any number of processes.

    With `max_tokens_per_batch` N in the arguments, training batches hold up to N tokens per process instead
    of a number of sentences (`batching.TokenBatchSampler`; paper 5.1, fairseq's --max-tokens): one step of
    W processes takes a global batch of up to W x N tokens, the same global batches for any W at the same
    W x N. The loss stays normalised by the labelled tokens of the whole step (all accumulation steps and
    processes): HF counts them (`num_items_in_batch`) whatever the batch sizes. Pairs longer than N on a side
    are refused when the Trainer is built (ValueError), before any step.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._epoch_seeded_sampler = None  # the training sampler whose epoch _run_epoch sets
        self.token_batch_sampler = None
        if getattr(self.args, "max_tokens_per_batch", None) and self.train_dataset is not None:
            if not self.model_accepts_loss_kwargs:  # HF then divides each batch's mean loss by the steps
                raise ValueError("--max_tokens_per_batch needs a model whose loss takes num_items_in_batch "
                                 "(accepts_loss_kwargs): batches of different sizes must be weighted by their tokens")
            self.token_batch_sampler = self._make_token_batch_sampler(self.train_dataset)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """Seq2SeqTrainer's save_model (the final folder, and each checkpoint's), then the saved tokenizer made to
        load on transformers 4.x too (`tokenization.make_tokenizer_config_portable`)."""
        super().save_model(output_dir, _internal_call)
        if self.args.should_save:
            make_tokenizer_config_portable(output_dir or self.args.output_dir)

    def _data_seed(self) -> int:
        return self.args.data_seed if self.args.data_seed is not None else self.args.seed

    def _make_token_batch_sampler(self, dataset) -> TokenBatchSampler:
        max_tokens = self.args.max_tokens_per_batch
        if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__len__"):
            raise ValueError("--max_tokens_per_batch needs a training set of known size (not a streamed one)")
        source_lengths, target_lengths = pair_lengths(dataset)
        sampler = TokenBatchSampler(source_lengths, target_lengths, max_tokens, num_processes=self.args.world_size,
                                    seed=self._data_seed())
        padding = padding_fraction([shard for batch in sampler.shards for shard in batch], source_lengths,
                                   target_lengths)
        logger.info("token batches: at most %d tokens per process and batch (source and target each, padding "
                    "included), %d global batches of %d process(es) per epoch, %.1f%% padding", max_tokens,
                    len(sampler.global_batches), self.args.world_size, 100 * padding["total"])
        return sampler

    def get_train_dataloader(self) -> DataLoader:
        """HF's training DataLoader, or with `max_tokens_per_batch` one whose batch_sampler is the
        TokenBatchSampler. accelerate wraps it in BatchSamplerShard (shard k of each step to process k) and,
        on resume, in SkipBatchSampler (skip_first_batches), as for HF's own samplers."""
        if self.token_batch_sampler is None:
            return super().get_train_dataloader()
        dataset, collator = self.train_dataset, self.data_collator
        if isinstance(dataset, datasets.Dataset):
            dataset = self._remove_unused_columns(dataset, description="Training")
        else:
            collator = self._get_collator_with_removed_columns(collator, description="Training")
        args = self.args
        dataloader = DataLoader(
            dataset, batch_sampler=self.token_batch_sampler, collate_fn=collator,
            num_workers=args.dataloader_num_workers, pin_memory=args.dataloader_pin_memory,
            persistent_workers=args.dataloader_persistent_workers,
            multiprocessing_context=args.dataloader_multiprocessing_context,
            prefetch_factor=args.dataloader_prefetch_factor, in_order=args.dataloader_in_order,
            worker_init_fn=partial(seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index),
        )
        self._epoch_seeded_sampler = self.token_batch_sampler
        return self.accelerator.prepare(dataloader)

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if self.args.train_sampling_strategy != "group_by_length" or "labels" not in dataset.column_names:
            return super()._get_train_sampler(train_dataset)
        lengths = np.maximum(*pair_lengths(dataset))  # from the Arrow list offsets: no Python lists of the ids
        batch = self.args.train_batch_size * self.args.gradient_accumulation_steps * self.args.world_size
        self._epoch_seeded_sampler = EpochSeededLengthGroupedSampler(batch, dataset=dataset, lengths=lengths,
                                                                     seed=self._data_seed())
        return self._epoch_seeded_sampler

    def _run_epoch(self, *args, **kwargs):
        # HF forwards set_epoch to the sampler through accelerate's wrappers, but a run resumed mid-epoch on
        # several processes has SkipBatchSampler(BatchSamplerShard(...)) there, which passes nothing on: the
        # sampler would replay epoch 0's order in a later epoch. Setting it here reaches it on every path.
        epoch = kwargs["epoch"] if "epoch" in kwargs else args[1]
        if self._epoch_seeded_sampler is not None:
            self._epoch_seeded_sampler.set_epoch(epoch)
        return super()._run_epoch(*args, **kwargs)

    def create_scheduler(self, num_training_steps, optimizer=None):
        # With a training-time budget the schedule follows the clock, not a step count fixed in advance.
        budget = next((cb for cb in self.callback_handler.callbacks if isinstance(cb, WallClockBudgetCallback)), None)
        if self.lr_scheduler is None and budget is not None and getattr(self.args, "schedule_on_budget", False):
            self.lr_scheduler = budget_schedule(optimizer or self.optimizer, self.args.lr_scheduler_type,
                                                self.args.warmup_steps, budget, self.args.lr_scheduler_kwargs)
            self._created_lr_scheduler = True
        return super().create_scheduler(num_training_steps, optimizer)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """HF's training loss; with label_smoothing_factor and a model whose forward takes `label_smoothing`
        (ours), the model computes the label-smoothed loss itself in one fused cross-entropy, instead of HF's
        LabelSmoother taking float32 log-probabilities of the logits in several passes: the same loss (paper
        5.4; (1 - eps) * nll + eps * mean over the vocabulary of -log p, over labelled tokens, normalised by
        num_items_in_batch); in the 25-minute main job a step took 0.637 s with it, 0.690 s without (2026-12-01,
        AMD EPYC, docs/results.md). Other models (Marian) keep HF's."""
        smoother = self.label_smoother
        if smoother is None or "labels" not in inputs or not takes_label_smoothing(
                self.accelerator.unwrap_model(model)):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.label_smoother = None  # HF's compute_loss then leaves the labels to the model and returns its loss
        try:
            return super().compute_loss(model, {**inputs, "label_smoothing": smoother.epsilon}, return_outputs,
                                        num_items_in_batch)
        finally:
            self.label_smoother = smoother

    def evaluation_loop(self, *args, **kwargs):
        # Seq2SeqTrainer.evaluate() and predict() switch the gathering to accelerator.gather, which keeps the
        # sentences that the distributed sampler repeats to even out the last batches across processes (1000
        # test sentences in batches of 32 on 2 processes came back as 1024). gather_for_metrics drops them:
        # every sentence is translated and scored once, in dataset order, whatever the processes and batch.
        self.gather_function = self.accelerator.gather_for_metrics
        return super().evaluation_loop(*args, **kwargs)

    def _issue_warnings_after_load(self, load_result) -> None:
        # A checkpoint holds a tied weight once (lm_head.weight is the decoder's embedding): HF listed it as a
        # "missing key" at every resume. Tied keys are left out of the warning (and tied again); others are named.
        tied = set(getattr(self.model, "all_tied_weights_keys", None) or {})
        missing = [key for key in load_result.missing_keys if key not in tied]
        if len(missing) != len(load_result.missing_keys):
            self.model.tie_weights()
        super()._issue_warnings_after_load(load_result._replace(missing_keys=missing)
                                           if hasattr(load_result, "_replace") else load_result)

    def _get_eval_sampler(self, eval_dataset):
        # HF also groups evaluation batches by length when group_by_length is on, and returns the
        # predictions in that shuffled order; ours are scored against the references in dataset order.
        if eval_dataset is None:
            return None
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None
