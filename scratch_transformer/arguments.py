"""The main job's arguments: three dataclasses parsed by HfArgumentParser (flags or one .json file), named
and checked as in transformers' run_translation.py, with the paper's training choices as defaults.

Every check runs in __post_init__, before any data is read or any folder is made; a bad value raises
ValueError naming the argument.
"""

import logging
import math
import os
from dataclasses import dataclass, field

import torch
from transformers import Seq2SeqTrainingArguments

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    """Which model to train: a checkpoint to fine-tune, or a new one built from a config."""

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Fine-tune this checkpoint (local folder or Hub id); its tokenizer is used. "
                          "Leave empty to build a new model and train a new tokenizer."},
    )
    config_name: str | None = field(
        default=None, metadata={"help": "A config.json (or folder) for a new model; default: the paper's base. "
                                        "Another architecture's config (e.g. a MarianConfig's folder) trains "
                                        "that model through the same pipeline."}
    )
    config_overrides: str | None = field(
        default=None,
        metadata={"help": "Comma-separated config overrides for a new model, e.g. "
                          "'d_model=256,num_heads=4,encoder_layers=3,decoder_layers=3,d_ff=1024'."},
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Use this tokenizer (folder or Hub id) instead of training one."}
    )
    vocab_size: int = field(default=8000, metadata={"help": "Size of the joint BPE vocabulary to train."})
    tokenizer_min_frequency: int = field(default=2, metadata={"help": "BPE: merge pairs seen at least this often."})
    tokenizer_max_sentences: int | None = field(
        default=None,
        metadata={"help": "Train the new tokenizer on at most this many sentences of each language: the two sides "
                          "of as many training pairs drawn at random (by --data_seed, else --seed), as "
                          "sentencepiece's input_sentence_size. Default: every training pair."},
    )
    attn_implementation: str = field(default="sdpa", metadata={"help": "'sdpa' (fused kernel) or 'eager' (math)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from a Hub checkpoint."})
    average_last_checkpoints: int = field(
        default=5,
        metadata={"help": "Average the weights of the last N checkpoints (paper 6.1) and keep the average if its "
                          "validation BLEU is at least the last checkpoint's. 0 or 1: off."},
    )
    ema_decay: float = field(
        default=0.0,
        metadata={"help": "Keep an exponential moving average of the weights with this per-step decay (e.g. 0.999; "
                          "saved in every checkpoint) and keep it at the end if its validation BLEU is the highest "
                          "of the last checkpoint, the average and it. 0: off."},
    )
    long_run_dropout: float = field(
        default=0.0,
        metadata={"help": "Dropout (config dropout: embeddings and sublayers) for a long run: used instead of the "
                          "config's when the run is planned, or projected from the first tenth of its "
                          "--max_train_minutes budget, to make at least --long_run_min_epochs passes over the "
                          "training data. 0: off (the config's dropout throughout)."},
    )
    long_run_min_epochs: float = field(
        default=14.0, metadata={"help": "Long-run dropout: the passes over the training data from which a run "
                                        "counts as long."}
    )
    card_template: str | None = field(default=None, metadata={"help": "Model card template (default hub_card.md)."})

    def __post_init__(self):
        for name in ("vocab_size", "tokenizer_min_frequency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.tokenizer_max_sentences is not None and self.tokenizer_max_sentences < 1:
            raise ValueError(f"tokenizer_max_sentences must be >= 1 (leave it out to train on every pair), got "
                             f"{self.tokenizer_max_sentences}")
        if self.average_last_checkpoints < 0:
            raise ValueError(f"average_last_checkpoints must be >= 0 (0 or 1: off), got "
                             f"{self.average_last_checkpoints}")
        if not 0 <= self.ema_decay < 1:
            raise ValueError(f"ema_decay must be in [0, 1) (0: off; e.g. 0.999), got {self.ema_decay}")
        if not 0 <= self.long_run_dropout < 1:
            raise ValueError(f"long_run_dropout must be in [0, 1) (0: off; e.g. 0.2), got {self.long_run_dropout}")
        if not 0 < self.long_run_min_epochs < math.inf:
            raise ValueError(f"long_run_min_epochs must be positive and finite, got {self.long_run_min_epochs}")
        if self.attn_implementation not in ("sdpa", "eager"):
            raise ValueError(f"attn_implementation must be 'sdpa' or 'eager', got {self.attn_implementation!r}")


@dataclass
class DataTrainingArguments:
    """Where the parallel text is and how to cut it (names follow transformers' run_translation.py)."""

    source_lang: str = field(default="de", metadata={"help": "Source language code (a column or file suffix)."})
    target_lang: str = field(default="en", metadata={"help": "Target language code."})
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "A Hub dataset id, or a local folder of line-aligned files {split}.{lang}[.gz]."},
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset config, e.g. 'de-en'."})
    train_file: str | None = field(default=None, metadata={"help": "A .jsonl/.json/.csv training file."})
    validation_file: str | None = field(default=None, metadata={"help": "A .jsonl/.json/.csv validation file."})
    test_file: str | None = field(default=None, metadata={"help": "A .jsonl/.json/.csv test file."})
    train_split: str = field(default="train", metadata={"help": "Split name used for training."})
    validation_split: str = field(default="validation", metadata={"help": "Split name for validation (Multi30k: val)."})
    test_split: str = field(
        default="test", metadata={"help": "Split name(s) for the final test, comma-separated; the first is the "
                                          "headline (test_bleu). Multi30k: test_2016_flickr,test_2017_flickr,"
                                          "test_2017_mscoco."})
    max_source_length: int = field(default=128, metadata={"help": "Truncate source sentences to this many tokens."})
    max_target_length: int = field(default=128, metadata={"help": "Truncate targets; also the generation limit."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Use only the first N training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use only the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Use only the first N test pairs."})
    num_beams: int | None = field(
        default=None, metadata={"help": "Beam size for the final test and the saved generation config (default: "
                                        "the fine-tuned model's generation config, else 4)."})
    length_penalty: float | None = field(
        default=None, metadata={"help": "Beam-search length penalty, an exponent on the length (default: the "
                                        "fine-tuned model's generation config, else 1.0)."})
    no_repeat_ngram_size: int | None = field(
        default=None, metadata={"help": "Final test and saved generation config: never repeat an n-gram of this size "
                                        "within a translation, 0 = off (default: the fine-tuned model's generation "
                                        "config, else 0)."})
    early_stopping: bool | None = field(
        default=None, metadata={"help": "Final test and saved generation config: end a beam search once num_beams "
                                        "translations are finished (the paper's 'terminate early when possible', "
                                        "6.1; the search CTranslate2 runs), not while a running beam could still "
                                        "win (default: the fine-tuned model's generation config, else False, "
                                        "generate()'s default)."})
    renormalize_logits: bool | None = field(
        default=None, metadata={"help": "Final test and saved generation config: renormalise the log-probabilities "
                                        "after blocked tokens (no_repeat_ngram_size) are removed, as CTranslate2 "
                                        "does (default: the fine-tuned model's generation config, else False)."})
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})

    def __post_init__(self):
        if self.dataset_name == "":  # `--dataset_name ""` unsets a config file's, for --train_file and the others
            self.dataset_name = None
        sources = [self.dataset_name is not None, any([self.train_file, self.validation_file, self.test_file])]
        if sum(sources) != 1:
            raise ValueError("give either --dataset_name (Hub id or folder) or --train_file/--validation_file/"
                             "--test_file, not both and not neither (--dataset_name \"\" unsets a config "
                             "file's)")
        if self.no_repeat_ngram_size is not None and self.no_repeat_ngram_size < 0:
            raise ValueError(f"no_repeat_ngram_size must be >= 0 (0 = off), got {self.no_repeat_ngram_size}")
        if self.source_lang == self.target_lang:
            raise ValueError(f"source_lang and target_lang are both {self.source_lang!r}")
        if self.num_beams is not None and self.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {self.num_beams}")
        if self.length_penalty is not None and not math.isfinite(self.length_penalty):
            raise ValueError(f"length_penalty must be a finite number, got {self.length_penalty}")
        if not self.test_splits:
            raise ValueError(f"test_split {self.test_split!r} names no split")
        if self.test_file and len(self.test_splits) > 1:
            raise ValueError(f"--test_file is one file: give one --test_split, not {self.test_split!r}")
        for name in ("max_source_length", "max_target_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 token, got {getattr(self, name)}")
        if self.max_target_length < 2:  # generate() starts from the decoder start token: room for one more
            raise ValueError(f"max_target_length must be >= 2 tokens (the decoder start token and at least one "
                             f"generated token; validation and the test would fail after training), got "
                             f"{self.max_target_length}")
        for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (leave it out to use the whole split), got "
                                 f"{getattr(self, name)}")


    @property
    def test_splits(self) -> list[str]:
        """The test splits of --test_split, in order (the first is the headline)."""
        return [split.strip() for split in self.test_split.split(",") if split.strip()]


