"""The main job: train, evaluate and document a translation model with HF's Seq2SeqTrainer.

`scripts/train_translation.py` parses the argument dataclasses of `arguments.py` with HfArgumentParser
(flags or one .json file, as transformers' run_translation.py) and calls `run_translation`, a short
sequence of named steps: check the start, load the data, build the tokenizer and model, train, average
checkpoints, validate, test, write the outputs. Each step returns its part of the results; the argument
objects are never changed (the Trainer gets a copy with the values derived from them).
"""

import copy
import difflib
import json
import logging
import os
import shutil
import sys
import time

import transformers
from datasets.fingerprint import Hasher
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    GenerationConfig,
    PreTrainedConfig,
    set_seed,
)

from .arguments import (
    DataTrainingArguments,
    ModelArguments,
    TranslationTrainingArguments,
)
from .checkpoints import (
    average_checkpoints,
    check_resume_checkpoint,
    lock_output_dir,
    remove_incomplete_checkpoints,
    resume_checkpoint_in,
    sorted_checkpoints,
    unlock_output_dir,
)
from .configuration_scratch_transformer import ScratchTransformerConfig
from .data import load_translation_dataset, release_mapped_pages
from .metrics import (
    corpus_scores,
    count_repeated_token_outputs,
    decode_ids,
    make_compute_metrics,
)
from .modeling_scratch_transformer import ScratchTransformerForConditionalGeneration
from .paths import (
    TOKENIZER_FILES,
    looks_like_local_path,
    missing_path_message,
    model_folder_problem,
    unwritable_reason,
    write_text,
)
from .tokenization import tokenizer_special_ids, train_tokenizer_on_dataset
from .trainer import TranslationTrainer
from .training import (
    ExponentialMovingAverageCallback,
    LongRunDropoutCallback,
    WallClockBudgetCallback,
    count_parameters,
    noam_peak_learning_rate,
    plot_training_curve,
    write_json,
)

logger = logging.getLogger(__name__)


def _build_tokenizer(model_args, data_args, raw, training_args, resume_from=None):
    """The checkpoint's or the named tokenizer; when resuming a new model's run, the one it trained; else a
    new joint BPE trained on the training split."""
    name = model_args.tokenizer_name or model_args.model_name_or_path or resume_from
    if name:
        return AutoTokenizer.from_pretrained(name, trust_remote_code=model_args.trust_remote_code)
    if training_args.world_size > 1:
        # Every process must hold the very same vocabulary: the main process trains it and sends it
        # to the others (in memory: nothing is written before all the checks have passed).
        from accelerate.utils import broadcast_object_list

        tokenizer = [_train_tokenizer(model_args, data_args, raw, training_args)
                     if training_args.process_index == 0 else None]
        return broadcast_object_list(tokenizer, from_process=0)[0]
    return _train_tokenizer(model_args, data_args, raw, training_args)


def _train_tokenizer(model_args, data_args, raw, training_args):
    """A joint BPE on both languages of the training split, read from Arrow in batches (every pair, or the
    --tokenizer_max_sentences pairs drawn by the data seed); reused from the datasets cache on a rerun."""
    train = raw[data_args.train_split]
    seed = training_args.data_seed if training_args.data_seed is not None else training_args.seed
    tokenizer = train_tokenizer_on_dataset(
        train, [data_args.source_lang, data_args.target_lang], max_sentences=model_args.tokenizer_max_sentences,
        seed=seed, vocab_size=model_args.vocab_size, min_frequency=model_args.tokenizer_min_frequency,
        model_max_length=max(data_args.max_source_length, data_args.max_target_length))
    release_mapped_pages(train)  # the text read for BPE is not needed resident during training
    pairs = min(len(train), model_args.tokenizer_max_sentences or len(train))
    logger.info("joint BPE tokenizer of %d tokens, from %d sentences (%d training pairs)", len(tokenizer),
                2 * pairs, pairs)
    return tokenizer


def _parse_overrides(text: str | None, config_class=ScratchTransformerConfig) -> dict:
    """`key=value,...` as config keyword arguments; each key a field of `config_class` or a name of its
    attribute_map (a paper name such as d_model, or its HF name such as hidden_size).

    Raises:
        ValueError: an item that is not key=value, or a key that `config_class` lacks (naming it and the config).
    """
    overrides = {}
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise ValueError(f"config_overrides item {item!r} is not key=value")
        key, value = (part.strip() for part in item.split("=", 1))
        if key not in config_class.__dataclass_fields__ and key not in config_class.attribute_map:
            close = difflib.get_close_matches(key, [*config_class.__dataclass_fields__, *config_class.attribute_map])
            raise ValueError(f"config_overrides: unknown config field {key!r} for {config_class.__name__} "
                             f"(model_type {config_class.model_type!r})"
                             + (f"; did you mean {', '.join(map(repr, close))}?" if close else ""))
        try:
            overrides[key] = json.loads(value.lower() if value.lower() in ("true", "false") else value)
        except json.JSONDecodeError:
            overrides[key] = value
    return overrides


def _load_config_class_and_values(model_args) -> tuple[type, dict]:
    """The class and the saved values of --config_name (ours when it names no model_type), or ours and none."""
    if not model_args.config_name:
        return ScratchTransformerConfig, {}
    saved, _ = PreTrainedConfig.get_config_dict(model_args.config_name)
    if saved.get("model_type", ScratchTransformerConfig.model_type) == ScratchTransformerConfig.model_type:
        config = ScratchTransformerConfig.from_pretrained(model_args.config_name)
    else:
        config = AutoConfig.from_pretrained(model_args.config_name, trust_remote_code=model_args.trust_remote_code)
        if not config.is_encoder_decoder:
            raise ValueError(f"--config_name {model_args.config_name}: a {config.model_type} config is not an "
                             "encoder-decoder (is_encoder_decoder false); a translation model needs one")
    values = config.to_diff_dict()
    for key in ("model_type", "transformers_version", "architectures", "auto_map"):
        values.pop(key, None)
    return type(config), values


