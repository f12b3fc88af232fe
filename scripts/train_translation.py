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


CONFIG_SUFFIXES = (".json", ".yaml", ".yml")


def parse_args(argv=None):
    """Flags, or a .json / .yaml file of them followed by flags that win over it (`config.json --max_train_minutes
    12.5`).

    Raises:
        ValueError: a config file that is missing, not a JSON / YAML mapping, or names an unknown argument; a first
            argument naming an existing file of another kind (`cfg.toml`), refused by name.
    """
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TranslationTrainingArguments))
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-") and not argv[0].lower().endswith(CONFIG_SUFFIXES):
        if os.path.isfile(argv[0]) or "." in os.path.basename(argv[0]):
            raise ValueError(f"{argv[0]}: a config file must be .json or .yaml (a mapping of argument names to "
                             "values, as configs/multi30k_de_en.json)")
    if argv and argv[0].lower().endswith(CONFIG_SUFFIXES):
        path, argv = argv[0], argv[1:]
        yaml_file = not path.lower().endswith(".json")
        kind = "YAML" if yaml_file else "JSON"
        try:
            with open(path, encoding="utf-8") as handle:
                if yaml_file:
                    import yaml

                    values = yaml.safe_load(handle)
                else:
                    values = json.load(handle)
        except FileNotFoundError:
            raise ValueError(f"{path}: no such config file") from None
        except IsADirectoryError:
            raise ValueError(f"{path}: a folder, not a config file") from None
        except (UnicodeDecodeError, ValueError) as error:  # JSONDecodeError and yaml.YAMLError's subclasses
            raise ValueError(f"{path}: not valid {kind} ({' '.join(str(error).split())})") from None
        except Exception as error:  # yaml.YAMLError is not a ValueError
            if type(error).__module__.startswith("yaml"):
                raise ValueError(f"{path}: not valid {kind} ({' '.join(str(error).split())})") from None
            raise
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a {kind} mapping of argument names and values")
        actions = {action.dest: action for action in parser._actions}
        unknown = sorted(set(values) - set(actions))
        if unknown:
            raise ValueError(f"{path}: unknown argument(s) {', '.join(unknown)}")
        switches = {action.dest for action in parser._actions if action.nargs in ("?", 0)}  # true/false flags
        for key, value in values.items():  # YAML reads `save_strategy: no` as false: the word it was, for a text flag
            if isinstance(value, bool) and key not in switches:
                values[key] = "no" if value is False else "yes"
        parser.set_defaults(**values)  # the file's values become defaults: flags given after it win
    return parser.parse_args_into_dataclasses(args=argv)


# the output folder of the run under way, for the one line printed on Ctrl-C or a full disk (`kept`)
RUN = {}


def kept() -> str:
    """What an interrupted run (Ctrl-C, a full disk) kept in its output folder, and how to resume."""
    from scratch_transformer.checkpoints import last_complete_checkpoint

    output_dir = RUN.get("output_dir")
    if not output_dir or not os.path.isdir(output_dir):
        return "nothing was written"
    last = last_complete_checkpoint(output_dir)
    if last is None:
        return f"{output_dir} holds no complete checkpoint yet: the same command starts the run again"
    return (f"{output_dir} keeps {os.path.basename(last)}, the last complete checkpoint (a half-written one is "
            "removed on resume): the same command resumes from it")


def main(argv=None) -> dict:
    model_args, data_args, training_args = parse_args(argv)
    RUN["output_dir"] = training_args.output_dir
    try:
        return run_translation(model_args, data_args, training_args)
    finally:
        # Under torchrun / accelerate, tear the process group down before the interpreter exits: left to
        # shutdown, a gloo rank can abort ("terminate called without an active exception") after all its work.
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


if __name__ == "__main__":
    from scratch_transformer.paths import run_main

    try:
        run_main(main, "train_translation.py", kept)
    except (ValueError, OSError) as error:  # bad arguments, data, checkpoints or Hub ids: refused before training
        if os.environ.get("SCRATCH_TRANSFORMER_TRACEBACK"):  # set to see where it was raised
            raise
        sys.exit(f"train_translation.py: error: {error}")
