"""scratch_transformer.batching and --max_tokens_per_batch: token batches (paper 5.1, fairseq's --max-tokens) that
hold at most N tokens per process on each side, the same global batches on 1 process of N tokens and 2 processes
of N / 2, an order drawn from (seed, epoch) that a resumed run replays (also after SIGKILL), the loss normalised
by the labelled tokens of a whole accumulated step, the refused settings, and the padding on Multi30k."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from accelerate.data_loader import BatchSamplerShard
from conftest import MULTI30K, REPO_ROOT, TINY_SENTENCES
from helpers import TINY, common_flags, kill_at_checkpoint, subprocess_env, train_translation
from transformers import DataCollatorForSeq2Seq, TrainerCallback

from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer.arguments import TranslationTrainingArguments
from scratch_transformer.batching import (
    TokenBatchSampler,
    batch_tokens,
    pack_token_batches,
    padding_fraction,
    pair_lengths,
)
from scratch_transformer.checkpoints import last_complete_checkpoint
from scratch_transformer.tokenization import train_tokenizer
from scratch_transformer.trainer import TranslationTrainer

SCRIPT = REPO_ROOT / "scripts" / "train_translation.py"
needs_multi30k = pytest.mark.skipif(not MULTI30K.is_dir(), reason="Multi30k not found beside the repo")


def random_lengths(n=2000, seed=0):
    """Source and target lengths of n pairs, 3..60 tokens, the target about the source's length (as Multi30k)."""
    rng = np.random.default_rng(seed)
    source = rng.integers(3, 50, n)
    target = np.clip(source + rng.integers(-6, 11, n), 3, 60)
    return source, target


def padded(batch, lengths):
    return len(batch) * int(lengths[batch].max())


# ---------------------------------------------------------------- packing


def test_batches_hold_at_most_n_source_and_n_target_tokens_and_every_pair_once():
    source, target = random_lengths()
    max_tokens = 400
    sampler = TokenBatchSampler(source, target, max_tokens, seed=1)
    batches = list(sampler)
    assert sorted(i for batch in batches for i in batch) == list(range(len(source)))
    for batch in batches:
        batch = np.array(batch)
        assert padded(batch, source) <= max_tokens and padded(batch, target) <= max_tokens  # the paper's count
        assert batch_tokens(batch, source, target) == max(padded(batch, source), padded(batch, target))  # fairseq's
    full = [batch_tokens(batch, source, target) for batch in batches]
    assert np.mean(full) > 0.95 * max_tokens  # filled up, not a fixed number of sentences
    assert len({len(batch) for batch in batches}) > 5  # short pairs: more of them per batch
    assert padding_fraction(batches, source, target)["total"] < 0.08  # grouped by length (Multi30k: slow test)
    shuffled = [np.arange(k, k + 20) for k in range(0, len(source), 20)]  # 20 pairs in dataset order
    assert padding_fraction(shuffled, source, target)["total"] > 0.25


def test_the_order_is_a_function_of_seed_and_epoch_with_the_same_batches_every_epoch():
    source, target = random_lengths()
    sampler = TokenBatchSampler(source, target, 400, seed=3)
    epoch0 = list(sampler)
    assert epoch0 == list(sampler) == list(TokenBatchSampler(source, target, 400, seed=3))  # no hidden state
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != epoch0 and len(epoch1) == len(epoch0) == len(sampler)
    assert sorted(map(tuple, epoch1)) == sorted(map(tuple, epoch0))  # fairseq: the batches stay, their order moves
    assert list(TokenBatchSampler(source, target, 400, seed=4)) != epoch0
    # the heaviest batch (attention size n x L^2) first in every epoch, so memory errors show at step 1
    weight = [len(b) * max(source[b].max(), target[b].max()) ** 2 for b in map(np.array, epoch0)]
    assert epoch0[0] == epoch0[int(np.argmax(weight))] and epoch1[0] == epoch0[0]


