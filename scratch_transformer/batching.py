"""Token-based training batches: sentence pairs grouped by length and packed up to a token budget.

The paper (5.1): "Sentence pairs were batched together by approximate sequence length. Each training
batch contained a set of sentence pairs containing approximately 25000 source tokens and 25000 target
tokens." fairseq's --max-tokens N does this: a batch of n pairs costs `n * max(source, target length)`
tokens, padding included, and holds at most N. Since max over the batch of max(s_i, t_i) is
max(longest source, longest target), that count is at most N exactly when the padded source
(n x longest source) and the padded target (n x longest target) are each at most N: the paper's
"N source tokens and N target tokens", counted as the batch is stored. That is the count used here.

Units: lengths and budgets are in tokens of the tokenised pair (`input_ids` and `labels`, EOS included;
the decoder input is the labels shifted right, so it has the labels' length).

Several processes (DDP): one optimizer micro-step of `num_processes` processes takes one *global batch*
of at most `num_processes * N` tokens (the same count), which is split into `num_processes` shards of
about equal size, one per process. The global batches depend only on the lengths, the global budget and
the seed: one process with N tokens and two processes with N / 2 each train on the same global batches.
"""

from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Sampler


def pair_lengths(dataset, source_column: str = "input_ids", target_column: str = "labels"):
    """Token counts of every pair of a tokenised dataset, read from its Arrow columns (no Python lists).

    Args:
        dataset: a `datasets.Dataset` with list columns `source_column` and `target_column` (selected
            or shuffled datasets are read through their indices), or any sequence of dicts holding them.

    Returns:
        (source_lengths, target_lengths): two int64 arrays of shape (len(dataset),), in tokens.

    Raises:
        ValueError: a column is missing.
    """
    names = getattr(dataset, "column_names", None)
    if names is not None:
        missing = [name for name in (source_column, target_column) if name not in names]
        if missing:
            raise ValueError(f"token batches need the tokenised columns {missing}; the dataset has {names}")
        import pyarrow.compute as pc

        table = dataset.with_format("arrow")[:]  # an Arrow table in dataset order (indices applied)
        return tuple(pc.list_value_length(table.column(name)).to_numpy(zero_copy_only=False).astype(np.int64)
                     for name in (source_column, target_column))
    if len(dataset) and not all(name in dataset[0] for name in (source_column, target_column)):
        raise ValueError(f"token batches need the tokenised columns {[source_column, target_column]}")
    return tuple(np.fromiter((len(row[name]) for row in dataset), dtype=np.int64, count=len(dataset))
                 for name in (source_column, target_column))


def check_pairs_fit(source_lengths, target_lengths, max_tokens: int) -> None:
    """Raises ValueError, naming how many pairs and the longest, if a pair is longer than `max_tokens` on
    either side (fairseq raises too, unless told to skip such pairs): no batch could hold it."""
    cost = np.maximum(source_lengths, target_lengths)
    too_long = int((cost > max_tokens).sum())
    if too_long:
        longest = int(cost.max())
        raise ValueError(f"--max_tokens_per_batch {max_tokens}: {too_long} training pair(s) have more tokens on one "
                         f"side (the longest: {longest}, pair {int(cost.argmax())}), so no batch can hold them; give "
                         f"--max_tokens_per_batch >= {longest}, or truncate with --max_source_length/"
                         f"--max_target_length <= {max_tokens}")


