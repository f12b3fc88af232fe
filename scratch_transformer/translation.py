"""The main job: train, evaluate and document a translation model with HF's Seq2SeqTrainer.

`scripts/train_translation.py` parses the three argument dataclasses below with HfArgumentParser
(flags or one .json file, as transformers' run_translation.py) and calls `run_translation`.
"""

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import dataclass, field

import torch
import transformers
from torch.utils.data import SequentialSampler
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    set_seed,
)
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices

from .configuration_scratch_transformer import ScratchTransformerConfig
from .data import load_translation_dataset
from .metrics import corpus_scores, decode_ids, make_compute_metrics
from .modeling_scratch_transformer import ScratchTransformerForConditionalGeneration
from .tokenization import tokenizer_special_ids, train_tokenizer
from .training import (
    WallClockBudgetCallback,
    average_checkpoints,
    count_parameters,
    is_complete_safetensors,
    last_complete_checkpoint,
    noam_peak_learning_rate,
    plot_training_curve,
    sorted_checkpoints,
    write_json,
)

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
        default=None, metadata={"help": "A config.json (or folder) for a new model; default: the paper's base."}
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
    attn_implementation: str = field(default="sdpa", metadata={"help": "'sdpa' (fused kernel) or 'eager' (math)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow code from a Hub checkpoint."})
    average_last_checkpoints: int = field(
        default=5,
        metadata={"help": "Average the weights of the last N checkpoints (paper 6.1) and keep the average if its "
                          "validation BLEU is at least the last checkpoint's. 0 or 1: off."},
    )
    card_template: str | None = field(default=None, metadata={"help": "Model card template (default hub_card.md)."})


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
    test_split: str = field(default="test", metadata={"help": "Split name for the final test (Multi30k: test_2016_flickr)."})
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
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})

    def __post_init__(self):
        sources = [self.dataset_name is not None, any([self.train_file, self.validation_file, self.test_file])]
        if sum(sources) != 1:
            raise ValueError("give either --dataset_name (Hub id or folder) or --train_file/--validation_file/"
                             "--test_file, not both and not neither")
        if self.no_repeat_ngram_size is not None and self.no_repeat_ngram_size < 0:
            raise ValueError(f"no_repeat_ngram_size must be >= 0 (0 = off), got {self.no_repeat_ngram_size}")
        if self.source_lang == self.target_lang:
            raise ValueError(f"source_lang and target_lang are both {self.source_lang!r}")
        if self.num_beams is not None and self.num_beams < 1:
            raise ValueError(f"num_beams must be >= 1, got {self.num_beams}")
        for name in ("max_source_length", "max_target_length"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 token, got {getattr(self, name)}")
        for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (leave it out to use the whole split), got "
                                 f"{getattr(self, name)}")


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
    warmup_steps: float = field(default=4000, metadata={"help": "Noam warmup steps (paper: 4000)."})
    learning_rate: float = field(default=7e-4, metadata={"help": "Peak learning rate, reached after warmup."})
    noam_factor: float | None = field(
        default=None,
        metadata={"help": "If set, learning_rate = noam_factor * d_model^-0.5 * warmup_steps^-0.5 (paper eq. 3)."},
    )
    label_smoothing_factor: float = field(default=0.1, metadata={"help": "Label smoothing (paper 5.4: 0.1)."})
    predict_with_generate: bool = field(default=True, metadata={"help": "Evaluate BLEU on generated text."})
    max_train_minutes: float | None = field(
        default=None, metadata={"help": "Stop training after this many minutes of training (evaluation excluded)."}
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
        for name in ("learning_rate", "max_train_minutes"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0, got {value}")
        if not self.warmup_steps >= 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 <= self.label_smoothing_factor < 1:
            raise ValueError(f"label_smoothing_factor must be in [0, 1), got {self.label_smoothing_factor}")
        # torchrun / `accelerate launch --multi_gpu` start WORLD_SIZE processes. Without a GPU, accelerate only
        # joins them into one (gloo) group when told to use the CPU; otherwise each process would train alone on
        # all the data and overwrite the others' files. So a multi-process launch without a GPU means the CPU.
        launched = int(os.environ.get("WORLD_SIZE", "1"))
        if launched > 1 and not self.use_cpu and not _has_accelerator():
            self.use_cpu = True
        super().__post_init__()
        if launched > 1 and self.world_size != launched:
            raise ValueError(f"launched as {launched} processes (WORLD_SIZE) but the Trainer sees a world of "
                             f"{self.world_size}: check the launcher's and the script's device settings")
        if self.world_size == 1 and os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" \
                and "MASTER_ADDR" in os.environ:  # what `accelerate launch --cpu --num_processes N>1` leaves
            logger.warning("`accelerate launch --cpu` started a single process: for several CPU processes use "
                           "--config_file configs/accelerate_cpu_2proc.yaml (or --multi_gpu) instead of --cpu")


def _has_accelerator() -> bool:
    accelerator = getattr(torch, "accelerator", None)  # torch >= 2.6
    return accelerator.is_available() if accelerator is not None else torch.cuda.is_available()


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
    """

    def __init__(self, batch_size, dataset, lengths, seed):
        super().__init__(batch_size, dataset=dataset, lengths=lengths)
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch):  # called by the Trainer (through accelerate's DataLoaderShard) every epoch
        self.epoch = epoch

    def __iter__(self):
        self.generator = torch.Generator().manual_seed(self.seed + self.epoch)
        indices = get_length_grouped_indices(self.lengths, self.batch_size, generator=self.generator)
        n_full = len(indices) // self.batch_size
        batches = [indices[i * self.batch_size : (i + 1) * self.batch_size] for i in range(n_full)]
        # batch 0 holds the longest sequence (memory errors show at once): keep it first, shuffle the rest
        order = [0] + (torch.randperm(n_full - 1, generator=self.generator) + 1).tolist() if n_full else []
        shuffled = [i for b in order for i in batches[b]]
        return iter(shuffled + indices[n_full * self.batch_size :])


class TranslationTrainer(Seq2SeqTrainer):
    """Seq2SeqTrainer whose `group_by_length` groups by max(source, target) length, for training only.

    HF groups by the source length alone, which leaves the targets padded by 48% on Multi30k
    (their logits over the whole vocabulary are the costliest part of a step); grouping by the
    longer side leaves 12%. Groups are of the global batch (all processes, all accumulation steps),
    so N processes of batch b see the same batches as one process of batch N * b. Evaluation and the
    test translate and score every sentence exactly once, in dataset order, on any number of processes.
    """

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        if self.args.train_sampling_strategy != "group_by_length" or "labels" not in dataset.column_names:
            return super()._get_train_sampler(train_dataset)
        lengths = [max(len(src), len(tgt)) for src, tgt in zip(dataset["input_ids"], dataset["labels"])]
        batch = self.args.train_batch_size * self.args.gradient_accumulation_steps * self.args.world_size
        seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
        return EpochSeededLengthGroupedSampler(batch, dataset=dataset, lengths=lengths, seed=seed)

    def evaluation_loop(self, *args, **kwargs):
        # Seq2SeqTrainer.evaluate() and predict() switch the gathering to accelerator.gather, which keeps the
        # sentences that the distributed sampler repeats to even out the last batches across processes (1000
        # test sentences in batches of 32 on 2 processes came back as 1024). gather_for_metrics drops them:
        # every sentence is translated and scored once, in dataset order, whatever the processes and batch.
        self.gather_function = self.accelerator.gather_for_metrics
        return super().evaluation_loop(*args, **kwargs)

    def _get_eval_sampler(self, eval_dataset):
        # HF also groups evaluation batches by length when group_by_length is on, and returns the
        # predictions in that shuffled order; ours are scored against the references in dataset order.
        if eval_dataset is None:
            return None
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None


def _build_tokenizer(model_args, data_args, raw, training_args):
    if model_args.model_name_or_path or model_args.tokenizer_name:
        name = model_args.tokenizer_name or model_args.model_name_or_path
        return AutoTokenizer.from_pretrained(name, trust_remote_code=model_args.trust_remote_code)
    if training_args.world_size > 1:
        # Every process must hold the very same vocabulary: the main process trains it and sends it
        # to the others (in memory: nothing is written before all the checks have passed).
        from accelerate.utils import broadcast_object_list

        tokenizer = [_train_tokenizer(model_args, data_args, raw) if training_args.process_index == 0 else None]
        return broadcast_object_list(tokenizer, from_process=0)[0]
    return _train_tokenizer(model_args, data_args, raw)


def _train_tokenizer(model_args, data_args, raw):
    train = raw[data_args.train_split]
    texts = list(train[data_args.source_lang]) + list(train[data_args.target_lang])
    tokenizer = train_tokenizer(texts, vocab_size=model_args.vocab_size,
                                min_frequency=model_args.tokenizer_min_frequency,
                                model_max_length=max(data_args.max_source_length, data_args.max_target_length))
    logger.info("trained a joint BPE tokenizer of %d tokens on %d sentences", len(tokenizer), len(texts))
    return tokenizer


def _parse_overrides(text: str | None) -> dict:
    overrides = {}
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise ValueError(f"config_overrides item {item!r} is not key=value")
        key, value = (part.strip() for part in item.split("=", 1))
        if key not in ScratchTransformerConfig.__dataclass_fields__ and key not in ScratchTransformerConfig.attribute_map:
            raise ValueError(f"config_overrides: unknown config field {key!r}")
        try:
            overrides[key] = json.loads(value.lower() if value.lower() in ("true", "false") else value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def _build_model(model_args, tokenizer):
    if model_args.model_name_or_path:
        model = AutoModelForSeq2SeqLM.from_pretrained(
            model_args.model_name_or_path, trust_remote_code=model_args.trust_remote_code,
            attn_implementation=model_args.attn_implementation,
        )
        if model.config.vocab_size < len(tokenizer):
            raise ValueError(f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
                             f"{model.config.vocab_size}")
        return model
    config_values = {}
    if model_args.config_name:
        config_values = ScratchTransformerConfig.from_pretrained(model_args.config_name).to_diff_dict()
        for key in ("model_type", "transformers_version", "architectures", "auto_map"):
            config_values.pop(key, None)
    config_values.update(_parse_overrides(model_args.config_overrides))
    config_values.update(vocab_size=len(tokenizer), **tokenizer_special_ids(tokenizer))
    config_values["decoder_start_token_id"] = tokenizer.bos_token_id
    config = ScratchTransformerConfig(**config_values)
    config._attn_implementation = model_args.attn_implementation
    return ScratchTransformerForConditionalGeneration(config)


DECODING_DEFAULTS = {"num_beams": 4, "length_penalty": 1.0, "no_repeat_ngram_size": 0}


def _resolve_decoding(model_args, data_args, model) -> dict:
    """The final test's decoding, which is also the saved generation config's: each of num_beams,
    length_penalty and no_repeat_ngram_size from its flag, else (fine-tuning) from the loaded model's
    generation config, else DECODING_DEFAULTS; so that what is tested is what users get. Greedy search
    (num_beams 1) drops an inherited length penalty.

    Raises:
        ValueError: naming the flags, for a combination that generate() refuses (e.g. a length penalty
            with num_beams 1), before anything is trained or written.
    """
    from transformers import GenerationConfig

    decoding = {}
    for name, default in DECODING_DEFAULTS.items():
        given = getattr(data_args, name)
        inherited = getattr(model.generation_config, name, None) if model_args.model_name_or_path else None
        decoding[name] = given if given is not None else inherited if inherited is not None else default
    if decoding["num_beams"] == 1 and data_args.length_penalty is None:
        decoding["length_penalty"] = 1.0  # an inherited penalty means nothing to greedy search (and HF refuses it)
    try:
        GenerationConfig(max_length=data_args.max_target_length, **decoding).validate(strict=True)
    except ValueError as error:
        reasons = [line.lstrip("- ") for line in str(error).splitlines() if line.startswith("- ")] or [str(error)]
        sources = "the flags" + (f" and {model_args.model_name_or_path}'s generation_config.json"
                                 if model_args.model_name_or_path else "")
        raise ValueError(f"--num_beams {decoding['num_beams']} --length_penalty {decoding['length_penalty']:g} "
                         f"--no_repeat_ngram_size {decoding['no_repeat_ngram_size']} (from {sources}) do not make a "
                         f"valid generation config: {' '.join(reasons)}") from None
    return decoding


def _dataset_label(data_args) -> str:
    """A short name for the card: the Hub id, or a local folder's name ("multi30k" for multi30k/raw)."""
    if data_args.dataset_name is None:
        return "custom"
    if not os.path.isdir(data_args.dataset_name):
        return data_args.dataset_name
    path = os.path.normpath(os.path.abspath(data_args.dataset_name))
    return os.path.basename(os.path.dirname(path)) if os.path.basename(path) == "raw" else os.path.basename(path)


def _check_resume_checkpoint(checkpoint: str, model=None, needs_tokenizer: bool = False) -> None:
    """A checkpoint to resume must be complete (and, given the model, match it); raise naming the path and field.

    Called before anything is loaded from it, and again with the model once it is built.
    """
    needed = ["config.json", "model.safetensors", "trainer_state.json"]
    needed += ["tokenizer.json"] if needs_tokenizer else []
    missing = [name for name in needed if not os.path.isfile(os.path.join(checkpoint, name))]
    if missing:
        raise ValueError(f"checkpoint {checkpoint} is incomplete or corrupt: missing {', '.join(missing)}")
    names = os.listdir(checkpoint)
    if not any(name.startswith("optimizer") for name in names) or not any(name.startswith("scheduler")
                                                                          for name in names):
        raise ValueError(f"{checkpoint} holds no optimizer or scheduler state (optimizer.pt, scheduler.pt): it is a "
                         "finished model, not a training checkpoint, and a resumed run would restart Adam and the "
                         f"schedule from zero. To train on from its weights, pass --model_name_or_path {checkpoint} "
                         "(a fine-tune: new optimizer and schedule); to resume, give a checkpoint-N folder")
    saved = {}
    for name in ("config.json", "trainer_state.json"):
        try:
            with open(os.path.join(checkpoint, name), encoding="utf-8") as handle:
                saved[name] = json.load(handle)
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"checkpoint {checkpoint}: {name} is not valid JSON ({error})") from error
        if not isinstance(saved[name], dict):
            raise ValueError(f"checkpoint {checkpoint}: {name} does not hold a JSON object")
    if not is_complete_safetensors(os.path.join(checkpoint, "model.safetensors")):
        raise ValueError(f"checkpoint {checkpoint}: model.safetensors is truncated or corrupt")
    if model is None:
        return
    config = saved["config.json"]
    for key in ("vocab_size", "d_model", "num_heads", "encoder_layers", "decoder_layers", "d_ff",
                "share_encoder_decoder_embeddings", "pre_layer_norm"):
        if key in config and config[key] != getattr(model.config, key):
            raise ValueError(f"checkpoint {checkpoint} does not match the model: config field {key} is "
                             f"{config[key]!r} there but {getattr(model.config, key)!r} here")


def _check_output_dir(training_args) -> str | None:
    """Resume from the last complete checkpoint in output_dir, or refuse to overwrite a finished run.

    Only looks: half-written checkpoints are removed later, by `_remove_incomplete_checkpoints`, once
    every check has passed (a failing start leaves the folder as it was).
    """
    if training_args.resume_from_checkpoint:
        if not os.path.isdir(training_args.resume_from_checkpoint):
            raise ValueError(f"resume_from_checkpoint {training_args.resume_from_checkpoint} is not a folder")
        return training_args.resume_from_checkpoint
    output_dir = training_args.output_dir
    if not training_args.do_train:
        if os.path.isdir(output_dir) and os.listdir(output_dir) and not training_args.overwrite_output_dir:
            holds = "a model" if os.path.isfile(os.path.join(output_dir, "config.json")) else "files"
            raise ValueError(f"output_dir {output_dir} already holds {holds}: an evaluation-only run (do_train "
                             "false) would replace its README.md, all_results.json and generated_predictions.txt. "
                             "Choose a new --output_dir, or pass --overwrite_output_dir true to write there")
        return None
    if not os.path.isdir(output_dir):
        return None
    last = last_complete_checkpoint(output_dir)
    if last is not None:
        logger.info("resuming from %s (delete the output folder to start afresh)", last)
        return last
    half_written = {os.path.basename(folder) for folder in sorted_checkpoints(output_dir)}  # none is complete
    if set(os.listdir(output_dir)) - half_written:
        raise ValueError(f"output_dir {output_dir} already exists, is not empty and holds no checkpoint to resume "
                         "from: choose another folder or delete it")
    return None


def _remove_incomplete_checkpoints(training_args) -> None:
    """Delete the checkpoints newer than the last complete one (a run killed while saving): their steps are
    trained again, and neither HF's resume nor its checkpoint rotation must ever read them."""
    if training_args.do_train and training_args.should_save and os.path.isdir(training_args.output_dir):
        last_complete_checkpoint(training_args.output_dir, remove_incomplete=True)


def _tokenize(raw, tokenizer, data_args, training_args):
    src, tgt = data_args.source_lang, data_args.target_lang

    def preprocess(batch):
        model_inputs = tokenizer(batch[src], max_length=data_args.max_source_length, truncation=True)
        model_inputs["labels"] = tokenizer(batch[tgt], max_length=data_args.max_target_length,
                                           truncation=True)["input_ids"]
        return model_inputs

    tokenized = {}
    with training_args.main_process_first(desc="tokenisation"):
        for split, dataset in raw.items():
            tokenized[split] = dataset.map(preprocess, batched=True, remove_columns=dataset.column_names,
                                           num_proc=data_args.preprocessing_num_workers,
                                           desc=f"tokenising {split}")
    return tokenized


def _render_card(output_dir, results, model, tokenizer, model_args, data_args, training_args, decoding):
    from .card import render_model_card

    config = model.config
    examples = results.get("examples") or [{"source": "Ein Mann fährt Fahrrad."}]
    schedule = getattr(training_args.lr_scheduler_type, "value", training_args.lr_scheduler_type)  # enum -> "linear"
    card_values = {
        "model_name": training_args.hub_model_id or os.path.basename(os.path.abspath(output_dir)),
        "repo_id": training_args.hub_model_id or os.path.abspath(output_dir),
        "src_lang": data_args.source_lang, "tgt_lang": data_args.target_lang,
        "dataset_name": results["dataset_name"], "dataset_id": results["dataset_id"],
        "test_split": data_args.test_split, "bleu": results["test_bleu"], "chrf": results["test_chrf"],
        "bleu_signature": results["bleu_signature"], "num_beams": decoding["num_beams"],
        "decoding": ", ".join([f"beam {decoding['num_beams']}", f"length penalty {decoding['length_penalty']:g}"]
                              + ([f"no repeated {decoding['no_repeat_ngram_size']}-gram"]
                                 if decoding["no_repeat_ngram_size"] else [])),
        "d_model": config.d_model, "num_heads": config.num_heads, "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers, "d_ff": config.d_ff, "dropout": config.dropout,
        "norm": "pre-LN" if config.pre_layer_norm else "post-LN", "num_parameters": f"{count_parameters(model):,}",
        "vocab_size": len(tokenizer), "example_source": examples[0]["source"].replace('"', "'"),
        "training_summary": (
            f"{results.get('train_steps', '?')} steps of batch {training_args.per_device_train_batch_size} "
            f"x {training_args.world_size} process(es), Adam (0.9, {training_args.adam_beta2}, "
            f"{training_args.adam_epsilon}), {schedule} schedule with "
            f"{training_args.warmup_steps} warmup steps and peak learning rate {training_args.learning_rate:g}, "
            f"label smoothing {training_args.label_smoothing_factor}; "
            f"{results.get('train_minutes', 0):.1f} minutes of training. "
            + (f"Weights: the average of the last {results['averaged_checkpoints']} checkpoints (paper 6.1)."
               if results.get("averaged_checkpoints") else "Weights: the last checkpoint.")
        ),
    }
    card = render_model_card(card_values, model_args.card_template)
    card.save(os.path.join(output_dir, "README.md"))


def run_translation(model_args: ModelArguments, data_args: DataTrainingArguments,
                    training_args: TranslationTrainingArguments) -> dict:
    """Train (or fine-tune), evaluate, test and document a translation model; returns the results dict.

    Writes into training_args.output_dir: the model (safetensors, config with auto_map, code files,
    generation_config.json), the tokenizer, all_results.json, generated_predictions.txt,
    training_curve.png and a README.md model card from hub_card.md; pushes the folder when
    --push_to_hub is given. Raises ValueError for bad arguments, data or checkpoints before
    anything is written; a run that fails leaves no empty output folder behind.
    """
    created = not os.path.exists(training_args.output_dir)
    try:
        return _run_translation(model_args, data_args, training_args)
    except BaseException:
        output_dir = training_args.output_dir
        if created and training_args.should_save and os.path.isdir(output_dir) and \
                not any(files for _, _, files in os.walk(output_dir)):
            shutil.rmtree(output_dir, ignore_errors=True)  # only folders, no file: nothing of value
        raise


def _run_translation(model_args, data_args, training_args) -> dict:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO,
                        handlers=[logging.StreamHandler(sys.stdout)])
    if not training_args.should_log:
        logging.getLogger().setLevel(logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()
    set_seed(training_args.seed)

    push_to_hub, training_args.push_to_hub = training_args.push_to_hub, False  # we push once, at the end
    if push_to_hub:
        from .hub import check_repo_id

        check_repo_id(training_args.hub_model_id)
    resume_from = _check_output_dir(training_args)
    tokenizer_from_checkpoint = bool(resume_from and not model_args.model_name_or_path
                                     and not model_args.tokenizer_name)
    if resume_from:
        _check_resume_checkpoint(resume_from, needs_tokenizer=tokenizer_from_checkpoint)

    # 1. data (everything is checked before anything is written)
    splits = [s for s, wanted in ((data_args.train_split, training_args.do_train),
                                  (data_args.validation_split, training_args.do_eval or training_args.do_train),
                                  (data_args.test_split, training_args.do_predict)) if wanted]
    splits = list(dict.fromkeys(splits))
    data_files = {name: path for name, path in ((data_args.train_split, data_args.train_file),
                                                (data_args.validation_split, data_args.validation_file),
                                                (data_args.test_split, data_args.test_file)) if path}
    caps = {data_args.train_split: data_args.max_train_samples, data_args.validation_split: data_args.max_eval_samples,
            data_args.test_split: data_args.max_predict_samples}
    to_load = [s for s in splits if not data_files or s in data_files]
    raw = load_translation_dataset(
        data_args.dataset_name, data_args.source_lang, data_args.target_lang, splits=to_load,
        dataset_config_name=data_args.dataset_config_name, data_files=data_files or None,
        max_samples={k: v for k, v in caps.items() if v and k in to_load},  # e.g. no test cap without do_predict
    )
    for split in splits:
        if split not in raw:
            raise ValueError(f"split {split!r} not found; found {sorted(raw)}")

    # 2. tokenizer and model
    if tokenizer_from_checkpoint:
        model_args.tokenizer_name = resume_from  # the tokenizer the interrupted run trained
    tokenizer = _build_tokenizer(model_args, data_args, raw, training_args)
    model = _build_model(model_args, tokenizer)
    if resume_from:
        _check_resume_checkpoint(resume_from, model)
    if training_args.noam_factor is not None:
        training_args.learning_rate = noam_peak_learning_rate(model.config.d_model, int(training_args.warmup_steps),
                                                              training_args.noam_factor)
    decoding = _resolve_decoding(model_args, data_args, model)
    # Validation during training stays plain greedy: the n-gram block joins the generation config for the
    # final test and the saved model (step 5).
    model.generation_config.update(num_beams=decoding["num_beams"], max_length=data_args.max_target_length,
                                   length_penalty=decoding["length_penalty"], no_repeat_ngram_size=0,
                                   decoder_start_token_id=model.config.decoder_start_token_id,
                                   pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                   bos_token_id=tokenizer.bos_token_id)
    if training_args.generation_max_length is None:
        training_args.generation_max_length = data_args.max_target_length
    if training_args.generation_num_beams is None:
        training_args.generation_num_beams = 1  # periodic validation is greedy; the final test uses num_beams
    logger.info("model: %s parameters; %s", f"{count_parameters(model):,}", model.config.to_diff_dict())

    tokenized = _tokenize(raw, tokenizer, data_args, training_args)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)
    callbacks = []
    budget = None
    if training_args.max_train_minutes:
        budget = WallClockBudgetCallback(training_args.max_train_minutes)
        callbacks.append(budget)
    trainer = TranslationTrainer(
        model=model, args=training_args, data_collator=collator, processing_class=tokenizer,
        train_dataset=tokenized.get(data_args.train_split) if training_args.do_train else None,
        eval_dataset=tokenized.get(data_args.validation_split), compute_metrics=make_compute_metrics(tokenizer),
        callbacks=callbacks,
    )

    label = _dataset_label(data_args)
    results = {"dataset_name": label, "dataset_id": label}

    # 3. train
    if training_args.do_train:
        _remove_incomplete_checkpoints(training_args)
        start = time.perf_counter()
        train_result = trainer.train(resume_from_checkpoint=resume_from)
        wall = time.perf_counter() - start
        trainer.save_model()  # model, config, code, generation config, tokenizer
        metrics = dict(train_result.metrics)
        metrics["train_samples"] = len(tokenized[data_args.train_split])
        metrics["train_wall_minutes"] = round(wall / 60, 2)
        if budget is not None:
            metrics["train_minutes_excluding_eval"] = round(budget.training_seconds / 60, 2)
        results["train_steps"] = trainer.state.global_step
        results["train_minutes"] = budget.training_seconds / 60 if budget else wall / 60
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

        # 3b. checkpoint averaging (paper 6.1), kept only if it does not hurt validation BLEU. Every process
        # takes the same decision: they list the checkpoints once the main process has finished rotating
        # them, and evaluate() gathers the predictions, so that all compute the same BLEU.
        trainer.accelerator.wait_for_everyone()
        checkpoints = sorted_checkpoints(training_args.output_dir)[-model_args.average_last_checkpoints:]
        if model_args.average_last_checkpoints > 1 and trainer.is_fsdp_enabled:
            logger.warning("checkpoint averaging is skipped under FSDP (the model's weights are sharded)")
            checkpoints = []
        if model_args.average_last_checkpoints > 1 and len(checkpoints) > 1:
            last_bleu = trainer.evaluate(metric_key_prefix="eval_last")["eval_last_bleu"]
            last_state = {k: v.clone() for k, v in model.state_dict().items()}
            model.load_state_dict(average_checkpoints(checkpoints), strict=False)
            averaged_bleu = trainer.evaluate(metric_key_prefix="eval_averaged")["eval_averaged_bleu"]
            if averaged_bleu >= last_bleu:
                results["averaged_checkpoints"] = len(checkpoints)
                trainer.save_model()
            else:
                model.load_state_dict(last_state)
                results["averaged_checkpoints"] = 0
            logger.info("validation BLEU: last checkpoint %.2f, average of %d: %.2f -> keeping %s", last_bleu,
                        len(checkpoints), averaged_bleu, "average" if averaged_bleu >= last_bleu else "last")
            trainer.save_metrics("averaging", {"last_checkpoint_bleu": last_bleu, "averaged_bleu": averaged_bleu,
                                               "averaged_checkpoints": results["averaged_checkpoints"]})

    # 4. validation
    if training_args.do_eval:
        metrics = trainer.evaluate(metric_key_prefix="eval")
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    # 5. test: beam search, scored against the raw references. The n-gram block is a decoding choice for
    # the test and the shipped generation config; validation during training stays plain greedy.
    if decoding["no_repeat_ngram_size"]:
        model.generation_config.update(no_repeat_ngram_size=decoding["no_repeat_ngram_size"])
        if training_args.do_train and trainer.is_world_process_zero():
            model.generation_config.save_pretrained(training_args.output_dir)
    if training_args.do_predict:
        # The test decodes the saved fp32 weights as users will (translate.py, pipeline): without the
        # bf16/fp16 autocast that accelerate wraps around forward for training and validation.
        trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
        prediction = trainer.predict(tokenized[data_args.test_split], metric_key_prefix="test",
                                     max_length=data_args.max_target_length, **decoding)
        if trainer.is_world_process_zero():
            hypotheses = decode_ids(tokenizer, prediction.predictions)
            test_raw = raw[data_args.test_split]
            references = list(test_raw[data_args.target_lang])
            scores = corpus_scores(hypotheses, references)
            metrics = {k: v for k, v in prediction.metrics.items() if not k.endswith(("_bleu", "_chrf"))}
            metrics.update(test_bleu=scores["bleu"], test_chrf=scores["chrf"], test_samples=len(hypotheses),
                           test_num_beams=decoding["num_beams"])
            results.update(test_bleu=scores["bleu"], test_chrf=scores["chrf"],
                           bleu_signature=scores["bleu_signature"])
            results["examples"] = [{"source": s, "reference": r, "prediction": h} for s, r, h in
                                   zip(test_raw[data_args.source_lang][:3], references[:3], hypotheses[:3])]
            print(f"sacreBLEU signature: {scores['bleu_signature']}")
            print(f"test BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({len(hypotheses)} sentences, "
                  f"beam {decoding['num_beams']})")
            trainer.log_metrics("test", metrics)
            trainer.save_metrics("test", metrics)
            with open(os.path.join(training_args.output_dir, "generated_predictions.txt"), "w",
                      encoding="utf-8") as handle:
                handle.write("\n".join(hypotheses) + "\n")

    # 6. curve, card, results, push (once, on the main process)
    if trainer.is_world_process_zero():
        output_dir = training_args.output_dir
        plot_training_curve(trainer.state.log_history, os.path.join(output_dir, "training_curve.png"))
        with open(os.path.join(output_dir, "all_results.json"), encoding="utf-8") as handle:
            all_results = json.load(handle)
        all_results["num_parameters"] = count_parameters(model)
        write_json(os.path.join(output_dir, "all_results.json"), all_results)
        if "test_bleu" in results and os.path.isfile(os.path.join(output_dir, "model.safetensors")):
            # a card only beside the weights it describes (an evaluation into a new folder writes none)
            _render_card(output_dir, results, model, tokenizer, model_args, data_args, training_args, decoding)
        results["all_results"] = all_results
        if push_to_hub:
            from .hub import push_output_dir

            results["hub_commit"] = push_output_dir(output_dir, training_args.hub_model_id,
                                                    private=training_args.hub_private_repo)
    return results