def _tokenizer_config_values(config_class, tokenizer) -> dict:
    """vocab_size and the special ids from the trained tokenizer, as transformers' run_translation.py sets them:
    pad/bos/eos/unk, the decoder starting from bos (as ours always does, so that every model starts the same
    way) and the joint vocabulary's size for a config with a separate decoder vocabulary."""
    values = dict(tokenizer_special_ids(tokenizer), vocab_size=len(tokenizer),
                  decoder_start_token_id=tokenizer.bos_token_id)
    if "decoder_vocab_size" in config_class.__dataclass_fields__:  # Marian's decoder size; our tokenizer is joint
        values["decoder_vocab_size"] = len(tokenizer)
    return values


def _build_model(model_args, tokenizer):
    """The model to fine-tune (--model_name_or_path), or a new one: ours by default, or any HF encoder-decoder
    that --config_name names (e.g. a MarianConfig's folder), built with AutoModelForSeq2SeqLM.from_config.

    --config_overrides apply to the fields of that config; the vocabulary size and special ids come from the
    tokenizer (`_tokenizer_config_values`).

    Raises:
        ValueError: a tokenizer larger than the fine-tuned model's vocabulary, an override the config lacks, or a
            --config_name that is not an encoder-decoder.
    """
    if model_args.model_name_or_path:
        from safetensors import SafetensorError

        try:
            model = AutoModelForSeq2SeqLM.from_pretrained(
                model_args.model_name_or_path, trust_remote_code=model_args.trust_remote_code,
                attn_implementation=model_args.attn_implementation,
            )
        except SafetensorError as error:  # weights cut short or corrupt (a local folder is checked before)
            raise ValueError(f"--model_name_or_path {model_args.model_name_or_path}: its model.safetensors cannot "
                             f"be read ({error})") from None
        _check_tokenizer_fits(model_args, model, tokenizer)
        if model.config.vocab_size < len(tokenizer):
            raise ValueError(f"tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
                             f"{model.config.vocab_size}")
        return model
    config_class, config_values = _load_config_class_and_values(model_args)
    config_values.update(_parse_overrides(model_args.config_overrides, config_class))
    forced_eos = config_values.get("forced_eos_token_id", getattr(config_class, "forced_eos_token_id", None))
    config_values.update(_tokenizer_config_values(config_class, tokenizer))
    if "forced_eos_token_id" in config_class.__dataclass_fields__:  # the tokenizer's EOS, or none as asked
        config_values["forced_eos_token_id"] = tokenizer.eos_token_id if forced_eos is not None else None
    config = config_class(**config_values)
    if config_class is ScratchTransformerConfig:
        config._attn_implementation = model_args.attn_implementation
        return ScratchTransformerForConditionalGeneration(config)
    return AutoModelForSeq2SeqLM.from_config(config, attn_implementation=model_args.attn_implementation,
                                             trust_remote_code=model_args.trust_remote_code)


DECODING_DEFAULTS = {"num_beams": 4, "length_penalty": 1.0, "no_repeat_ngram_size": 0, "early_stopping": False,
                     "renormalize_logits": False}