def test_pair_lengths_come_from_the_arrow_columns_in_dataset_order():
    import datasets

    rows = {"input_ids": [[5] * n for n in (3, 7, 2, 9)], "labels": [[6] * n for n in (4, 1, 8, 5)]}
    dataset = datasets.Dataset.from_dict(rows).select([3, 0, 2])  # an indices mapping, as max_train_samples leaves
    source, target = pair_lengths(dataset)
    assert source.dtype == target.dtype == np.int64
    assert source.tolist() == [9, 3, 2] and target.tolist() == [5, 4, 8]
    listed = [{"input_ids": s, "labels": t} for s, t in zip(rows["input_ids"], rows["labels"])]
    assert [a.tolist() for a in pair_lengths(listed)] == [[3, 7, 2, 9], [4, 1, 8, 5]]
    with pytest.raises(ValueError, match=r"tokenised columns \['labels'\]"):
        pair_lengths(datasets.Dataset.from_dict({"input_ids": rows["input_ids"]}))


def test_a_pair_longer_than_the_budget_is_refused_naming_it():
    source, target = np.array([5, 30, 8, 41]), np.array([6, 12, 44, 9])
    with pytest.raises(ValueError, match=r"--max_tokens_per_batch 40: 2 training pair\(s\).*longest: 44, pair 2.*"
                                         r">= 44.*--max_source_length/--max_target_length <= 40"):
        TokenBatchSampler(source, target, 40)
    assert len(TokenBatchSampler(source, target, 44)) >= 1
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        pack_token_batches(source, target, 0)


# ---------------------------------------------------------------- processes


def shards_per_process(sampler, processes):
    """What each process gets from accelerate's BatchSamplerShard (what Trainer's accelerator.prepare makes)."""
    return [list(BatchSamplerShard(sampler, num_processes=processes, process_index=rank)) for rank in range(processes)]


@pytest.mark.parametrize("processes", [2, 3])
def test_processes_of_a_share_of_the_tokens_see_the_global_batches_of_one_process(processes):
    source, target = random_lengths(6000)
    max_tokens = 4800
    one = list(TokenBatchSampler(source, target, max_tokens, seed=7))
    many = TokenBatchSampler(source, target, max_tokens // processes, num_processes=processes, seed=7)
    per_process = shards_per_process(many, processes)
    assert [len(batches) for batches in per_process] == [len(one)] * processes  # same number of steps each
    cost, spread = np.maximum(source, target), []
    for step, batch in enumerate(one):
        shards = [np.array(batches[step]) for batches in per_process]
        assert sorted(np.concatenate(shards).tolist()) == sorted(batch)  # the same global batch, split
        sizes = [padded(shard, cost) for shard in shards]
        longest = int(cost[batch].max())
        assert max(sizes) <= max_tokens // processes + longest  # at most one pair over the share
        counts = [len(shard) for shard in shards]
        assert max(counts) - min(counts) <= 1
        # processes of one step get batches of about the same size: one pair, and the lengths' spread
        assert max(sizes) - min(sizes) <= longest + max(counts) * (longest - int(cost[batch].min()))
        spread.append((max(sizes) - min(sizes)) / max(sizes))
    assert np.mean(spread) < 0.05


def test_a_global_batch_smaller_than_the_processes_gives_every_process_a_pair():
    source, target = np.array([4, 5, 6]), np.array([4, 5, 6])
    per_process = shards_per_process(TokenBatchSampler(source, target, 100, num_processes=4), 4)
    assert [len(batches) for batches in per_process] == [1, 1, 1, 1]
    assert all(len(batches[0]) == 1 for batches in per_process)
    given = sorted(batches[0][0] for batches in per_process)
    assert set(given) == {0, 1, 2} and len(given) == 4  # each pair, one of them twice


# ---------------------------------------------------------------- the Trainer


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TINY_SENTENCES * 3, vocab_size=300, min_frequency=1, model_max_length=64)


def token_dataset(tokenizer, n=48, seed=0):
    """n pairs of random token ids of 3..30 tokens (EOS last), as _tokenize leaves them."""
    import datasets

    rng = np.random.default_rng(seed)
    lengths = rng.integers(3, 31, (n, 2))
    ids = [[rng.integers(4, len(tokenizer), k - 1).tolist() + [tokenizer.eos_token_id] for k in pair]
           for pair in lengths]
    return datasets.Dataset.from_dict({"input_ids": [p[0] for p in ids], "attention_mask": [[1] * len(p[0])
                                       for p in ids], "labels": [p[1] for p in ids]})


