"""Local path or Hub id: one rule for every name a user gives (a model, tokenizer, config or dataset), and what
a folder lacks to be a trained model. A name read as a local path that does not exist fails at once, naming
the argument, instead of becoming a Hub request (network retries, then a traceback about huggingface.co)."""

import json
import os

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def local_parent(name: str) -> str | None:
    """For `owner/name`: `owner` when a local folder of that name exists here (`outputs/run`), else None."""
    parent = name.split("/")[0] if name.count("/") == 1 else ""
    return parent if parent and os.path.isdir(os.path.expanduser(parent)) else None


def looks_like_local_path(name: str) -> bool:
    """A name read as a local path, never as a Hub id: absolute, ./ ../ ~, more than one '/', a backslash,
    not a valid repo id, or 'a/b' where the folder 'a' exists here (outputs/multi30k_de_en)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    if local_parent(name):
        return True
    try:
        validate_repo_id(name)
    except HFValidationError:
        return True
    return False


def missing_path_message(flag: str, name: str, what: str = "a trained model's folder or a Hub id") -> str:
    """The refusal for a local-looking `name` given to `flag` that does not exist (says why it is read as a path)."""
    parent = local_parent(name)
    why = f"; {parent}/ exists here, so this names a folder in it" if parent else ""
    return f"{flag} {name}: no such folder (give {what}{why})"


def is_complete_safetensors(path: str) -> bool:
    """True when a .safetensors file is whole: its JSON header parses and the file holds every byte the
    header indexes (a file cut short by a crash fails this; the tensors themselves are not read)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            header_size = int.from_bytes(handle.read(8), "little")
            if header_size <= 0 or 8 + header_size > size:
                return False
            header = json.loads(handle.read(header_size))
        end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return False
    return size >= 8 + header_size + end


def model_folder_problem(folder: str, flag: str = "--model", needs_tokenizer: bool = True) -> str | None:
    """Why `folder` is not a trained model's folder, or None when it holds config, weights and (if asked)
    tokenizer files; names the newest checkpoint-N inside it when there is one, and a model.safetensors that is
    cut short or corrupt (its header is read, not the tensors)."""
    missing = []
    if not os.path.isfile(os.path.join(folder, "config.json")):
        missing.append("config.json")
    if not any(os.path.isfile(os.path.join(folder, name)) for name in WEIGHT_FILES):
        missing.append("weights (model.safetensors)")
    if needs_tokenizer and not any(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES):
        missing.append("tokenizer files (tokenizer.json / tokenizer_config.json)")
    if not missing:
        weights = os.path.join(folder, "model.safetensors")
        if os.path.isfile(weights) and not is_complete_safetensors(weights):
            return ("its model.safetensors is truncated or corrupt (the header or the data it indexes do not "
                    "parse); copy the folder again, or train again")
        return None
    problem = f"the folder holds no trained model (no {', no '.join(missing)})"
    checkpoints = sorted((name for name in os.listdir(folder) if name.startswith("checkpoint-")),
                         key=lambda name: int(name.split("-")[-1]) if name.split("-")[-1].isdigit() else -1)
    if checkpoints:
        problem += f"; its checkpoints do, e.g. {flag} {os.path.join(folder, checkpoints[-1])}"
    return problem + "; give the output folder of scripts/train_translation.py"


def unwritable_reason(path: str) -> str | None:
    """Why `path` (a folder or file to be written, existing or not) cannot be written, or None when it can: the
    nearest existing folder at or above it must take a new file (an empty temporary file is made and removed)
    and an existing file must open for writing (it is not changed). Catches a read-only folder or file system
    before the work whose result would be written there."""
    import tempfile

    target = os.path.abspath(os.path.expanduser(path))
    folder = target
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    if folder != target and not os.path.isdir(folder):
        return f"{folder} is a file"
    try:
        if os.path.isfile(target):
            with open(target, "r+b"):
                return None
        handle, probe = tempfile.mkstemp(prefix=".write-check-", dir=folder)
        os.close(handle)
        os.remove(probe)
    except OSError as error:
        where = "" if folder == target else f" (in {folder})"
        return f"cannot write there{where}: {error.strerror or error}"
    return None


def one_line_errors(parser):
    """Make `parser.error(message)` print only `<prog>: error: <message>` and exit 2 (argparse prints its usage block
    first): a refused input reads as one line naming it, as the training script's refusals do. Returns the parser."""
    import sys

    def error(message: str):
        sys.stderr.write(f"{parser.prog}: error: {message}\n")
        raise SystemExit(2)

    parser.error = error
    return parser
