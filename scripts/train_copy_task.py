"""Copy task: the Transformer learns to reproduce its input sequence of random tokens.

The classic smoke test (the seed's `train_copy_task.py`, the annotated-transformer's first
example), done the Hugging Face way: a `datasets.Dataset` of random sequences, HF's `Trainer`
with the paper's Adam (beta2 0.98, eps 1e-9) and Noam schedule (paper 5.3; HF's "inverse_sqrt"
schedule peaking at `noam_peak_learning_rate`), a callback that prints greedy exact-match
accuracy as it trains, checkpoint averaging (paper 6.1, in memory), an evaluation with greedy
`model.generate()` on held-out sequences that are not in the training set, and `save_pretrained`.
About 75 seconds on two CPU cores; 200/200 held-out sequences copied exactly for seeds 0-9.

Example:
    python scripts/train_copy_task.py                      # defaults, writes outputs/copy_task
    python scripts/train_copy_task.py --seed 1 --max_steps 1500 --d_model 128 --d_ff 512 \\
        --output_dir outputs/copy_task_big
    python scripts/train_copy_task.py args.json            # the same options as a .json file

The saved folder reloads like any HF seq2seq model (ids 3.. are the symbols, 2 is EOS):
    import scratch_transformer, torch
    from transformers import AutoModelForSeq2SeqLM
    model = AutoModelForSeq2SeqLM.from_pretrained("outputs/copy_task")
    model.generate(input_ids=torch.tensor([[5, 9, 7, 3, 12, 2]]))  # -> [[1, 5, 9, 7, 3, 12, 2]]
"""

import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
from datasets import Dataset
from transformers import HfArgumentParser, PrinterCallback, Trainer, TrainerCallback, TrainingArguments, set_seed

from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer.modeling_scratch_transformer import shift_tokens_right
from scratch_transformer.training import count_parameters, noam_peak_learning_rate, write_json

PAD, BOS, EOS = 0, 1, 2  # special ids; the copied symbols are 3 .. 3 + num_symbols - 1
FIRST_SYMBOL = 3