def tiny_model(tokenizer):
    torch.manual_seed(0)
    config = ScratchTransformerConfig(vocab_size=len(tokenizer), d_model=32, num_heads=4, encoder_layers=1,
                                      decoder_layers=1, d_ff=64, dropout=0.0, pad_token_id=tokenizer.pad_token_id,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                      decoder_start_token_id=tokenizer.bos_token_id)
    return ScratchTransformerForConditionalGeneration(config)


def make_trainer(tmp_path, tokenizer, dataset, callbacks=(), model=None, **overrides):
    values = {"output_dir": str(tmp_path / "out"), "use_cpu": True, "precision": "fp32", "report_to": "none",
              "max_tokens_per_batch": 160, "max_steps": 1, "warmup_steps": 0, "save_strategy": "no",
              "do_eval": False, "do_predict": False, "max_grad_norm": 0.0, "seed": 5, **overrides}
    model = model or tiny_model(tokenizer)
    return TranslationTrainer(model=model, args=TranslationTrainingArguments(**values), train_dataset=dataset,
                              data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
                              processing_class=tokenizer, callbacks=list(callbacks))


def _hf_epoch_order(lengths, batch_size, seed, epoch):
    """EpochSeededLengthGroupedSampler's order as it was computed on Python lists with HF's
    get_length_grouped_indices (the reference of the main job's batches)."""
    from transformers.trainer_pt_utils import get_length_grouped_indices

    generator = torch.Generator().manual_seed(seed + epoch)
    indices = get_length_grouped_indices(list(lengths), batch_size, generator=generator)
    n_full = len(indices) // batch_size
    batches = [indices[i * batch_size : (i + 1) * batch_size] for i in range(n_full)]
    order = [0] + (torch.randperm(n_full - 1, generator=generator) + 1).tolist() if n_full else []
    return [i for b in order for i in batches[b]] + indices[n_full * batch_size :]


@pytest.mark.parametrize("pairs, batch_size", [(1, 4), (7, 4), (129, 128), (2000, 32), (29000, 128), (30001, 64)])
def test_the_numpy_length_grouping_gives_hfs_indices(pairs, batch_size):
    """The main job's group_by_length order is unchanged: the numpy grouping gives, index for index, what
    HF's get_length_grouped_indices gave for every (seed, epoch), ties (lengths of few values) included."""
    from transformers.trainer_pt_utils import get_length_grouped_indices

    from scratch_transformer.trainer import EpochSeededLengthGroupedSampler, length_grouped_indices

    lengths = np.random.default_rng(pairs).integers(3, 12, pairs)  # many equal lengths
    for seed in (0, 42):
        ours = length_grouped_indices(lengths, batch_size, torch.Generator().manual_seed(seed))
        theirs = get_length_grouped_indices(lengths.tolist(), batch_size, generator=torch.Generator().manual_seed(seed))
        assert ours.tolist() == theirs
        sampler = EpochSeededLengthGroupedSampler(batch_size, dataset=None, lengths=lengths, seed=seed)
        for epoch in (0, 3):
            sampler.set_epoch(epoch)
            order = list(sampler)
            assert order == _hf_epoch_order(lengths, batch_size, seed, epoch)
            assert all(type(i) is int for i in order[:5])  # Python ints for the dataset


def test_group_by_length_reads_the_lengths_from_arrow_not_from_lists(tmp_path, tokenizer, monkeypatch):
    """The sampler's lengths, max(source, target) per pair, come from the Arrow list offsets (a numpy array):
    reading a column of the dataset as Python lists would fail here."""
    import datasets

    dataset = token_dataset(tokenizer, n=40)
    trainer = make_trainer(tmp_path, tokenizer, dataset, max_tokens_per_batch=None, per_device_train_batch_size=8,
                           train_sampling_strategy="group_by_length")
    source, target = pair_lengths(dataset)

    def no_column_lists(self, key):
        if isinstance(key, str):
            raise AssertionError(f"column {key!r} read as a list")
        return original(self, key)

    original = datasets.Dataset.__getitem__
    monkeypatch.setattr(datasets.Dataset, "__getitem__", no_column_lists)
    sampler = trainer._get_train_sampler(dataset)
    assert isinstance(sampler.lengths, np.ndarray)
    assert sampler.lengths.tolist() == np.maximum(source, target).tolist()
    assert sorted(sampler) == list(range(40))