def _resolve_decoding(model_args, data_args, model) -> dict:
    """The final test's decoding, which is also the saved generation config's: each of num_beams,
    length_penalty, no_repeat_ngram_size, early_stopping and renormalize_logits from its flag, else
    (fine-tuning) from the loaded model's generation config, else DECODING_DEFAULTS; so that what is tested
    is what users get. Greedy search (num_beams 1) drops the settings that only apply to beam search (length
    penalty, early stopping), whether inherited, from a config file or passed, with a log line naming them: so
    `--num_beams 1` over the shipped config gives a greedy run.

    Raises:
        ValueError: naming the flags, for a combination that generate() refuses (e.g. a length penalty
            with num_beams 1), before anything is trained or written.
    """
    decoding = {}
    for name, default in DECODING_DEFAULTS.items():
        given = getattr(data_args, name)
        inherited = getattr(model.generation_config, name, None) if model_args.model_name_or_path else None
        decoding[name] = given if given is not None else inherited if inherited is not None else default
    if decoding["num_beams"] == 1:  # a beam setting means nothing to greedy search (and HF refuses it)
        dropped = {name: decoding[name] for name in ("length_penalty", "early_stopping")
                   if decoding[name] != DECODING_DEFAULTS[name]}
        if dropped:
            logger.info("greedy search (num_beams 1): dropping the beam-search settings %s",
                        ", ".join(f"{name} {value}" for name, value in dropped.items()))
        decoding.update({name: DECODING_DEFAULTS[name] for name in dropped})
    try:
        GenerationConfig(max_length=data_args.max_target_length, **decoding).validate(strict=True)
    except ValueError as error:
        reasons = [line.lstrip("- ") for line in str(error).splitlines() if line.startswith("- ")] or [str(error)]
        sources = "the flags" + (f" and {model_args.model_name_or_path}'s generation_config.json"
                                 if model_args.model_name_or_path else "")
        raise ValueError(f"--num_beams {decoding['num_beams']} --length_penalty {decoding['length_penalty']:g} "
                         f"--no_repeat_ngram_size {decoding['no_repeat_ngram_size']} --early_stopping "
                         f"{decoding['early_stopping']} (from {sources}) do not make a "
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


def _tokenize_batch(batch, tokenizer, src, tgt, max_source_length, max_target_length):
    """Batched `map` function: input_ids/attention_mask of the source side, labels of the target side."""
    model_inputs = tokenizer(batch[src], max_length=max_source_length, truncation=True)
    model_inputs["labels"] = tokenizer(batch[tgt], max_length=max_target_length, truncation=True)["input_ids"]
    return model_inputs


def _tokenization_fingerprint(dataset, tokenizer, data_args) -> str | None:
    """The `datasets` fingerprint of a tokenised split: a hash of the split's own fingerprint, the tokenizer's
    pipeline (its tokenizer.json, less the truncation/padding state that each call sets), the columns, the
    maximum lengths and the code of `_tokenize_batch`. The same for the same inputs in every run, so a rerun
    finds the cache file; None (datasets then hashes the function itself) for a tokenizer without a
    `tokenizers` backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not getattr(dataset, "_fingerprint", None):
        return None
    pipeline = json.loads(backend.to_str())
    pipeline.pop("truncation", None)
    pipeline.pop("padding", None)
    code = _tokenize_batch.__code__
    return Hasher.hash(["tokenize-v1", dataset._fingerprint, pipeline, type(tokenizer).__name__, len(tokenizer),
                        tokenizer.special_tokens_map, list(tokenizer.model_input_names), tokenizer.truncation_side,
                        data_args.source_lang, data_args.target_lang, data_args.max_source_length,
                        data_args.max_target_length, code.co_code, code.co_consts, code.co_names])


def _tokenize(raw, tokenizer, data_args, training_args):
    """Tokenise every split by batched `map` (--preprocessing_num_workers processes) into Arrow cache files
    beside the split's own, under a fingerprint that is the same in every run (`_tokenization_fingerprint`):
    a rerun loads them instead of tokenising again. Logs, per split, whether its cache was reused or written."""
    fn_kwargs = {"tokenizer": tokenizer, "src": data_args.source_lang, "tgt": data_args.target_lang,
                 "max_source_length": data_args.max_source_length, "max_target_length": data_args.max_target_length}
    tokenized = {}
    with training_args.main_process_first(desc="tokenisation"):
        for split, dataset in raw.items():
            folders = {os.path.dirname(f["filename"]) for f in dataset.cache_files}
            before = {(folder, name) for folder in folders for name in os.listdir(folder)}
            tokenized[split] = dataset.map(_tokenize_batch, batched=True, fn_kwargs=fn_kwargs,
                                           remove_columns=dataset.column_names,
                                           num_proc=data_args.preprocessing_num_workers,
                                           new_fingerprint=_tokenization_fingerprint(dataset, tokenizer, data_args),
                                           desc=f"tokenising {split}")
            release_mapped_pages(dataset)  # the text this process read (num_proc 1) leaves its resident set
            files = [f["filename"] for f in tokenized[split].cache_files]
            if not files:
                state = "kept in memory"
            elif all((os.path.dirname(f), os.path.basename(f)) in before for f in files):
                state = f"reused the cache {', '.join(files)}"
            else:
                state = f"written to {', '.join(files)}"
            logger.info("tokenised %s: %d pairs, %s", split, len(tokenized[split]), state)
    # Calling the tokenizer with truncation=True leaves that setting on its backend, which save_pretrained would
    # write into tokenizer.json: clear it, so the saved tokenizer is the same whether a split was tokenised here
    # or loaded from the cache (callers pass truncation explicitly, as translate() does).
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        backend.no_truncation()
        backend.no_padding()
    return tokenized


def _architecture_values(config) -> dict:
    """The card's model table from any encoder-decoder config, by the names of Marian/BART configs (ours maps
    them to its own in attribute_map); "?" for a size the config does not have."""
    pre_layer_norm = getattr(config, "pre_layer_norm", None)
    return {"d_model": getattr(config, "d_model", "?"), "num_heads": getattr(config, "encoder_attention_heads", "?"),
            "encoder_layers": getattr(config, "encoder_layers", "?"),
            "decoder_layers": getattr(config, "decoder_layers", "?"), "d_ff": getattr(config, "encoder_ffn_dim", "?"),
            "dropout": getattr(config, "dropout", "?"),
            "norm": f"as {config.model_type}" if pre_layer_norm is None else "pre-LN" if pre_layer_norm else "post-LN"}


def _batch_summary(training_args) -> str:
    """'batch 128' (sentences per process), or 'batches of up to 4096 tokens' with --max_tokens_per_batch."""
    tokens = getattr(training_args, "max_tokens_per_batch", None)
    if tokens:
        return f"batches of up to {tokens} source and {tokens} target tokens"
    return f"batch {training_args.per_device_train_batch_size}"


def _render_card(output_dir, results, model, tokenizer, model_args, data_args, training_args, decoding):
    from .card import render_model_card

    config = model.config
    examples = results.get("examples") or [{"source": "Ein Mann fährt Fahrrad."}]
    card_values = {
        "model_name": training_args.hub_model_id or os.path.basename(os.path.abspath(output_dir)),
        "repo_id": training_args.hub_model_id or os.path.abspath(output_dir),
        "src_lang": data_args.source_lang, "tgt_lang": data_args.target_lang,
        "dataset_name": results["dataset_name"], "dataset_id": results["dataset_id"],
        "test_split": data_args.test_splits[0], "bleu": results["test_bleu"], "chrf": results["test_chrf"],
        "test_sets": [{"split": split, **scores} for split, scores in results["test_sets"].items()],
        "bleu_signature": results["bleu_signature"], "num_beams": decoding["num_beams"],
        "decoding": ", ".join([f"beam {decoding['num_beams']}", f"length penalty {decoding['length_penalty']:g}"]
                              + ([f"no repeated {decoding['no_repeat_ngram_size']}-gram"]
                                 if decoding["no_repeat_ngram_size"] else [])
                              + ([f"ending once {decoding['num_beams']} translations are finished"]
                                 if decoding["early_stopping"] is True and decoding["num_beams"] > 1 else [])
                              + (["renormalised after blocking"] if decoding["renormalize_logits"] else [])),
        **_architecture_values(config), "num_parameters": f"{count_parameters(model):,}",
        "architecture": type(model).__name__, "custom_code": bool(getattr(model, "_auto_class", None)),
        "vocab_size": len(tokenizer), "example_source": examples[0]["source"].replace('"', "'"),
        "training_summary": (
            f"{results.get('train_steps', '?')} steps of {_batch_summary(training_args)} "
            f"x {training_args.world_size} process(es), Adam (0.9, {training_args.adam_beta2}, "
            f"{training_args.adam_epsilon}), schedule: {_schedule_summary(training_args)}, "
            f"label smoothing {training_args.label_smoothing_factor}{_dropout_summary(results, config)}; "
            f"{results.get('train_minutes', 0):.1f} minutes of training in {training_args.precision} "
            f"({getattr(training_args, 'precision_reason', '')}). "
            + _weights_summary(results)
        ),
    }
    card = render_model_card(card_values, model_args.card_template)
    write_text(os.path.join(output_dir, "README.md"), str(card))


def run_translation(model_args: ModelArguments, data_args: DataTrainingArguments,
                    training_args: TranslationTrainingArguments) -> dict:
    """Train (or fine-tune), evaluate, test and document a translation model; returns the results dict.

    Writes into training_args.output_dir: the model (safetensors, config with auto_map, code files,
    generation_config.json), the tokenizer, all_results.json, generated_predictions.txt,
    training_curve.png and a README.md model card from hub_card.md; pushes the folder when
    --push_to_hub is given. Raises ValueError for bad arguments, data or checkpoints before
    anything is written, and while another run writes into the same output_dir (`lock_output_dir`);
    a run that fails leaves no empty output folder behind.
    """
    created = not os.path.exists(training_args.output_dir)
    lock = None
    try:
        if training_args.should_save:  # rank 0 under torchrun / accelerate; refused while another run writes there
            lock = lock_output_dir(training_args.output_dir)
        return _run_steps(model_args, data_args, training_args)
    except BaseException:
        output_dir = training_args.output_dir
        if created and training_args.should_save and os.path.isdir(output_dir) and \
                not any(files for _, _, files in os.walk(output_dir)):
            shutil.rmtree(output_dir, ignore_errors=True)  # only folders, no file: nothing of value
        raise
    finally:
        unlock_output_dir(lock)


def _run_steps(model_args, data_args, training_args) -> dict:
    _set_up_logging(training_args)
    finished = finished_run(training_args.output_dir) if training_args.do_train else None
    if finished is not None:
        return _finished_run(training_args, finished)
    resume_from = check_start(model_args, training_args)
    raw = load_data(data_args, training_args)
    tokenizer, model, decoding = build_tokenizer_and_model(model_args, data_args, training_args, raw, resume_from)
    budget = WallClockBudgetCallback(training_args.max_train_minutes) if training_args.max_train_minutes else None
    ema = moving_average_callback(model_args, training_args, resume_from)
    long_run = long_run_dropout_callback(model_args, training_args, model, budget)
    trainer, tokenized = build_trainer(model, tokenizer, raw, data_args, training_args, decoding, budget,
                                       extra_callbacks=[c for c in (ema, long_run) if c])

    label = _dataset_label(data_args)
    results = {"dataset_name": label, "dataset_id": label}
    if training_args.do_train:
        results.update(train(trainer, tokenized[data_args.train_split], resume_from, budget))
        if long_run:
            results.update(long_run.summary())
        results.update(average(trainer, model_args.average_last_checkpoints, ema))
    if training_args.do_eval:
        results.update(validate(trainer))
    results.update(finalise_decoding(trainer, decoding))
    if training_args.do_predict:
        results.update(test(trainer, tokenized, raw, tokenizer, data_args, decoding))
    results.update(write_outputs(trainer, results, model_args, data_args, decoding, push_to_hub=False))
    if training_args.do_train and trainer.is_world_process_zero():
        mark_finished(training_args.output_dir, results)  # written last: a rerun into this folder does nothing
    if training_args.push_to_hub and trainer.is_world_process_zero():
        from .hub import push_output_dir

        try:
            results["hub_commit"] = push_output_dir(training_args.output_dir, training_args.hub_model_id,
                                                    private=training_args.hub_private_repo)
        except RuntimeError as error:  # the Hub went away during the run: the finished folder is kept
            raise OSError(f"{error}; the run finished and {training_args.output_dir} is complete: the same command "
                          "again pushes it without training") from None
    return results


FINISHED_FILE = "run_finished.json"


def mark_finished(output_dir: str, results: dict) -> None:
    """Record that the training run into output_dir finished: FINISHED_FILE, written after every other output
    (model, card, results) and atomically, with the time, the steps and the test BLEU."""
    record = {"finished": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "train_steps": results.get("train_steps"),
              "test_bleu": results.get("test_bleu")}
    write_json(os.path.join(output_dir, FINISHED_FILE), record)


def finished_run(output_dir: str) -> dict | None:
    """What a finished training run into output_dir recorded, or None when none finished there.

    Finished: FINISHED_FILE is there (written last by `mark_finished`); or, for a folder written before it
    existed, a model.safetensors beside an all_results.json that holds num_parameters (written at the end of the
    run, by `write_outputs`)."""
    path = os.path.join(output_dir, FINISHED_FILE)
    if os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as handle:
                record = json.load(handle)
        except (OSError, ValueError):
            record = {}
        return record if isinstance(record, dict) else {}
    results = os.path.join(output_dir, "all_results.json")
    if os.path.isfile(results) and os.path.isfile(os.path.join(output_dir, "model.safetensors")):
        try:
            with open(results, encoding="utf-8") as handle:
                values = json.load(handle)
        except (OSError, ValueError):
            return None
        if isinstance(values, dict) and "num_parameters" in values:
            return {"finished": "(no date recorded)", "train_steps": values.get("train_steps"),
                    "test_bleu": values.get("test_bleu")}
    return None


def _finished_run(training_args, finished: dict) -> dict:
    """A training run into a folder whose run has finished: nothing is trained or written (with --push_to_hub
    the folder is pushed, the Hub checked first); says so, naming the folder."""
    output_dir = training_args.output_dir
    steps = finished.get("train_steps")
    print(f"output_dir {output_dir} holds a finished run (finished {finished.get('finished', '?')}"
          + (f", {steps} steps" if steps is not None else "") + "): nothing to do. To train further, fine-tune it "
          f"into a new folder (--model_name_or_path {output_dir} --output_dir NEW); to train again, choose another "
          "--output_dir or delete this one")
    results = {"finished": True, "output_dir": output_dir}
    if training_args.push_to_hub and training_args.should_save:
        from .hub import check_hub_access, push_output_dir

        check_hub_access(training_args.hub_model_id)
        results["hub_commit"] = push_output_dir(output_dir, training_args.hub_model_id,
                                                private=training_args.hub_private_repo)
    return results


def _weights_summary(results) -> str:
    """Which weights the model card's model holds, e.g. 'Weights: the last checkpoint.'"""
    if results.get("kept_weights") == "ema":
        return f"Weights: the exponential moving average of the weights (decay {results['ema_decay']:g} per step)."
    if results.get("averaged_checkpoints"):
        return f"Weights: the average of the last {results['averaged_checkpoints']} checkpoints (paper 6.1)."
    return "Weights: the last checkpoint."