@dataclass
class CopyTaskArguments:
    """What to copy, the model's size, and how accuracy is measured."""

    num_symbols: int = field(default=20, metadata={"help": "Distinct random symbols (the vocabulary adds 3 specials)."})
    min_length: int = field(default=5, metadata={"help": "Shortest sequence to copy (symbols, without EOS)."})
    max_length: int = field(default=10, metadata={"help": "Longest sequence to copy (symbols, without EOS)."})
    train_size: int = field(default=50_000, metadata={"help": "Random training sequences (drawn once, seeded)."})
    eval_size: int = field(
        default=200, metadata={"help": "Held-out sequences, none in the training set, for the final evaluation."}
    )
    monitor_size: int = field(
        default=100, metadata={"help": "Other held-out sequences, for the accuracy printed while training."}
    )
    d_model: int = field(default=64, metadata={"help": "Model width d_model (paper 3.1)."})
    num_heads: int = field(default=4, metadata={"help": "Attention heads h (paper 3.2.2)."})
    layers: int = field(default=2, metadata={"help": "Encoder layers, and as many decoder layers (paper 3.1)."})
    d_ff: int = field(default=256, metadata={"help": "Feed-forward inner width (paper 3.3)."})
    dropout: float = field(default=0.1, metadata={"help": "Residual/embedding dropout (paper 5.4: 0.1)."})
    torch_threads: int = field(
        default=1,
        metadata={"help": "CPU threads for torch (0: torch's default). A model this small is fastest on one; "
                          "more threads mostly add synchronisation, and thrash on a busy machine."},
    )
    average_last: int = field(
        default=5,
        metadata={"help": "Average the weights of the last N snapshots, one every `average_every` steps "
                          "(paper 6.1 averages the last 5 checkpoints); 1 keeps the final weights."},
    )
    average_every: int = field(default=50, metadata={"help": "Steps between two snapshots that are averaged."})
    noam_factor: float = field(
        default=0.5,
        metadata={"help": "Scale of the Noam schedule: peak lr = factor * d_model^-0.5 * warmup^-0.5 (paper 5.3)."},
    )

    def __post_init__(self):
        if not 1 <= self.min_length <= self.max_length:
            raise ValueError(f"need 1 <= min_length <= max_length, got {self.min_length} and {self.max_length}")
        for name in ("num_symbols", "train_size", "eval_size", "monitor_size", "layers", "average_last",
                     "average_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.torch_threads < 0:
            raise ValueError(f"torch_threads must be >= 0, got {self.torch_threads}")


@dataclass
class CopyTrainingArguments(TrainingArguments):
    """HF's TrainingArguments with this demo's defaults: the paper's Adam and Noam schedule, a short CPU run."""

    output_dir: str = field(default="outputs/copy_task", metadata={"help": "Where the final model is saved."})
    max_steps: int = field(default=1000, metadata={"help": "Optimizer steps to train for."})
    per_device_train_batch_size: int = field(default=128, metadata={"help": "Sequences per step."})
    learning_rate: float | None = field(
        default=None,
        metadata={"help": "Peak learning rate; default: the Noam peak from d_model, warmup_steps and noam_factor."},
    )
    lr_scheduler_type: str = field(
        default="inverse_sqrt", metadata={"help": "inverse_sqrt + warmup_steps = the paper's schedule (5.3)."}
    )
    warmup_steps: float = field(default=200, metadata={"help": "Linear warmup steps of the Noam schedule."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2 (paper 5.3)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam epsilon (paper 5.3)."})
    weight_decay: float = field(default=0.0, metadata={"help": "Weight decay (none in the paper)."})
    logging_steps: float = field(default=100, metadata={"help": "Print loss and held-out accuracy every N steps."})
    logging_first_step: bool = field(default=True, metadata={"help": "Also print at step 1."})
    save_strategy: str = field(default="no", metadata={"help": "No intermediate checkpoints; the end is saved."})
    dataloader_pin_memory: bool = field(default=False, metadata={"help": "Pinned memory (helps only a GPU)."})
    disable_tqdm: bool | None = field(default=True, metadata={"help": "No progress bar (the callback prints)."})
    seed: int = field(default=0, metadata={"help": "Seed of the data, the initial weights and the shuffling."})


def random_sequences(count: int, args: CopyTaskArguments, rng: random.Random, exclude=frozenset()) -> list[list[int]]:
    """`count` distinct random symbol sequences, none in `exclude`, lengths uniform in [min_length, max_length]."""
    found, seen = [], set(exclude)
    while len(found) < count:
        length = rng.randint(args.min_length, args.max_length)
        sequence = tuple(rng.randrange(FIRST_SYMBOL, FIRST_SYMBOL + args.num_symbols) for _ in range(length))
        if sequence not in seen:
            seen.add(sequence)
            found.append(list(sequence))
    return found


def collate(features: list[dict]) -> dict[str, torch.Tensor]:
    """Pads a batch: input_ids with PAD (+ attention_mask), labels with -100, and adds decoder_input_ids
    (labels shifted right behind the start token; Trainer's label smoothing calls the model without labels)."""
    batch = {}
    for key, fill in (("input_ids", PAD), ("labels", -100)):
        rows = [feature[key] for feature in features]
        padded = torch.full((len(rows), max(map(len, rows))), fill, dtype=torch.long)
        for i, row in enumerate(rows):
            padded[i, : len(row)] = torch.tensor(row)
        batch[key] = padded
    batch["attention_mask"] = (batch["input_ids"] != PAD).long()
    batch["decoder_input_ids"] = shift_tokens_right(batch["labels"], PAD, BOS)
    return batch


@torch.no_grad()
def greedy_copies(model, sources: list[list[int]], batch_size: int = 256) -> list[list[int]]:
    """What the model writes for each source (symbols before its first EOS), by greedy `model.generate()`."""
    was_training = model.training
    model.eval()
    outputs = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start : start + batch_size]
        batch = collate([{"input_ids": s + [EOS], "labels": s + [EOS]} for s in chunk])
        generated = model.generate(
            input_ids=batch["input_ids"].to(model.device),
            attention_mask=batch["attention_mask"].to(model.device),  # not inferred for encoder-decoders
            max_new_tokens=batch["input_ids"].size(1) + 1,
            do_sample=False,
            num_beams=1,
        )  # (b, 1 + new): decoder start token, then the copy, EOS, PAD...
        for row in generated[:, 1:].tolist():
            outputs.append(row[: row.index(EOS)] if EOS in row else row)
    model.train(was_training)
    return outputs


def exact_match(predictions: list[list[int]], sources: list[list[int]]) -> int:
    """Number of predictions identical to their source."""
    return sum(p == s for p, s in zip(predictions, sources))


class CopyAccuracyCallback(TrainerCallback):
    """At every logging step, prints the training loss and greedy exact-match accuracy on held-out sequences."""

    def __init__(self, sources: list[list[int]]):
        self.sources = sources
        self.history = []

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        accuracy = exact_match(greedy_copies(model, self.sources), self.sources) / len(self.sources)
        self.history.append({"step": state.global_step, "loss": logs["loss"], "exact_match": accuracy})
        print(f"step {state.global_step:5d} | loss {logs['loss']:.4f} | acc {100 * accuracy:5.1f}%", flush=True)


class WeightAveragingCallback(TrainerCallback):
    """Keeps the weights of the last `count` snapshots, one every `every` steps, and loads their mean into the
    model when training ends: the paper's checkpoint averaging (6.1), in memory. It evens out the last steps'
    jitter, which otherwise leaves the odd held-out sequence miscopied."""

    def __init__(self, count: int, every: int):
        self.count, self.every = count, every
        self.snapshots: list[tuple[int, dict[str, torch.Tensor]]] = []

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            weights = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
            self.snapshots = [*self.snapshots, (state.global_step, weights)][-self.count :]

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if len(self.snapshots) < 2:
            return
        averaged = {
            name: torch.stack([weights[name] for _, weights in self.snapshots]).mean(dim=0)
            for name in self.snapshots[0][1]
        }
        model.load_state_dict(averaged)
        steps = ", ".join(str(step) for step, _ in self.snapshots)
        print(f"averaged the weights of steps {steps} (paper 6.1)", flush=True)


def main(argv: list[str] | None = None) -> dict:
    """Trains, evaluates and saves; returns the metrics (and the evaluation's sources and predictions)."""
    parser = HfArgumentParser((CopyTaskArguments, CopyTrainingArguments))
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) == 1 and argv[0].endswith(".json"):
        task_args, training_args = parser.parse_json_file(os.path.abspath(argv[0]))
    else:
        task_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    if training_args.learning_rate is None:
        warmup = training_args.get_warmup_steps(training_args.max_steps)  # warmup_steps < 1 is a ratio
        training_args.learning_rate = noam_peak_learning_rate(task_args.d_model, warmup, task_args.noam_factor)
    if task_args.torch_threads:
        torch.set_num_threads(task_args.torch_threads)
    start = time.perf_counter()

    # Data: training sequences, then held-out ones that are not among them. Target = source + EOS.
    rng = random.Random(training_args.seed)
    train_sources = random_sequences(task_args.train_size, task_args, rng)
    held_out = random_sequences(
        task_args.monitor_size + task_args.eval_size, task_args, rng, exclude={tuple(s) for s in train_sources}
    )
    monitor_sources, eval_sources = held_out[: task_args.monitor_size], held_out[task_args.monitor_size :]
    train_dataset = Dataset.from_dict(
        {"input_ids": [s + [EOS] for s in train_sources], "labels": [s + [EOS] for s in train_sources]}
    )

    # Model: a small Transformer with the paper's architecture.
    set_seed(training_args.seed)
    config = ScratchTransformerConfig(
        vocab_size=FIRST_SYMBOL + task_args.num_symbols,
        d_model=task_args.d_model,
        num_heads=task_args.num_heads,
        encoder_layers=task_args.layers,
        decoder_layers=task_args.layers,
        d_ff=task_args.d_ff,
        dropout=task_args.dropout,
        max_position_embeddings=task_args.max_length + 2,
        pad_token_id=PAD,
        bos_token_id=BOS,
        eos_token_id=EOS,
        decoder_start_token_id=BOS,
    )
    model = ScratchTransformerForConditionalGeneration(config)
    model.generation_config.max_new_tokens = task_args.max_length + 1
    print(
        f"copy task: {len(train_sources)} training sequences of {task_args.min_length}-{task_args.max_length} "
        f"symbols out of {task_args.num_symbols}; model of {count_parameters(model):,} parameters "
        f"(d_model {config.d_model}, {config.num_heads} heads, {config.encoder_layers}+{config.decoder_layers} "
        f"layers); {training_args.max_steps} steps of {training_args.per_device_train_batch_size}, "
        f"Noam peak lr {training_args.learning_rate:.2e} at step {training_args.warmup_steps:g}",
        flush=True,
    )

    # Training: HF's Trainer, printing loss and held-out accuracy as it goes.
    accuracy_callback = CopyAccuracyCallback(monitor_sources)
    trainer = Trainer(
        model=model,
        args=training_args,
        train_dataset=train_dataset,
        data_collator=collate,
        callbacks=[accuracy_callback, WeightAveragingCallback(task_args.average_last, task_args.average_every)],
    )
    trainer.remove_callback(PrinterCallback)  # the accuracy callback prints instead of raw log dicts
    train_output = trainer.train()

    # Evaluation: greedy generate() on held-out sequences never seen in training.
    predictions = greedy_copies(model, eval_sources)
    correct = exact_match(predictions, eval_sources)
    print(
        f"EVALUATION: {correct}/{len(eval_sources)} ({100 * correct / len(eval_sources):.1f}%) exact-match "
        f"copy accuracy on held-out random sequences",
        flush=True,
    )
    for source, prediction in list(zip(eval_sources, predictions))[:3]:
        print(f"  {' '.join(map(str, source)):<30} -> {' '.join(map(str, prediction))}")

    model.save_pretrained(training_args.output_dir)  # config, weights, generation config and the model code
    metrics = {
        "eval_exact_match": correct / len(eval_sources),
        "eval_correct": correct,
        "eval_total": len(eval_sources),
        "train_loss": train_output.training_loss,
        "steps": trainer.state.global_step,
        "seconds": round(time.perf_counter() - start, 1),
        "history": accuracy_callback.history,
        "arguments": {
            **asdict(task_args),
            **{name: getattr(training_args, name) for name in ("max_steps", "per_device_train_batch_size",
                                                               "learning_rate", "warmup_steps", "seed")},
        },
    }
    write_json(os.path.join(training_args.output_dir, "copy_task_results.json"), metrics)
    print(f"model saved to {training_args.output_dir} ({metrics['seconds']:.0f} s)")
    return {**metrics, "eval_sources": eval_sources, "predictions": predictions}


if __name__ == "__main__":
    main()