def test_the_trainer_trains_on_token_batches_in_the_samplers_order(tmp_path, tokenizer):
    dataset = token_dataset(tokenizer)
    trainer = make_trainer(tmp_path, tokenizer, dataset)
    sampler = trainer.token_batch_sampler
    expected = list(sampler)
    batches = list(trainer.get_train_dataloader())
    assert len(batches) == len(expected) > 4
    source, target = pair_lengths(dataset)
    for batch, indices in zip(batches, expected):
        n, s = batch["input_ids"].shape
        assert (n, s) == (len(indices), source[indices].max())  # padded to the batch's longest source
        assert batch["labels"].shape == (n, target[indices].max())
        assert n * max(s, batch["labels"].shape[1]) <= 160
        assert batch["input_ids"][0, : source[indices[0]]].tolist() == dataset[indices[0]]["input_ids"]


def test_the_trainer_refuses_pairs_longer_than_the_budget_when_it_is_built(tmp_path, tokenizer):
    with pytest.raises(ValueError, match=r"--max_tokens_per_batch 20: \d+ training pair\(s\)"):
        make_trainer(tmp_path, tokenizer, token_dataset(tokenizer), max_tokens_per_batch=20)


def test_the_trainer_refuses_a_model_whose_loss_ignores_the_step_token_count(tmp_path, tokenizer):
    model = tiny_model(tokenizer)
    model.accepts_loss_kwargs = False  # HF would then average batch means: short batches would weigh as much
    with pytest.raises(ValueError, match="num_items_in_batch"):
        make_trainer(tmp_path, tokenizer, token_dataset(tokenizer), model=model)


def test_each_epoch_sets_the_samplers_epoch_on_every_wrapper_path(tmp_path, tokenizer, monkeypatch):
    """A resumed multi-process run wraps the sampler in SkipBatchSampler(BatchSamplerShard(...)), through which
    HF's set_epoch does not pass: _run_epoch sets it itself."""
    trainer = make_trainer(tmp_path, tokenizer, token_dataset(tokenizer))
    trainer.get_train_dataloader()
    seen = []
    monkeypatch.setattr(TranslationTrainer.__mro__[1], "_run_epoch",
                        lambda self, *args, **kwargs: seen.append(trainer.token_batch_sampler.epoch))
    trainer._run_epoch(model=None, epoch=3, train_dataloader=None)
    trainer._run_epoch(None, 5, None)
    assert seen == [3, 5]


class GradientRecorder(TrainerCallback):
    def __init__(self):
        self.gradients = None

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.gradients = {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def test_accumulated_token_batches_give_the_gradient_of_their_concatenation(tmp_path, tokenizer):
    """Two accumulation steps of token batches of different sizes: the gradient is that of the label-smoothed
    loss summed over both batches' labelled tokens and divided by their count (as one batch of all of them),
    not the mean of the two batch means."""
    dataset = token_dataset(tokenizer)
    recorder = GradientRecorder()
    trainer = make_trainer(tmp_path, tokenizer, dataset, callbacks=[recorder], gradient_accumulation_steps=2,
                           label_smoothing_factor=0.1)
    first_two = list(trainer.token_batch_sampler)[:2]
    trainer.train()
    labels_per_batch = [sum(len(dataset[i]["labels"]) for i in batch) for batch in first_two]
    assert labels_per_batch[0] != labels_per_batch[1]

    model = tiny_model(tokenizer).train()
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)

    def summed_loss(indices):
        batch = collator([{k: dataset[i][k] for k in ("input_ids", "attention_mask", "labels")} for i in indices])
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=batch["decoder_input_ids"]).logits
        return F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                               label_smoothing=0.1, reduction="sum")

    (summed_loss(first_two[0] + first_two[1]) / sum(labels_per_batch)).backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    sum(summed_loss(batch) / count for batch, count in zip(first_two, labels_per_batch)).div(2).backward()
    mean_of_means = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    assert recorder.gradients.keys() == expected.keys()
    for name, gradient in expected.items():
        torch.testing.assert_close(recorder.gradients[name], gradient, rtol=1e-4, atol=1e-6, msg=name)
    difference = max((mean_of_means[k] - expected[k]).abs().max().item() for k in expected)
    assert difference > 1e-3  # the test tells the two normalisations apart


