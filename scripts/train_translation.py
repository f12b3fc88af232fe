"""Train a translation model with the HF Seq2SeqTrainer: data, tokenizer, training, BLEU, model card.

Examples:
    # the main job: German -> English on Multi30k (about 25 minutes of training on 2 CPU cores)
    python scripts/train_translation.py configs/multi30k_de_en.json

    # the same config with flags that win over it
    python scripts/train_translation.py configs/multi30k_de_en.json --max_train_minutes 12.5 --output_dir outputs/half

    # the same with flags, on your own folder of {split}.{lang}[.gz] files or a Hub dataset id
    python scripts/train_translation.py --dataset_name path/to/multi30k/raw --source_lang de --target_lang en \
        --validation_split val --test_split test_2016_flickr --output_dir outputs/my_run \
        --config_overrides d_model=256,num_heads=4,encoder_layers=3,decoder_layers=3,d_ff=1024

    # fine-tune a trained checkpoint (its tokenizer is kept)
    python scripts/train_translation.py --model_name_or_path outputs/multi30k_de_en --dataset_name ... \
        --output_dir outputs/finetuned
"""

import json
import os
import sys

import torch
from transformers import HfArgumentParser

from scratch_transformer.arguments import DataTrainingArguments, ModelArguments, TranslationTrainingArguments
from scratch_transformer.translation import run_translation


def parse_args(argv=None):
    """Flags, or a .json file of them followed by flags that win over it (`config.json --max_train_minutes 12.5`).

    Raises:
        ValueError: a .json file that is missing, not a JSON object, or names an unknown argument.
    """
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TranslationTrainingArguments))
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0].endswith(".json"):
        path, argv = argv[0], argv[1:]
        try:
            with open(path, encoding="utf-8") as handle:
                values = json.load(handle)
        except FileNotFoundError:
            raise ValueError(f"{path}: no such config file") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ValueError(f"{path}: not valid JSON ({error})") from None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a JSON object of argument names and values")
        known = {action.dest for action in parser._actions}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"{path}: unknown argument(s) {', '.join(unknown)}")
        parser.set_defaults(**values)  # the file's values become defaults: flags given after it win
    return parser.parse_args_into_dataclasses(args=argv)


def main(argv=None) -> dict:
    model_args, data_args, training_args = parse_args(argv)
    try:
        return run_translation(model_args, data_args, training_args)
    finally:
        # Under torchrun / accelerate, tear the process group down before the interpreter exits: left to
        # shutdown, a gloo rank can abort ("terminate called without an active exception") after all its work.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as error:  # bad arguments, data, checkpoints or Hub ids: refused before training
        if os.environ.get("SCRATCH_TRANSFORMER_TRACEBACK"):  # set to see where it was raised
            raise
        sys.exit(f"train_translation.py: error: {error}")
