"""Local path or Hub id: one rule for every name a user gives (a model, tokenizer, config or dataset), and what
a folder lacks to be a trained model. A name read as a local path that does not exist fails at once, naming
the argument, instead of becoming a Hub request (network retries, then a traceback about huggingface.co)."""

import json
import os

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
# The folder this project's training writes into (configs/*.json: output_dir outputs/...; gitignored): a name in
# it is a local path even before the folder exists, so a model not yet trained is not looked for on the Hub.
OUTPUT_FOLDER = "outputs"


def local_parent(name: str) -> str | None:
    """For `owner/name`: `owner` when a local folder of that name exists here (`outputs/run`), else None."""
    parent = name.split("/")[0] if name.count("/") == 1 else ""
    return parent if parent and os.path.isdir(os.path.expanduser(parent)) else None


def looks_like_local_path(name: str) -> bool:
    """A name read as a local path, never as a Hub id: absolute, ./ ../ ~, more than one '/', a backslash,
    not a valid repo id, 'a/b' where the folder 'a' exists here, or 'outputs/b' (`OUTPUT_FOLDER`, where the
    training writes: outputs/multi30k_de_en), whether or not outputs/ exists yet."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") > 1 or "\\" in name:
        return True
    if local_parent(name) or (name.count("/") == 1 and name.split("/")[0] == OUTPUT_FOLDER):
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


def train_first_hint(name: str) -> str:
    """The command that makes the model folder `name`: the walk-through for its folder
    (docs/walkthrough_pictures/model), the shipped config whose output_dir is `name`
    (outputs/multi30k_de_en: configs/multi30k_de_en.json), else the main job's config with --output_dir `name`."""
    import glob

    normal = os.path.normpath(os.path.expanduser(name))
    if normal.replace(os.sep, "/").endswith("walkthrough_pictures/model"):
        return "python docs/walkthrough.py"
    configs = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
    for path in sorted(glob.glob(os.path.join(configs, "*.json"))):
        try:
            with open(path, encoding="utf-8") as handle:
                output_dir = json.load(handle).get("output_dir")
        except (OSError, ValueError, AttributeError):
            continue
        if output_dir and os.path.normpath(output_dir) == normal:
            return f"python scripts/train_translation.py configs/{os.path.basename(path)}"
    return f"python scripts/train_translation.py configs/multi30k_de_en.json --output_dir {name}"


def missing_model_message(name: str) -> str:
    """Why a local-looking model name that does not exist cannot be loaded, after the flag: 'no such folder (train
    it first: <command>; or give a Hub id)', the command from `train_first_hint`."""
    parent = local_parent(name)
    why = f"; {parent}/ exists here, so this names a folder in it" if parent else ""
    return f"no such folder (train it first: {train_first_hint(name)}; or give a Hub id{why})"


def space_model_problem(model: str) -> str | None:
    """Why `model` cannot be what a Hugging Face Space loads (demo.py --write_space), or None for a Hub id: a local
    folder or path exists only on this machine."""
    if os.path.exists(os.path.expanduser(model)) or looks_like_local_path(model):
        return (f"--model {model} is a local folder, which will not exist on the Space: push the model to the Hub "
                f"first (hf upload USER/NAME {model}) and give that Hub id as --model")
    return None


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


# ------------------------------------------------------------------------------------------------ reading lines