def pack_token_batches(source_lengths, target_lengths, max_tokens: int, seed: int = 0) -> list[np.ndarray]:
    """Group pairs by length and pack them, in that order, into batches of at most `max_tokens` tokens.

    Pairs are ordered longest first by (max(s, t), t, s), ties in an order drawn from `seed` (fairseq
    shuffles the indices, then sorts them stably); then each batch takes the next pairs while
    n x max(longest source, longest target) <= max_tokens (fairseq's count: see the module docstring).
    The last batch, which holds what is left of the shortest pairs, is evened out with the one before it
    (their pairs split in two halves by length; both halves still fit, as neither holds more pairs than the
    one before did): an epoch never ends on a batch of a pair or two, which could not be split between
    processes.

    Args:
        source_lengths, target_lengths: int arrays of shape (P,), tokens per pair.
        max_tokens: the budget of one batch, in tokens of each side, padding included.
        seed: draws the order of equally long pairs.

    Returns:
        Batches of pair indices (int64 arrays), longest pairs first; every index 0..P-1 once.

    Raises:
        ValueError: a pair does not fit in `max_tokens` (`check_pairs_fit`), or `max_tokens` < 1.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    source_lengths, target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
    check_pairs_fit(source_lengths, target_lengths, max_tokens)
    cost = np.maximum(source_lengths, target_lengths)
    shuffled = np.random.default_rng(seed).permutation(len(cost))
    # np.lexsort sorts by the last key first; stable, so ties keep the seeded order; negated: longest first
    order = shuffled[np.lexsort((-source_lengths[shuffled], -target_lengths[shuffled], -cost[shuffled]))]
    batches, start, costs = [], 0, cost[order].tolist()
    for end in range(len(costs)):
        # descending cost: a batch's first pair is its longest
        if (end - start + 1) * costs[start] > max_tokens:
            batches.append(order[start:end])
            start = end
    batches.append(order[start:])
    if len(batches) > 1 and len(batches[-1]) < len(batches[-2]):
        pairs = np.concatenate(batches[-2:])
        half = (len(pairs) + 1) // 2  # <= the batch before's count, of pairs no longer than its longest
        batches[-2:] = [pairs[:half], pairs[half:]]
    return batches


def split_global_batch(batch: np.ndarray, cost: np.ndarray, parts: int) -> list[np.ndarray]:
    """One global batch's shards for `parts` processes, of the same number of pairs (+-1) and about the same
    padded size: the pairs are dealt out longest first (a shard takes every parts-th pair), and the
    n mod parts shortest pairs go one each to the shards whose longest pair is shortest. A batch of fewer than
    `parts` pairs is filled up by repeating its pairs (as torch's DistributedSampler repeats samples): every
    process needs a batch.

    Args:
        batch: (n,) pair indices; cost: (P,) max(source, target length) of every pair; parts: processes.

    Returns:
        `parts` non-empty index arrays; each shard's padded size is at most ceil(n / parts) x the batch's
        longest pair, which is at most max_tokens + that longest pair when the batch holds
        parts x max_tokens tokens.
    """
    if len(batch) < parts:
        batch = np.resize(batch, parts)  # repeats the pairs cyclically
    batch = batch[np.argsort(-cost[batch], kind="stable")]  # longest first
    dealt, rest = len(batch) - len(batch) % parts, len(batch) % parts
    shards = [batch[part:dealt:parts] for part in range(parts)]
    for k in range(rest):  # shard parts-1 holds the shortest longest pair
        shards[parts - 1 - k] = np.append(shards[parts - 1 - k], batch[dealt + k])
    return shards


class TokenBatchSampler(Sampler):
    """Batches of pair indices holding at most a token budget each, in shuffled order (seed, epoch).

    The batches themselves are computed once (`pack_token_batches`, ties drawn from `seed`), so every epoch
    has the same number of steps, as fairseq keeps its batches and reshuffles their order each epoch. The
    order is drawn from (seed, epoch) only, so a run resumed mid-epoch replays the interrupted epoch's batches
    exactly, and every process draws the same order. The heaviest global batch comes first, so that memory
    errors show at once: the one of the largest n x L^2 (n pairs of longest side L; the attention scores'
    size; all full batches hold about the same n x L). The last two global batches may be smaller than the
    others (`pack_token_batches` evens them out).

    For `num_processes` > 1 the sampler yields, for each global batch in turn, its `num_processes` shards
    (`split_global_batch`): accelerate's BatchSamplerShard gives shard k of every group to process k, so all
    processes see `len(self) // num_processes` batches and one step's shards make up one global batch.

    Args:
        source_lengths, target_lengths: int arrays of shape (P,), tokens of each pair (`pair_lengths`).
        max_tokens: tokens per process and batch (source and target each, padding included: n x max(s, t)).
        num_processes: processes sharing each global batch of num_processes x max_tokens tokens.
        seed: draws the ties of the length order and, with the epoch, the order of the batches.

    Raises:
        ValueError: max_tokens or num_processes < 1, or a pair longer than max_tokens (`check_pairs_fit`).
    """

    def __init__(self, source_lengths, target_lengths, max_tokens: int, num_processes: int = 1, seed: int = 0):
        if num_processes < 1:
            raise ValueError(f"num_processes must be >= 1, got {num_processes}")
        source_lengths, target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
        if len(source_lengths) != len(target_lengths) or len(source_lengths) == 0:
            raise ValueError(f"need as many source as target lengths, at least one: got {len(source_lengths)} "
                             f"and {len(target_lengths)}")
        check_pairs_fit(source_lengths, target_lengths, max_tokens)  # per process: a shard may hold one pair
        self.max_tokens, self.num_processes, self.seed, self.epoch = max_tokens, num_processes, seed, 0
        self.source_lengths, self.target_lengths = source_lengths, target_lengths
        self.global_batches = pack_token_batches(source_lengths, target_lengths, max_tokens * num_processes, seed)
        cost = np.maximum(source_lengths, target_lengths)
        self.shards = [split_global_batch(batch, cost, num_processes) for batch in self.global_batches]
        self.heaviest = int(np.argmax([len(batch) * int(cost[batch].max()) ** 2 for batch in self.global_batches]))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batch_order(self) -> list[int]:
        """This epoch's order of the global batches (indices into `global_batches`): the heaviest first, the
        others shuffled by (seed, epoch)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        others = [i for i in range(len(self.global_batches)) if i != self.heaviest]
        return [self.heaviest] + [others[i] for i in torch.randperm(len(others), generator=generator).tolist()]

    def __iter__(self):
        for index in self.batch_order():
            for shard in self.shards[index]:
                yield shard.tolist()

    def __len__(self) -> int:
        return len(self.global_batches) * self.num_processes


def padding_fraction(batches: Sequence[Sequence[int]], source_lengths, target_lengths) -> dict:
    """How much of the batches is padding, each batch padded to its longest source and its longest target.

    Returns:
        {"source": ..., "target": ..., "total": ...}: 1 - real tokens / padded tokens (source, target, both).
    """
    source_lengths, target_lengths = np.asarray(source_lengths), np.asarray(target_lengths)
    real = {"source": 0, "target": 0}
    padded = {"source": 0, "target": 0}
    for batch in batches:
        batch = np.asarray(batch)
        for side, lengths in (("source", source_lengths), ("target", target_lengths)):
            real[side] += int(lengths[batch].sum())
            padded[side] += int(lengths[batch].max()) * len(batch)
    fractions = {side: 1 - real[side] / padded[side] for side in real}
    fractions["total"] = 1 - sum(real.values()) / sum(padded.values())
    return fractions


def batch_tokens(batch: Sequence[int], source_lengths, target_lengths) -> int:
    """fairseq's size of one batch: n x max(longest source, longest target), in tokens."""
    batch = np.asarray(batch)
    return len(batch) * int(max(np.asarray(source_lengths)[batch].max(), np.asarray(target_lengths)[batch].max()))