# ---------------------------------------------------------------- arguments


def training(tmp_path, **overrides):
    return TranslationTrainingArguments(**{"output_dir": str(tmp_path / "out"), "use_cpu": True, **overrides})


@pytest.mark.parametrize("overrides, message", [
    ({"max_tokens_per_batch": 0}, "max_tokens_per_batch must be a whole number of tokens >= 1, got 0"),
    ({"max_tokens_per_batch": -4096}, "got -4096"),
    ({"max_tokens_per_batch": 40.5}, "got 40.5"),
    ({"max_tokens_per_batch": 4096, "train_sampling_strategy": "sequential"}, "train_sampling_strategy 'sequential'"),
    ({"max_tokens_per_batch": 4096, "train_sampling_strategy": "batch_rebalance"}, "'batch_rebalance' cannot"),
    ({"max_tokens_per_batch": 4096, "auto_find_batch_size": True}, "--auto_find_batch_size cannot be used"),
    ({"max_tokens_per_batch": 4096, "dataloader_drop_last": True}, "--dataloader_drop_last cannot be used"),
    ({"max_tokens_per_batch": 4096, "average_tokens_across_devices": False}, "average_tokens_across_devices true"),
    ({"max_tokens_per_batch": 4096, "accelerator_config": {"split_batches": True}}, "split_batches"),
])
def test_bad_token_batch_settings_are_refused(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        training(tmp_path, **overrides)


def test_token_batches_accept_the_main_jobs_group_by_length(tmp_path):
    args = training(tmp_path, max_tokens_per_batch=4096, train_sampling_strategy="group_by_length")
    assert args.max_tokens_per_batch == 4096
    assert training(tmp_path).max_tokens_per_batch is None  # off by default: sentence batches


# ---------------------------------------------------------------- the main job (tiny model, Multi30k subset)


RUN = {"dataset_name": MULTI30K, "validation_split": "val", "test_split": "test_2016_flickr", "config_overrides": TINY,
       "vocab_size": 500, "max_train_samples": 64, "warmup_steps": 2, "learning_rate": 3e-3, "logging_steps": 1,
       "do_eval": False, "do_predict": False, "average_last_checkpoints": 0, "max_tokens_per_batch": 256,
       "max_steps": 16, "save_strategy": "steps", "save_steps": 5, "save_total_limit": 4}  # 9 batches an epoch


def flags(output_dir, **extra):
    return common_flags(output_dir, **{k: v for k, v in {**RUN, **extra}.items() if v is not None})


def log_steps(output_dir):
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    return {entry["step"]: entry for entry in history if "loss" in entry}


def assert_same_training(run, reference, steps, rel=1e-5):
    logs, reference_logs = log_steps(run), log_steps(reference)
    assert sorted(logs) == sorted(reference_logs) == list(range(1, steps + 1))
    for step, entry in reference_logs.items():
        assert logs[step]["epoch"] == pytest.approx(entry["epoch"]), step
        assert logs[step]["loss"] == pytest.approx(entry["loss"], rel=rel, abs=1e-6), step
        assert logs[step]["grad_norm"] == pytest.approx(entry["grad_norm"], rel=10 * rel, abs=1e-6), step


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """16 steps of token batches (1.8 epochs of 9 batches), checkpoints every 5."""
    torch.set_num_threads(1)  # for this module's runs: conftest's torch_threads_restored gives the count back after it
    out = tmp_path_factory.mktemp("token_batches") / "uninterrupted"
    train_translation.main(flags(out))
    return out


@needs_multi30k
def test_the_main_job_trains_on_token_batches(uninterrupted):
    logs = log_steps(uninterrupted)
    assert logs[9]["epoch"] == pytest.approx(1.0)  # 64 pairs in 9 batches of <= 256 tokens
    assert logs[16]["loss"] < logs[1]["loss"]
    results = json.loads((uninterrupted / "all_results.json").read_text())
    assert results["train_samples"] == 64


@needs_multi30k
def test_resuming_in_the_second_epoch_replays_its_token_batches(uninterrupted, tmp_path):
    out = tmp_path / "continued"
    train_translation.main(flags(out, resume_from_checkpoint=uninterrupted / "checkpoint-10"))
    assert_same_training(out, uninterrupted, RUN["max_steps"])


@needs_multi30k
def test_a_run_killed_in_the_second_epoch_reruns_to_the_same_training(uninterrupted, tmp_path):
    out = tmp_path / "killed"
    argv = flags(out)
    kill_at_checkpoint(argv, out / "checkpoint-10", tmp_path / "killed.log")
    assert not (out / "all_results.json").exists()
    assert 10 <= int(last_complete_checkpoint(out).rsplit("-", 1)[1]) < RUN["max_steps"]
    train_translation.main(argv)  # the same command again: resumes from the last complete checkpoint
    assert_same_training(out, uninterrupted, RUN["max_steps"])


def torchrun(script_flags, log_path):
    with open(log_path, "w", encoding="utf-8") as log:
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                               str(SCRIPT), *map(str, script_flags)], cwd=REPO_ROOT, env=subprocess_env(),
                              check=False, stdout=log, stderr=subprocess.STDOUT, timeout=600)
    assert done.returncode == 0, log_path.read_text(encoding="utf-8")[-4000:]