def _dropout_summary(results, config) -> str:
    """', dropout 0.2 (long-run dropout 0.2 from 14 epochs, else 0.1: 17.5 epochs projected)' for the model card,
    or ''."""
    if "long_run_dropout" not in results:
        return ""
    epochs = results.get("projected_epochs")
    projected = "not projected" if epochs is None else f"{epochs:g} epochs projected"
    return (f", dropout {results['final_dropout']:g} (long-run dropout {results['long_run_dropout']:g} from "
            f"{results['long_run_min_epochs']:g} epochs, else {getattr(config, 'dropout', '?')}: {projected})")


def _schedule_summary(args) -> str:
    """The learning-rate schedule as run, e.g. 'linear on the 25-minute training-time budget, warm-up 0.3 of it'."""
    schedule = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)  # enum -> "linear"
    if args.max_train_minutes and args.schedule_on_budget:
        return (f"{schedule} on the {args.max_train_minutes:g}-minute training-time budget, warm-up "
                f"{args.warmup_steps:g} of it, peak learning rate {args.learning_rate:g}")
    warmup = f"{args.warmup_steps:g} warm-up steps" if args.warmup_steps >= 1 else \
        f"warm-up {args.warmup_steps:g} of the steps"
    return f"{schedule} over the steps, {warmup}, peak learning rate {args.learning_rate:g}"