def split_lines(text: str) -> list[str]:
    """The lines of `text`: one line is what ends in "\\n" (or "\\r\\n"), the last one may lack it; nothing else
    ends a line. The rule of every reader of one-sentence-per-line files: translate.py and the export's --check_file
    call this; the training data's folder of {split}.{lang} files streams them by the same rule
    (data._decoded_lines, line by line for large .gz files). `str.splitlines()` also breaks at U+2028/U+2029, \\x0b,
    \\x0c, \\x1c-\\x1e, \\x85 and a lone \\r, which misaligns a file with its translation. A trailing newline adds
    no empty line; "" gives []."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def text_file_kind(data: bytes) -> str | None:
    """What a file that is not UTF-8 text evidently is, from its first bytes: 'gzip-compressed', 'UTF-16 text',
    'UTF-32 text', or None (no telltale bytes; e.g. latin-1 text)."""
    if data[:2] == b"\x1f\x8b":
        return "gzip-compressed"
    if data[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff"):
        return "UTF-32 text"
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):
        return "UTF-16 text"
    sample = data[:200]
    if len(sample) >= 4 and sample[1::2].count(0) > len(sample) // 4 and sample[0::2].count(0) == 0:
        return "UTF-16 text (little-endian, no byte-order mark)"  # every other byte 0 (ASCII letters)
    if len(sample) >= 4 and sample[0::2].count(0) > len(sample) // 4 and sample[1::2].count(0) == 0:
        return "UTF-16 text (big-endian, no byte-order mark)"
    return None


def read_lines(path: str) -> list[str]:
    """The lines (`split_lines`) of the UTF-8 text file `path`, a leading byte-order mark dropped.

    Raises:
        ValueError: one line naming the file and what it is when it is not UTF-8 text (gzip, UTF-16, latin-1:
            `not_utf8_message`), or a NUL byte (binary data); OSError when it cannot be read.
    """
    with open(path, "rb") as handle:
        data = handle.read()
    return decode_lines(data, path)


def decode_lines(data: bytes, name: str) -> list[str]:
    """The lines (`split_lines`) of UTF-8 text `data` read from `name` (a file, or "stdin"), a leading byte-order
    mark dropped. Raises ValueError as `read_lines` does, naming `name`."""
    path = name
    if text_file_kind(data):
        raise ValueError(not_utf8_message(path, data, None))
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValueError(not_utf8_message(path, data, error)) from None
    if "\0" in text:
        raise ValueError(f"{path}: binary data (a NUL byte at offset {data.index(0)}), not text")
    return split_lines(text)


def not_utf8_message(path: str, data: bytes, error: UnicodeDecodeError) -> str:
    """The one line for a file that is not UTF-8: what it is when its bytes tell (gzip, UTF-16), with the command
    that converts it; else the first bad byte and the latin-1 conversion."""
    kind = text_file_kind(data)
    piped = path == "stdin"  # the conversion goes into the pipe, not onto a file
    if kind == "gzip-compressed":
        how = "add gunzip -c to the pipe" if piped else f"gunzip -c {path} > {path}.txt"
        return f"{path}: gzip-compressed, not text; decompress it first ({how})"
    if kind:
        source = "utf-16" if kind.startswith("UTF-16") else "utf-32"
        if "endian" in kind:  # without a byte-order mark iconv reads utf-16 as big-endian: name the order
            source += "le" if "little" in kind else "be"
        how = f"iconv -f {source} -t utf-8" + (" in the pipe" if piped else f" {path} > {path}.utf8")
        return f"{path}: {kind}, not UTF-8; convert it: {how}"
    return (f"{path}: not UTF-8 text (byte {error.start}: {error.object[error.start:error.start + 1]!r}); "
            "convert it, e.g. iconv -f latin1 -t utf-8")


# ------------------------------------------------------------------------------------------------ writing files
#
# The rules every tool follows when it writes a file:
# * only files it owns: never its own input, never a file of a model folder (config.json, the weights, the
#   tokenizer, the code, a CTranslate2 export's files), and no other existing file without --force, unless the
#   file carries the tool's own mark (pictures: `figure_metadata`);
# * to a temporary file beside the target, renamed into place once complete (`atomic_write`): a failure, a full
#   disk or Ctrl-C leaves the earlier file whole and no partial file;
# * an interruption or a full disk ends with one line saying what was kept (`run_main`), no traceback.

MODEL_FILE_PATTERNS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                       "special_tokens_map.json", "added_tokens.json", "vocab.json", "merges.txt", "*.model",
                       "*.safetensors", "*.safetensors.index.json", "*.bin", "*.bin.index.json", "*.py", "*.pt",
                       "*.pth", "shared_vocabulary.*", "source_vocabulary.*", "target_vocabulary.*",
                       "scratch_transformer_ctranslate2.json", "trainer_state.json", "run_finished.json")
# what a training run wrote beside its model: replaced only by the training script itself (an evaluation-only run
# into the folder says which), never by another tool's output, even with --force
RUN_FILE_PATTERNS = ("training_curve.png", "*_results.json", "generated_predictions*.txt", "README.md")
MARK = "scratch_transformer"


def model_folder_kind(folder: str) -> str | None:
    """'a model' (config.json and weights), 'a CTranslate2 export' (config.json and model.bin) or None."""
    if not os.path.isfile(os.path.join(folder, "config.json")):
        return None
    if os.path.isfile(os.path.join(folder, "model.bin")):
        return "a CTranslate2 export"
    if any(os.path.isfile(os.path.join(folder, name)) for name in WEIGHT_FILES):
        return "a model"
    return None


def _made_by(path: str, tool: str | None) -> bool:
    """True when the file at `path` carries `tool`'s mark (written by `figure_metadata`)."""
    if not tool:
        return False
    try:
        with open(path, "rb") as handle:
            return f"{MARK} {tool}".encode() in handle.read(20_000_000)
    except OSError:
        return False