PAPER_WARMUP_STEPS = 4000  # paper 5.3
BUDGET_WARMUP_FRACTION = 0.33  # of the training-time budget (configs/multi30k_de_en.json)


@dataclass
class TranslationTrainingArguments(Seq2SeqTrainingArguments):
    """Seq2SeqTrainingArguments with the paper's training choices as defaults (paper 5.3, 5.4)."""

    do_train: bool = field(default=True, metadata={"help": "Train (default true)."})
    do_eval: bool = field(default=True, metadata={"help": "Evaluate on the validation split (default true)."})
    do_predict: bool = field(default=True, metadata={"help": "Translate and score the test split (default true)."})
    adam_beta2: float = field(default=0.98, metadata={"help": "Adam beta2 (paper 5.3: 0.98)."})
    adam_epsilon: float = field(default=1e-9, metadata={"help": "Adam epsilon (paper 5.3: 1e-9)."})
    weight_decay: float = field(default=0.0, metadata={"help": "0 = the paper's plain Adam."})
    lr_scheduler_type: str = field(
        default="inverse_sqrt", metadata={"help": "inverse_sqrt = the paper's Noam schedule (paper 5.3)."}
    )
    warmup_steps: float | None = field(default=None, metadata={
        "help": "Warm-up: steps (paper: 4000, the default), or with --max_train_minutes a fraction of the "
                "training-time budget in [0, 1) (default there: 0.33, as configs/multi30k_de_en.json)."})
    learning_rate: float = field(default=7e-4, metadata={"help": "Peak learning rate, reached after warmup."})
    noam_factor: float | None = field(
        default=None,
        metadata={"help": "If set, learning_rate = noam_factor * d_model^-0.5 * warmup_steps^-0.5 (paper eq. 3)."},
    )
    label_smoothing_factor: float = field(default=0.1, metadata={"help": "Label smoothing (paper 5.4: 0.1)."})
    predict_with_generate: bool = field(default=True, metadata={"help": "Evaluate BLEU on generated text."})
    max_tokens_per_batch: int | None = field(
        default=None,
        metadata={"help": "Token batches (paper 5.1, fairseq's --max-tokens): group the training pairs by length and "
                          "fill each batch, per process, up to this many tokens on each side, padding included "
                          "(n pairs x the longest source or target); replaces per_device_train_batch_size for "
                          "training. One step of W processes takes a global batch of up to W x N tokens, the same "
                          "for any W at the same W x N. Pairs longer than N are refused: truncate them with "
                          "--max_source_length/--max_target_length."},
    )
    max_train_minutes: float | None = field(
        default=None, metadata={"help": "Stop training after this many minutes of training (evaluation excluded)."}
    )
    schedule_on_budget: bool = field(
        default=True,
        metadata={"help": "With max_train_minutes: lay the learning-rate schedule (warm-up, decay) on the "
                          "training-time budget instead of on steps, so that the decay ends when the budget does "
                          "on any machine; warmup_steps is then a fraction of the budget, in [0, 1)."},
    )
    precision: str = field(
        default="auto",
        metadata={"help": "auto (bf16 autocast where the hardware computes bf16 natively, else fp32), bf16, fp16 "
                          "or fp32. --bf16 true / --fp16 true also choose."},
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Let an evaluation-only run (--do_train false) write its results into a folder that "
                          "already holds files, such as the evaluated model's own folder (its weights are never "
                          "touched). Without it such a run is refused."},
    )

    def __post_init__(self):
        # checked here, before anything is built or written (HF finds a bad learning rate only when it
        # creates the optimizer, after the output folder exists); `not value > 0` also refuses NaN
        for name in ("learning_rate", "max_train_minutes", "noam_factor"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value}")
        if self.warmup_steps is None:  # a default that fits the schedule: never the reason a valid flag is refused
            on_budget = self.max_train_minutes and self.schedule_on_budget
            self.warmup_steps = BUDGET_WARMUP_FRACTION if on_budget else PAPER_WARMUP_STEPS
        if not (self.warmup_steps >= 0 and math.isfinite(self.warmup_steps)):
            raise ValueError(f"warmup_steps must be a finite number >= 0, got {self.warmup_steps}")
        if self.dataloader_num_workers < 0:
            raise ValueError(f"dataloader_num_workers must be >= 0, got {self.dataloader_num_workers}")
        if self.do_train and self.max_steps <= 0 and not self.num_train_epochs > 0:
            raise ValueError(f"num_train_epochs must be > 0 when max_steps is not set, got {self.num_train_epochs}")
        from transformers import SchedulerType

        try:
            SchedulerType(getattr(self.lr_scheduler_type, "value", self.lr_scheduler_type))
        except ValueError:
            names = ", ".join(kind.value for kind in SchedulerType)
            raise ValueError(f"lr_scheduler_type {self.lr_scheduler_type!r} is not one of: {names}") from None
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.label_smoothing_factor < 1:
            raise ValueError(f"label_smoothing_factor must be in [0, 1), got {self.label_smoothing_factor}")
        if self.restore_callback_states_from_checkpoint:
            raise ValueError("restore_callback_states_from_checkpoint: the job's callbacks (training-time budget, "
                             "long-run dropout) take their state from the checkpoint themselves on resume; HF's "
                             "restore would replace them by copies the learning-rate schedule does not see. Leave "
                             "it false")
        if self.max_train_minutes and self.schedule_on_budget and not 0 <= self.warmup_steps < 1:
            raise ValueError(f"warmup_steps {self.warmup_steps:g}: with max_train_minutes the schedule runs on the "
                             "training-time budget, so give warm-up as a fraction of it in [0, 1) (e.g. 0.3), or "
                             "pass --schedule_on_budget false to keep a schedule in steps")
        # torchrun / `accelerate launch --multi_gpu` start WORLD_SIZE processes. Without a GPU, accelerate only
        # joins them into one (gloo) group when told to use the CPU; otherwise each process would train alone on
        # all the data and overwrite the others' files. So a multi-process launch without a GPU means the CPU.
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > 1 and not self.use_cpu and not _has_accelerator():
            self.use_cpu = True
        self._resolve_precision()
        self._check_token_batches()
        self._check_step_counts()
        super().__post_init__()
        if self.max_tokens_per_batch is not None:
            config = self.accelerator_config
            for name in ("split_batches", "dispatch_batches"):
                if getattr(config, name, None):
                    raise ValueError(f"--max_tokens_per_batch gives each process its own batch: accelerator_config "
                                     f"{name} (one batch cut or sent across processes) cannot be used with it")
        if launched > 1 and self.world_size != launched:
            raise ValueError(f"launched as {launched} processes (WORLD_SIZE) but the Trainer sees a world of "
                             f"{self.world_size}: check the launcher's and the script's device settings")
        if self.world_size == 1 and os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" \
                and "MASTER_ADDR" in os.environ:  # what `accelerate launch --cpu --num_processes N>1` leaves
            logger.warning("`accelerate launch --cpu` started a single process: for several CPU processes use "
                           "--config_file configs/accelerate_cpu_2proc.yaml (or --multi_gpu) instead of --cpu")


    def _check_step_counts(self) -> None:
        """--max_steps 0 (HF would still train one step), a --save_steps / --eval_steps / --logging_steps of 0 or
        less where their strategy is "steps" (no checkpoint to resume from), and a --generation_max_length
        below 2, refused by name before anything is built."""
        if self.max_steps == 0 or self.max_steps < -1:
            raise ValueError(f"max_steps must be >= 1 (or -1, the default: train --num_train_epochs), got "
                             f"{self.max_steps}")
        for name, strategy in (("save_steps", self.save_strategy), ("eval_steps", self.eval_strategy),
                               ("logging_steps", self.logging_strategy)):
            value = getattr(self, name)
            if getattr(strategy, "value", strategy) == "steps" and value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0 with {name.split('_')[0]}_strategy 'steps' (a number of steps, "
                                 f"or a fraction of the run below 1), got {value}")
        if self.generation_max_length is not None and self.generation_max_length < 2:
            raise ValueError(f"generation_max_length must be >= 2 tokens (the decoder start token and at least one "
                             f"generated token), got {self.generation_max_length}")

    def _check_token_batches(self) -> None:
        """--max_tokens_per_batch: a whole number >= 1, and none of the options it replaces or cannot honour."""
        tokens = self.max_tokens_per_batch
        if tokens is None:
            return
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ValueError(f"max_tokens_per_batch must be a whole number of tokens >= 1, got {tokens!r}")
        strategy = getattr(self.train_sampling_strategy, "value", self.train_sampling_strategy)
        if strategy not in ("random", "group_by_length"):
            raise ValueError(f"--max_tokens_per_batch makes its own length-grouped, shuffled batches: "
                             f"train_sampling_strategy {strategy!r} cannot be used with it (leave the default or "
                             "group_by_length)")
        refused = {"auto_find_batch_size": "it shrinks per_device_train_batch_size, which token batches do not use",
                   "dataloader_drop_last": "token batches keep every pair (an epoch's last two batches are evened out)"}
        for name, reason in refused.items():
            if getattr(self, name):
                raise ValueError(f"--max_tokens_per_batch and --{name} cannot be used together: {reason}")
        if not self.average_tokens_across_devices:
            raise ValueError("--max_tokens_per_batch needs average_tokens_across_devices true: processes' batches "
                             "hold different numbers of target tokens, and the loss must be divided by the "
                             "labelled tokens of all of them")

    def _resolve_precision(self) -> None:
        """Sets bf16/fp16 from --precision (auto: by the hardware) or takes them from --bf16/--fp16; afterwards
        `precision` is what training uses and `precision_reason` says why."""
        if self.precision not in ("auto", "bf16", "fp16", "fp32"):
            raise ValueError(f"precision must be auto, bf16, fp16 or fp32, got {self.precision!r}")
        flagged = [name for name in ("bf16", "fp16") if getattr(self, name)]
        if len(flagged) > 1 or (flagged and self.precision not in ("auto", flagged[0])):
            raise ValueError(f"--precision {self.precision} and --{' --'.join(flagged)} true disagree; give one")
        if flagged:
            self.precision, self.precision_reason = flagged[0], f"--{flagged[0]} true"
        elif self.precision != "auto":
            self.precision_reason = f"--precision {self.precision}"
        else:
            from .training import choose_precision

            self.precision, self.precision_reason = choose_precision(self.use_cpu or not _has_accelerator())
        self.bf16, self.fp16 = self.precision == "bf16", self.precision == "fp16"
        if self.bf16 and not _has_accelerator():
            self.use_cpu = True  # CPU bf16 autocast: HF asks for use_cpu where no accelerator is there anyway


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()