def _set_up_logging(training_args) -> None:
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO,
                        handlers=[logging.StreamHandler(sys.stdout)])
    if not training_args.should_log:
        logging.getLogger().setLevel(logging.WARNING)
    transformers.utils.logging.set_verbosity_warning()
    set_seed(training_args.seed)
    if training_args.do_train:
        logger.info("precision: %s (%s)", training_args.precision, getattr(training_args, "precision_reason", ""))


def check_start(model_args, training_args) -> str | None:
    """Step 0: the Hub id, the output folder and the checkpoint to resume from, checked before any data is read.

    Returns the checkpoint to resume from (given, or the last complete one in output_dir), or None.
    """
    _check_writable(training_args.output_dir)
    if training_args.push_to_hub:
        from .hub import check_hub_access, check_repo_id

        check_repo_id(training_args.hub_model_id)
        check_hub_access(training_args.hub_model_id)  # token and endpoint, before hours of training
    _check_model_sources(model_args)
    resume_from = resume_checkpoint_in(training_args)
    if resume_from:
        check_resume_checkpoint(resume_from, needs_tokenizer=not (model_args.model_name_or_path
                                                                  or model_args.tokenizer_name))
    return resume_from


def _check_writable(output_dir: str) -> None:
    """output_dir (or, not made yet, the nearest folder above it, where it will be made) takes a file: a
    read-only folder or file system is refused now, not at the first checkpoint (`paths.unwritable_reason`).

    Raises:
        ValueError: naming --output_dir and why it cannot be written.
    """
    if os.path.isfile(output_dir):
        return  # resume_checkpoint_in says "is a file, not a folder"
    reason = unwritable_reason(output_dir)
    if reason:
        raise ValueError(f"output_dir {output_dir}: {reason}")


def _check_model_sources(model_args) -> None:
    """--model_name_or_path, --tokenizer_name and --config_name: a local path must exist and hold what it is
    named for (a Hub id is left to from_pretrained)."""
    sources = (("--model_name_or_path", model_args.model_name_or_path, "a trained model's folder or a Hub id"),
               ("--tokenizer_name", model_args.tokenizer_name, "a tokenizer's folder or a Hub id"),
               ("--config_name", model_args.config_name, "a config.json, its folder or a Hub id"))
    for flag, name, what in sources:
        if not name:
            continue
        path = os.path.expanduser(name)
        if not os.path.exists(path):
            if looks_like_local_path(name):
                raise ValueError(missing_path_message(flag, name, what))
            continue
        if flag == "--model_name_or_path":
            problem = os.path.isdir(path) and model_folder_problem(path, flag,
                                                                   needs_tokenizer=not model_args.tokenizer_name)
            if not os.path.isdir(path) or problem:
                raise ValueError(f"{flag} {name}: {problem or 'a file, not a model folder'}")
        elif flag == "--tokenizer_name" and not (os.path.isdir(path) and any(
                os.path.isfile(os.path.join(path, file)) for file in TOKENIZER_FILES)):
            raise ValueError(f"{flag} {name}: no tokenizer there (tokenizer.json / tokenizer_config.json)")
        elif flag == "--config_name" and os.path.isdir(path) and not os.path.isfile(os.path.join(path, "config.json")):
            raise ValueError(f"{flag} {name}: the folder holds no config.json")
    _check_tokenizer_fits(model_args)