@pytest.mark.slow
@needs_multi30k
def test_two_processes_of_half_the_tokens_train_like_one_process_with_accumulation(tmp_path):
    """torchrun, 2 processes of 64 tokens vs 1 process of 128, both with 2 accumulation steps: the same global
    batches, so the same loss and gradient norm at every step (the loss divided by the labelled tokens of both
    processes and both micro-steps); then the 2 processes resume in the second epoch and replay it."""
    settings = {"max_tokens_per_batch": 128, "gradient_accumulation_steps": 2, "max_steps": 14, "save_steps": 5}
    one, two = tmp_path / "one", tmp_path / "two"
    train_translation.main(flags(one, **settings))
    torchrun(flags(two, **{**settings, "max_tokens_per_batch": 64}), tmp_path / "two.log")
    logs = log_steps(one)
    assert logs[9]["epoch"] == pytest.approx(1.0)  # 64 pairs in 17 global batches of <= 128 tokens: 9 steps
    assert_same_training(two, one, settings["max_steps"], rel=1e-4)
    resumed = tmp_path / "resumed"
    torchrun(flags(resumed, resume_from_checkpoint=two / "checkpoint-10", **{**settings, "max_tokens_per_batch": 64}),
             tmp_path / "resumed.log")
    assert_same_training(resumed, one, settings["max_steps"], rel=1e-4)


@needs_multi30k
def test_padding_on_multi30k_is_under_five_percent():
    """Multi30k train de->en with the main job's tokenizer (joint BPE of 8000, configs/multi30k_de_en.json):
    4.4% of the source and target positions of 4096-token batches are padding (1 or 2 processes)."""
    from scratch_transformer.data import load_translation_dataset

    raw = load_translation_dataset(MULTI30K, "de", "en", splits=["train"])["train"]
    tok = train_tokenizer(list(raw["de"]) + list(raw["en"]), vocab_size=8000, min_frequency=2, model_max_length=128)
    source = np.array([len(e.ids) for e in tok.backend_tokenizer.encode_batch(list(raw["de"]))])
    target = np.array([len(e.ids) for e in tok.backend_tokenizer.encode_batch(list(raw["en"]))])
    assert len(source) == 29000 and source.max() <= 128 and target.max() <= 128  # nothing truncated
    for processes in (1, 2):
        sampler = TokenBatchSampler(source, target, 4096 // processes, num_processes=processes, seed=42)
        fraction = padding_fraction(list(sampler), source, target)
        print(f"\n{processes} process(es): padding {fraction}")
        assert fraction["total"] < 0.05 and fraction["source"] < 0.05 and fraction["target"] < 0.05
        assert len(sampler) == processes * len(sampler.global_batches)
        assert len(sampler.global_batches) < 29000 / 200  # ~250 pairs a batch