def output_problem(path: str, inputs=(), force: bool = False, tool: str | None = None) -> str | None:
    """Why a tool must not write the file `path`, or None when it may; checked before any work.

    Refused: a folder; a missing folder; one of `inputs` (the tool's own input files); a file of a model folder
    (`MODEL_FILE_PATTERNS` in a folder `model_folder_kind` recognises), or an existing result of the run beside the
    model (`RUN_FILE_PATTERNS`: its training curve, *_results.json, predictions, model card), even with `force`;
    an existing file without `force`, unless it carries `tool`'s mark (a picture the same tool drew before); a
    folder that takes no file.
    The message starts after the flag and path, e.g. 'already exists (add --force to replace it)'."""
    import fnmatch

    given = os.path.expanduser(path)
    target = os.path.realpath(given)  # through a symbolic link, the file written is the one it points to
    folder = os.path.dirname(target)
    where = os.path.dirname(target) if os.path.islink(given) else (os.path.dirname(path) or ".")
    if os.path.isdir(target):
        return "a folder, not a file"
    if is_stream(target):  # a pipe or /dev/stdout: written into, nothing replaced
        return None if os.access(target, os.W_OK) else "cannot write there (permission denied)"
    if not os.path.isdir(folder):
        return f"its folder does not exist ({os.path.dirname(path) or '.'})"
    if os.path.exists(target):
        for source in inputs:
            try:
                if source and os.path.samefile(target, os.path.expanduser(source)):
                    return "is the input file: writing there would replace what is being read; choose another file"
            except OSError:
                continue
    kind = model_folder_kind(folder)
    name = os.path.basename(target)
    if kind and any(fnmatch.fnmatch(name, pattern) for pattern in MODEL_FILE_PATTERNS):
        return (f"is a file of {kind} ({where}): writing it would break that folder; "
                "choose another file")
    if kind == "a model" and os.path.exists(target) and any(fnmatch.fnmatch(name, p) for p in RUN_FILE_PATTERNS):
        return (f"is one of the training run's results in {where}: writing it would replace "
                "what the run made, even with --force; choose another file")
    if os.path.exists(target) and not force and not _made_by(target, tool):
        return "already exists (add --force to replace it)"
    return unwritable_reason(target)


def same_outputs(paths: dict) -> str | None:
    """For {flag: path} of the files a command will write: the first pair naming the same file, as
    '--masks_output a.png: the same file as --output', or None."""
    seen = {}
    for flag, path in paths.items():
        if not path:
            continue
        key = os.path.normcase(os.path.realpath(os.path.expanduser(path)))
        if key in seen:
            return f"{flag} {path}: the same file as {seen[key]}; give each picture its own file"
        seen[key] = flag
    return None


def is_stream(path: str) -> bool:
    """True for an existing path that is neither a regular file nor a folder: a pipe (mkfifo, a shell's
    `>(gzip > x.gz)` or `<(cmd)`: /dev/fd/N), /dev/stdout, /dev/null. It holds no earlier file to keep: written
    into as it is, never replaced by a rename."""
    import stat

    try:
        mode = os.stat(os.path.expanduser(path)).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


class atomic_write:
    """`with atomic_write(path) as handle:` writes a temporary file beside `path` (same folder, so the rename is
    atomic), flushed to disk and renamed over `path` when the block ends without an error; on an error, a full
    disk or Ctrl-C the temporary file is removed and an earlier `path` is left whole. mode "w" (text, UTF-8) or
    "wb"; a new file gets the usual permissions (0666 less the umask), a replaced one keeps its own. A stream
    (`is_stream`: a pipe, /dev/stdout) is written into directly; through a symbolic link, its target is replaced
    and the link kept."""

    def __init__(self, path: str, mode: str = "w"):
        # a symbolic link stays a link: the file it points to is replaced (/dev/stdout redirected to a file, a link
        # into another folder), as `output_problem` checked it
        self.path, self.mode = os.path.realpath(os.path.expanduser(path)), mode

    def __enter__(self):
        import tempfile

        if is_stream(self.path):
            self.temporary = None
            self.handle = open(self.path, self.mode, **({} if "b" in self.mode else {"encoding": "utf-8"}))
            return self.handle
        folder = os.path.dirname(os.path.abspath(self.path))
        descriptor, self.temporary = tempfile.mkstemp(prefix=f".{os.path.basename(self.path)}.", suffix=".tmp",
                                                      dir=folder)
        try:
            self.handle = os.fdopen(descriptor, self.mode, **({} if "b" in self.mode else {"encoding": "utf-8"}))
        except BaseException:
            os.close(descriptor)
            os.unlink(self.temporary)
            raise
        return self.handle

    def __exit__(self, kind, error, traceback):
        if self.temporary is None:  # a stream: nothing to rename
            self.handle.close()
            return False
        try:
            if kind is None:
                self.handle.flush()
                os.fsync(self.handle.fileno())
            self.handle.close()
            if kind is None:
                try:
                    mode = os.stat(self.path).st_mode & 0o7777
                except OSError:
                    umask = os.umask(0)
                    os.umask(umask)
                    mode = 0o666 & ~umask
                os.chmod(self.temporary, mode)
                os.replace(self.temporary, self.path)
        finally:
            if os.path.exists(self.temporary):
                os.unlink(self.temporary)
        return False