def _check_tokenizer_fits(model_args, model=None, tokenizer=None) -> None:
    """--tokenizer_name with --model_name_or_path: the tokenizer must fit the model (`tokenizer_fit_problem`: its
    size, special ids and, when the model's folder holds the tokenizer it was trained with, its vocabulary).
    Checked before any data is read for local folders (their config and tokenizers only), and again on the
    loaded model and tokenizer (a Hub id).

    Raises:
        ValueError: naming --tokenizer_name, --model_name_or_path and what differs.
    """
    from .tokenization import tokenizer_fit_problem

    name, tokenizer_name = model_args.model_name_or_path, model_args.tokenizer_name
    if not (name and tokenizer_name):
        return
    folder = os.path.expanduser(name)
    own = None
    if os.path.isdir(folder) and any(os.path.isfile(os.path.join(folder, file)) for file in TOKENIZER_FILES):
        own = AutoTokenizer.from_pretrained(folder, trust_remote_code=model_args.trust_remote_code)
    if model is not None:
        config = model.config
    elif os.path.isdir(folder) and os.path.isdir(os.path.expanduser(tokenizer_name)):
        with open(os.path.join(folder, "config.json"), encoding="utf-8") as handle:
            config = json.load(handle)
    else:
        return  # a Hub id: checked once loaded
    if tokenizer is None:
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_name, trust_remote_code=model_args.trust_remote_code)
    problem = tokenizer_fit_problem(config, tokenizer, own)
    if problem:
        raise ValueError(f"--tokenizer_name {tokenizer_name} does not fit --model_name_or_path {name}: {problem}. "
                         f"Leave out --tokenizer_name to fine-tune with the model's own tokenizer")


def load_data(data_args, training_args):
    """Step 1: the splits this run needs (training, validation, test), as a DatasetDict of raw text."""
    wanted = [(data_args.train_split, training_args.do_train),
              (data_args.validation_split, training_args.do_eval or training_args.do_train)]
    wanted += [(split, training_args.do_predict) for split in data_args.test_splits]
    splits = list(dict.fromkeys(split for split, needed in wanted if needed))
    data_files = {name: path for name, path in ((data_args.train_split, data_args.train_file),
                                                (data_args.validation_split, data_args.validation_file),
                                                (data_args.test_splits[0], data_args.test_file)) if path}
    caps = {split: data_args.max_predict_samples for split in data_args.test_splits}
    caps.update({data_args.train_split: data_args.max_train_samples,
                 data_args.validation_split: data_args.max_eval_samples})
    if data_files and training_args.do_train and data_args.train_split not in data_files:
        raise ValueError("training needs --train_file (the data come as files: --validation_file/--test_file were "
                         "given), or pass --do_train false to evaluate a model")
    to_load = [split for split in splits if not data_files or split in data_files]
    raw = load_translation_dataset(
        data_args.dataset_name, data_args.source_lang, data_args.target_lang, splits=to_load,
        dataset_config_name=data_args.dataset_config_name, data_files=data_files or None,
        max_samples={k: v for k, v in caps.items() if v and k in to_load},  # e.g. no test cap without do_predict
    )
    for split in splits:
        if split not in raw:
            raise ValueError(f"split {split!r} not found; found {sorted(raw)}")
    return raw


def build_tokenizer_and_model(model_args, data_args, training_args, raw, resume_from):
    """Step 2: tokenizer, model (new, or the checkpoint to fine-tune) and the final test's decoding.

    Validation during training stays plain greedy; the n-gram block joins the generation config for the
    final test and the saved model (`finalise_decoding`).
    """
    tokenizer = _build_tokenizer(model_args, data_args, raw, training_args,
                                 resume_from=None if model_args.model_name_or_path else resume_from)
    model = _build_model(model_args, tokenizer)
    positions = getattr(model.config, "max_position_embeddings", None)
    longest = max(data_args.max_source_length, data_args.max_target_length)
    if positions is not None and positions < longest:
        raise ValueError(f"the model has {positions} positions (max_position_embeddings) but --max_source_length / "
                         f"--max_target_length allow {longest} tokens: raise it in the config or lower the lengths")
    if resume_from:
        check_resume_checkpoint(resume_from, model)
    decoding = _resolve_decoding(model_args, data_args, model)
    model.generation_config.update(num_beams=decoding["num_beams"], max_length=data_args.max_target_length,
                                   length_penalty=decoding["length_penalty"], no_repeat_ngram_size=0,
                                   early_stopping=decoding["early_stopping"],
                                   renormalize_logits=decoding["renormalize_logits"],
                                   decoder_start_token_id=model.config.decoder_start_token_id,
                                   pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                   bos_token_id=tokenizer.bos_token_id)
    logger.info("model: %s parameters; %s", f"{count_parameters(model):,}", model.config.to_diff_dict())
    return tokenizer, model, decoding


def _trainer_arguments(training_args, model, data_args):
    """A copy of training_args with what the Trainer reads derived from the rest: no push (the job pushes
    once, at the end), the peak learning rate from --noam_factor (paper eq. 3), and greedy validation of
    at most max_target_length tokens unless generation_num_beams / generation_max_length say otherwise."""
    args = copy.copy(training_args)
    args.push_to_hub = False
    if args.noam_factor is not None:
        args.learning_rate = noam_peak_learning_rate(model.config.d_model, int(args.warmup_steps), args.noam_factor)
    if args.generation_max_length is None:
        args.generation_max_length = data_args.max_target_length
    if args.generation_num_beams is None:
        args.generation_num_beams = 1  # periodic validation is greedy; the final test uses the decoding's beams
    return args


def moving_average_callback(model_args, training_args, resume_from) -> ExponentialMovingAverageCallback | None:
    """The moving average of the weights that --ema_decay asks for (training runs only), or None."""
    if not model_args.ema_decay or not training_args.do_train:
        return None
    if training_args.fsdp:
        logger.warning("--ema_decay is ignored under FSDP (the model's weights are sharded)")
        return None
    return ExponentialMovingAverageCallback(model_args.ema_decay, resume_from)


def long_run_dropout_callback(model_args, training_args, model, budget) -> LongRunDropoutCallback | None:
    """The dropout that --long_run_dropout sets for a long run (training runs only), or None.

    Raises:
        ValueError: the model has no nn.Dropout modules at its config's dropout (e.g. transformers' Marian).
    """
    if not model_args.long_run_dropout or not training_args.do_train:
        return None
    return LongRunDropoutCallback(model, model_args.long_run_dropout, model_args.long_run_min_epochs, budget)


def build_trainer(model, tokenizer, raw, data_args, training_args, decoding, budget, tokenized=None,
                  extra_callbacks=None):
    """Step 2b: tokenised splits (`_tokenize`, unless given) and the Trainer; returns (trainer, tokenized splits)."""
    if tokenized is None:
        tokenized = _tokenize(raw, tokenizer, data_args, training_args)
    trainer = TranslationTrainer(
        model=model, args=_trainer_arguments(training_args, model, data_args), processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
        train_dataset=tokenized.get(data_args.train_split) if training_args.do_train else None,
        eval_dataset=tokenized.get(data_args.validation_split), compute_metrics=make_compute_metrics(tokenizer),
        callbacks=([budget] if budget else []) + list(extra_callbacks or []),
    )
    return trainer, tokenized


def train(trainer, train_dataset, resume_from, budget) -> dict:
    """Step 3: train (resuming when a checkpoint is given) and save the model, its metrics and state."""
    remove_incomplete_checkpoints(trainer.args)
    start = time.perf_counter()
    train_result = trainer.train(resume_from_checkpoint=resume_from)
    wall = time.perf_counter() - start
    trainer.save_model()  # model, config, code, generation config, tokenizer
    metrics = dict(train_result.metrics, train_samples=len(train_dataset), train_wall_minutes=round(wall / 60, 2))
    if budget is not None:
        metrics["train_minutes_excluding_eval"] = round(budget.training_seconds / 60, 2)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return {"train_steps": trainer.state.global_step,
            "train_minutes": budget.training_seconds / 60 if budget else wall / 60}


def average(trainer, last_n: int, ema: ExponentialMovingAverageCallback | None = None) -> dict:
    """Step 4: weight averaging. The last checkpoint, the mean of the last `last_n` checkpoints (paper 6.1) and,
    with --ema_decay, the moving average of the weights are scored on the validation set (greedy BLEU); the
    best is kept; on a tie the average, then the last checkpoint (the average is kept if its BLEU is at least
    the last's, as without the moving average).

    Every process takes the same decision: they list the checkpoints once the main process has finished
    rotating them, and evaluate() gathers the predictions, so that all compute the same BLEU.
    Returns {"averaged_checkpoints": N (0 when not kept), "kept_weights": "last" | "average" | "ema"} (empty
    when there was nothing to compare).
    """
    trainer.accelerator.wait_for_everyone()
    checkpoints = sorted_checkpoints(trainer.args.output_dir)[-last_n:] if last_n > 1 else []
    if checkpoints and trainer.is_fsdp_enabled:
        logger.warning("checkpoint averaging is skipped under FSDP (the model's weights are sharded)")
        checkpoints = []
    checkpoints = checkpoints if len(checkpoints) >= 2 else []
    if not checkpoints and ema is None:
        return {}
    model = trainer.model
    scores = {"last": trainer.evaluate(metric_key_prefix="eval_last")["eval_last_bleu"]}
    states = {"last": {k: v.clone() for k, v in model.state_dict().items()}}
    if checkpoints:
        model.load_state_dict(average_checkpoints(checkpoints), strict=False)
        scores["average"] = trainer.evaluate(metric_key_prefix="eval_averaged")["eval_averaged_bleu"]
        states["average"] = {k: v.clone() for k, v in model.state_dict().items()}
    if ema is not None:
        ema.load_into(model)
        scores["ema"] = trainer.evaluate(metric_key_prefix="eval_ema")["eval_ema_bleu"]
        states["ema"] = None  # in the model now
    preference = ["average", "last", "ema"]  # on a tie (the average as before, "at least the last's BLEU")
    kept = max(scores, key=lambda name: (scores[name], -preference.index(name)))
    if states[kept] is not None:
        model.load_state_dict(states[kept])
    if kept != "last":
        trainer.save_model()
    logger.info("validation BLEU: %s -> keeping %s", ", ".join(
        f"{'average of %d' % len(checkpoints) if name == 'average' else name} {bleu:.2f}"
        for name, bleu in scores.items()), kept)
    averaged = len(checkpoints) if kept == "average" else 0
    metrics = {"last_checkpoint_bleu": scores["last"], "averaged_checkpoints": averaged, "kept_weights": kept}
    if "average" in scores:
        metrics["averaged_bleu"] = scores["average"]
    if "ema" in scores:
        metrics.update(ema_bleu=scores["ema"], ema_decay=ema.decay)
    trainer.save_metrics("averaging", metrics)
    return {"averaged_checkpoints": averaged, "kept_weights": kept, **({"ema_decay": ema.decay} if kept == "ema"
                                                                       else {})}