def write_text(path: str, text: str) -> None:
    """`text` into `path` through `atomic_write`."""
    with atomic_write(path) as handle:
        handle.write(text)


def figure_metadata(path: str, tool: str) -> dict:
    """savefig's metadata for a picture in `path`'s format carrying `tool`'s mark ('scratch_transformer
    show_attention'), by which `output_problem` lets the same tool replace it without --force."""
    key = "Software" if path.lower().endswith(".png") else "Creator"
    return {key: f"{MARK} {tool}"}


def save_figure(figure, path: str, tool: str, **savefig_kwargs) -> None:
    """figure.savefig into `path` through `atomic_write`, in the format of its extension (.png, .pdf, .svg),
    marked as `tool`'s (`figure_metadata`)."""
    extension = os.path.splitext(path)[1].lower().lstrip(".") or "png"
    with atomic_write(path, "wb") as handle:
        figure.savefig(handle, format=extension, metadata=figure_metadata(path, tool), **savefig_kwargs)


# ------------------------------------------------------------------------------------------------ ending in one line


def is_disk_full(error: BaseException) -> bool:
    """True for a write that failed because the disk is full: OSError ENOSPC (or EDQUOT), or the errors torch
    and safetensors raise for it ("unexpected pos" from torch.save's zip writer, "file write failed",
    "No space left on device", "StorageFull"), here or in the exceptions it was raised from."""
    import errno

    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if any(clue in str(error) for clue in ("unexpected pos", "file write failed", "No space left on device",
                                                "StorageFull")):
            return True
        error = error.__cause__ or error.__context__
    return False


_SCRIPT = {"running": False}  # set by run_main: the process ends after a Ctrl-C


def ignore_further_interrupts() -> None:
    """After a first Ctrl-C in a script run by `run_main`, let further ones go unheard while what is finished is
    saved and the one line printed: a second Ctrl-C then neither cuts that saving short nor prints a traceback from
    an exit handler. The process is ending anyway (SIGTERM and SIGKILL still end it). Does nothing outside
    `run_main` (a script's main() called from Python keeps its Ctrl-C) or outside the main thread."""
    import signal
    import threading

    if _SCRIPT["running"] and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_main(main, prog: str, kept=None):
    """Run a script's `main()`; Ctrl-C (KeyboardInterrupt; a second one is not heard: `ignore_further_interrupts`)
    or a full disk ends with one line on stderr, no traceback: '<prog>: interrupted; <kept>' (exit 130) or
    '<prog>: error: no space left on device; <kept>' (exit 1), where `kept()` (called then) says what was kept and
    how to resume. Other errors pass."""
    import sys

    def say(line: str, code: int):
        sys.stderr.write(line + "\n")
        raise SystemExit(code)

    _SCRIPT["running"] = True
    try:
        return main()
    except KeyboardInterrupt:
        ignore_further_interrupts()
        say(f"{prog}: interrupted; {kept() if kept else 'nothing was written'}", 130)
    except Exception as error:
        if not is_disk_full(error):
            raise
        say(f"{prog}: error: no space left on device ({_short(error)}); "
            f"{kept() if kept else 'nothing was written'}", 1)
    finally:
        _SCRIPT["running"] = False


def _short(error: BaseException) -> str:
    """The error's first line, at most 120 characters."""
    text = (str(error).strip().split("\n") or [""])[0]
    return text[:117] + "..." if len(text) > 120 else text