def validate(trainer) -> dict:
    """Step 5: validation BLEU/chrF of the kept weights (greedy, as during training)."""
    metrics = trainer.evaluate(metric_key_prefix="eval")
    trainer.log_metrics("eval", metrics)
    trainer.save_metrics("eval", metrics)
    return {}


def finalise_decoding(trainer, decoding) -> dict:
    """Step 6a: the n-gram block joins the generation config; a trained model's saved one gets it too."""
    if decoding["no_repeat_ngram_size"]:
        trainer.model.generation_config.update(no_repeat_ngram_size=decoding["no_repeat_ngram_size"])
        if trainer.args.do_train and trainer.is_world_process_zero():
            trainer.model.generation_config.save_pretrained(trainer.args.output_dir)
    return {}


def test(trainer, tokenized, raw, tokenizer, data_args, decoding) -> dict:
    """Step 6: translate each test split with the final decoding and score the detokenised output against the
    raw references (sacreBLEU). The first split is the headline (test_bleu, generated_predictions.txt); each
    further one writes generated_predictions_{split}.txt. All in dataset order; every split's figures, and
    how many outputs repeat one token 4 or more times in a row (a looping rare word), go to all_results.json.

    The test decodes the saved fp32 weights as users will (translate.py, pipeline): without the bf16/fp16
    autocast that accelerate wraps around forward for training and validation.
    """
    trainer.accelerator.unwrap_model(trainer.model, keep_fp32_wrapper=False)
    metrics, test_sets = {}, {}
    for index, split in enumerate(data_args.test_splits):
        prediction = trainer.predict(tokenized[split], metric_key_prefix="test",
                                     max_length=data_args.max_target_length, **decoding)
        if not trainer.is_world_process_zero():
            continue
        hypotheses = decode_ids(tokenizer, prediction.predictions)
        references = list(raw[split][data_args.target_lang])
        scores = corpus_scores(hypotheses, references)
        test_sets[split] = {"bleu": scores["bleu"], "chrf": scores["chrf"], "sentences": len(hypotheses),
                            "repeated_token_outputs": count_repeated_token_outputs(prediction.predictions,
                                                                                   tokenizer.all_special_ids)}
        print(f"{split}: test BLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  ({len(hypotheses)} sentences, "
              f"beam {decoding['num_beams']})")
        name = "generated_predictions.txt" if index == 0 else f"generated_predictions_{split}.txt"
        write_text(os.path.join(trainer.args.output_dir, name), "\n".join(hypotheses) + "\n")
        if index == 0:
            headline = {"scores": scores, "examples": [
                {"source": s, "reference": r, "prediction": h}
                for s, r, h in zip(raw[split][data_args.source_lang][:3], references[:3], hypotheses[:3])]}
            metrics = {k: v for k, v in prediction.metrics.items() if not k.endswith(("_bleu", "_chrf", "_sentences"))}
            metrics.update(test_bleu=scores["bleu"], test_chrf=scores["chrf"], test_samples=len(hypotheses),
                           test_num_beams=decoding["num_beams"])
    if not trainer.is_world_process_zero():
        return {}
    print(f"sacreBLEU signature: {headline['scores']['bleu_signature']}")
    metrics["test_sets"] = test_sets
    trainer.log_metrics("test", {k: v for k, v in metrics.items() if k != "test_sets"})
    trainer.save_metrics("test", metrics)
    scores = headline["scores"]
    return {"test_bleu": scores["bleu"], "test_chrf": scores["chrf"], "bleu_signature": scores["bleu_signature"],
            "examples": headline["examples"], "test_sets": test_sets}


def write_outputs(trainer, results, model_args, data_args, decoding, push_to_hub: bool) -> dict:
    """Step 7 (main process): training curve, all_results.json with the parameter count, the model card
    (only beside the weights it describes) and the push to the Hub."""
    if not trainer.is_world_process_zero():
        return {}
    output_dir, model, args = trainer.args.output_dir, trainer.model, trainer.args
    if args.do_train:  # an evaluation-only run has no curve to draw (it once replaced the run's with one point)
        plot_training_curve(trainer.state.log_history, os.path.join(output_dir, "training_curve.png"))
    with open(os.path.join(output_dir, "all_results.json"), encoding="utf-8") as handle:
        all_results = json.load(handle)
    all_results["num_parameters"] = count_parameters(model)
    all_results["num_parameters_with_frozen"] = count_parameters(model, trainable_only=False)  # e.g. Marian's sinusoids
    if args.do_train:
        all_results.update(precision=args.precision, precision_reason=getattr(args, "precision_reason", ""),
                           lr_schedule=_schedule_summary(args))
        all_results.update({key: results[key] for key in ("final_dropout", "long_run_dropout",
                                                               "long_run_min_epochs", "projected_epochs")
                            if key in results})
    write_json(os.path.join(output_dir, "all_results.json"), all_results)
    outputs = {"all_results": all_results}
    if "test_bleu" in results and os.path.isfile(os.path.join(output_dir, "model.safetensors")):
        _render_card(output_dir, results, model, trainer.processing_class, model_args, data_args, args, decoding)
    if push_to_hub:
        from .hub import push_output_dir

        outputs["hub_commit"] = push_output_dir(output_dir, args.hub_model_id, private=args.hub_private_repo)
    return outputs


