"""Translate sentences with a trained model (local folder or Hub id).

Examples:
    python scripts/translate.py --model outputs/multi30k_de_en "Ein Hund rennt über die Wiese."
    python scripts/translate.py --model outputs/multi30k_de_en --input_file de.txt --output_file en.txt
    echo "Zwei Kinder spielen im Sand." | python scripts/translate.py --model user/scratch-de-en --trust_remote_code
    python scripts/translate.py --engine ctranslate2 --model outputs/ct2_int8 --input_file de.txt

`--engine ctranslate2` translates with a folder written by scripts/export_ctranslate2.py (same options, same
output); `--compute_type` and `--threads` tune that engine.
"""

import os
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser  # torch and the models load only after the checks


@dataclass
class TranslateArguments:
    model: str = field(metadata={"help": "A trained model: local folder or Hub id."})
    input_file: str | None = field(default=None, metadata={"help": "One sentence per line (default: arguments or stdin)."})
    output_file: str | None = field(default=None, metadata={"help": "Write translations here (default: stdout)."})
    batch_size: int = field(default=32, metadata={"help": "Sentences per batch."})
    num_beams: int | None = field(default=None, metadata={"help": "Beam size (default: the model's generation config)."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Longest translation, in tokens."})
    max_source_length: int = field(default=256, metadata={
        "help": "Longer sources are truncated to this many tokens, at most the model's positions, with a warning "
                "that says how many (the pipeline's rule and default)."})
    revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit id)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the model's own code from the Hub."})
    engine: str = field(default="torch", metadata={
        "help": "torch (the model's generate()) or ctranslate2 (a folder from scripts/export_ctranslate2.py).",
        "choices": ["torch", "ctranslate2"]})
    compute_type: str = field(default="default", metadata={
        "help": "ctranslate2 only: int8, int8_float32, float32, ... (default: the type the folder was saved in)."})
    threads: int = field(default=0, metadata={
        "help": "ctranslate2 only: CPU cores to use (0: all), one worker of one thread each; a batch is split among "
                "them."})
    force: bool = field(default=False, metadata={
        "help": "Replace an existing --output_file (never the input file, nor a model folder's files)."})


# what a run has kept so far, for the one line printed on Ctrl-C or a full disk (`kept`)
PROGRESS = {}


def _read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 file (a byte-order mark dropped), split by `paths.split_lines`: one per "\\n"."""
    from scratch_transformer.paths import read_lines

    try:
        return read_lines(path)
    except ValueError as error:  # gzip, UTF-16, latin-1, binary: named as what it is
        raise SystemExit(str(error)) from None
    except OSError as error:
        raise SystemExit(f"--input_file {path}: cannot read it ({error.strerror or error})") from None


def kept() -> str:
    """What an interrupted or failed run kept, and how to go on (for `paths.run_main`'s one line)."""
    output, partial = PROGRESS.get("output_file"), PROGRESS.get("partial")
    if not output:
        return "nothing was written (translations go to stdout at the end; with --output_file the finished ones " \
               "are kept and the same command goes on from them)"
    if partial:
        return (f"{output} is unchanged; {PROGRESS['finished']} of {PROGRESS['total']} translations kept in "
                f"{partial}: the same command translates the rest")
    return f"{output} is unchanged and nothing else was written; the same command starts again"


def _partial_record(path: str, key: dict, force: bool) -> dict:
    """The finished translations {line index: text} that an interrupted run with the same input, model and
    settings (`key`) kept in `path`; {} when there is none. One of another run is refused, or with --force
    replaced."""
    import json

    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as handle:
            record = json.load(handle)
        finished = {int(index): text for index, text in record["translations"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        finished, record = {}, {}
    if record.get("key") != key:
        if force:
            return {}
        raise SystemExit(f"--output_file: {path} holds the translations an interrupted run kept for another input, "
                         "model or settings; run that command again to finish it, or add --force to start afresh")
    return finished


def _keep_partial(path: str, key: dict, finished: dict, total: int) -> None:
    """Write the finished translations to `path` (atomically) and record them for `kept`; nothing on failure."""
    import json

    from scratch_transformer.paths import write_text

    if not finished:
        return
    try:
        write_text(path, json.dumps({"key": key, "translations": {str(i): t for i, t in sorted(finished.items())}},
                                    ensure_ascii=False))
    except OSError:  # a full disk: the earlier partial file, if any, is whole
        return
    PROGRESS.update(partial=path, finished=len(finished), total=total)


def _check_model(parser, model: str, revision: str | None) -> dict:
    """Fail at once, naming --model, unless `model` is a trained model's folder or a reachable Hub model.
    Returns extra from_pretrained arguments (local_files_only when the Hub is unreachable but the cache has it)."""
    from scratch_transformer.paths import looks_like_local_path, missing_model_message, model_folder_problem

    folder = os.path.expanduser(model)
    if os.path.isdir(folder):
        problem = model_folder_problem(folder)
        if problem:
            parser.error(f"--model {model}: {problem}")
        return {}
    if os.path.exists(folder):
        parser.error(f"--model {model}: a file, not a model folder (give a trained model's folder or a Hub id)")
    if looks_like_local_path(model):
        parser.error(f"--model {model}: {missing_model_message(model)}")

    from huggingface_hub import HfApi, constants, try_to_load_from_cache
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

    if constants.HF_HUB_OFFLINE:
        return {}  # offline mode: transformers reads the cache, or says the files are not there
    try:
        HfApi().model_info(model, revision=revision, timeout=10)  # one request, no retries
    except RevisionNotFoundError:
        parser.error(f"--revision {revision}: no such revision of the Hub model {model}")
    except RepositoryNotFoundError:
        parser.error(f"--model {model}: no such local folder, and no such model on the Hub ({constants.ENDPOINT}) "
                     "(if it is private, log in: hf auth login)")
    except Exception as error:  # no connection, a timeout, a server error
        if isinstance(try_to_load_from_cache(model, "config.json", revision=revision), str):
            return {"local_files_only": True}  # downloaded before: use the cached copy
        parser.error(f"--model {model}: no such local folder, and the Hub ({constants.ENDPOINT}) cannot be reached "
                     f"({type(error).__name__}: {error}); check the path, or the connection")
    return {}


def _check_ctranslate2_folder(parser, model: str, revision: str | None) -> str:
    """The local folder of a CTranslate2 conversion (downloaded first for a Hub id); parser.error otherwise."""
    from scratch_transformer.ctranslate2_engine import ENGINE_FILE
    from scratch_transformer.paths import looks_like_local_path, missing_path_message

    folder = os.path.expanduser(model)
    if not os.path.isdir(folder):
        if os.path.exists(folder) or looks_like_local_path(model):
            parser.error(missing_path_message("--model", model) if not os.path.exists(folder)
                         else f"--model {model}: a file, not a folder")
        from huggingface_hub import snapshot_download

        try:
            folder = snapshot_download(model, revision=revision)
        except Exception as error:  # not found, no connection
            parser.error(f"--model {model}: no such local folder, and it cannot be downloaded from the Hub "
                         f"({type(error).__name__}: {error})")
    if not os.path.isfile(os.path.join(folder, ENGINE_FILE)):
        parser.error(f"--model {model}: not a CTranslate2 folder (no {ENGINE_FILE}); convert a trained model "
                     f"first: python scripts/export_ctranslate2.py --model {model} --output_dir {model}_ct2")
    return folder


def main(argv=None) -> list[str]:
    argv = sys.argv[1:] if argv is None else argv
    from scratch_transformer.paths import one_line_errors

    parser = one_line_errors(HfArgumentParser(TranslateArguments))
    args, sentences = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    unknown = [s for s in sentences if s.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.input_file and sentences:
        parser.error("give sentences as arguments or --input_file, not both")
    if args.num_beams is not None and args.num_beams < 1:
        parser.error(f"--num_beams must be >= 1, got {args.num_beams}")
    for name in ("batch_size", "max_source_length", "max_new_tokens"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.threads < 0:
        parser.error(f"--threads must be >= 0 (0: all cores), got {args.threads}")
    if args.input_file and not os.path.isfile(args.input_file):
        what = "a folder, not a file" if os.path.isdir(args.input_file) else "no such file"
        parser.error(f"--input_file {args.input_file}: {what}")
    if args.output_file:
        from scratch_transformer.paths import output_problem

        # its own input, a model's files, an existing file without --force, a read-only folder: before decoding
        problem = output_problem(args.output_file, inputs=[args.input_file], force=args.force)
        if problem:
            parser.error(f"--output_file {args.output_file}: {problem}")
    if args.engine == "ctranslate2":
        model_folder = _check_ctranslate2_folder(parser, args.model, args.revision)
    else:
        load_kwargs = _check_model(parser, args.model, args.revision)
    if args.input_file:
        sentences = _read_lines(args.input_file)
    elif not sentences:
        from scratch_transformer.paths import split_lines

        sentences = split_lines(sys.stdin.read().removeprefix("\ufeff"))

    from safetensors import SafetensorError
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from scratch_transformer.inference import translate  # importing the package registers the model

    try:
        if args.engine == "ctranslate2":
            from scratch_transformer.ctranslate2_engine import CTranslate2Model

            tokenizer = AutoTokenizer.from_pretrained(model_folder)
            model = CTranslate2Model.from_pretrained(model_folder, compute_type=args.compute_type,
                                                     inter_threads=args.threads or None)
        else:
            tokenizer = AutoTokenizer.from_pretrained(args.model, revision=args.revision, **load_kwargs)
            model = AutoModelForSeq2SeqLM.from_pretrained(args.model, revision=args.revision,
                                                          trust_remote_code=args.trust_remote_code, **load_kwargs)
    except (OSError, ValueError, RuntimeError, ImportError, SafetensorError) as error:
        # SafetensorError: weights cut short or corrupt; RuntimeError: CTranslate2 cannot read its files
        parser.error(f"--model {args.model}: cannot load it: {error}")
    if args.engine == "torch":
        from scratch_transformer.tokenization import tokenizer_fit_problem

        problem = tokenizer_fit_problem(model.config, tokenizer)  # e.g. a vocabulary resized below the tokenizer
        if problem:
            parser.error(f"--model {args.model}: {problem}; resize the model to the tokenizer "
                         f"(model.resize_token_embeddings({len(tokenizer)})) or save the tokenizer it was trained with")
    return _translate_all(args, model, tokenizer, sentences, translate)


def _translate_all(args, model, tokenizer, sentences, translate) -> list[str]:
    """Translate `sentences`; with --output_file, the finished ones are kept in OUTPUT.partial.json on Ctrl-C or a
    full disk (OUTPUT itself is written whole at the end, or not at all) and the same command goes on from them."""
    import hashlib

    from scratch_transformer.paths import atomic_write, is_disk_full

    output = args.output_file
    PROGRESS.update(output_file=output)
    partial = f"{output}.partial.json" if output else None
    key = {"model": os.path.abspath(args.model) if os.path.isdir(args.model) else args.model,
           "input": hashlib.sha256("\n".join(sentences).encode("utf-8")).hexdigest(), "lines": len(sentences),
           **{name: getattr(args, name) for name in ("engine", "num_beams", "max_new_tokens", "max_source_length",
                                                     "revision", "compute_type")}}
    finished = _partial_record(partial, key, args.force) if output else {}
    if finished:
        PROGRESS.update(partial=partial, finished=len(finished), total=len(sentences))
        print(f"going on from {partial}: {len(finished)} of {len(sentences)} translations kept", file=sys.stderr)
    todo = [index for index in range(len(sentences)) if index not in finished]
    done = {}
    try:
        fresh = translate(model, tokenizer, [sentences[i] for i in todo], batch_size=args.batch_size,
                          num_beams=args.num_beams, max_new_tokens=args.max_new_tokens,
                          max_source_length=args.max_source_length, progress=args.input_file is not None, done=done)
        finished.update(zip(todo, fresh))
        translations = [finished[index] for index in range(len(sentences))]
        text = "".join(line + "\n" for line in translations)  # no input lines: no output lines
        if output:
            with atomic_write(output) as handle:
                handle.write(text)
        else:
            sys.stdout.write(text)
    except BaseException as error:
        if output and (isinstance(error, KeyboardInterrupt) or is_disk_full(error)):
            finished.update((todo[i], text) for i, text in done.items())
            _keep_partial(partial, key, finished, len(sentences))
        raise
    if partial and os.path.exists(partial):
        os.remove(partial)
    return translations


if __name__ == "__main__":
    from scratch_transformer.paths import run_main

    run_main(main, "translate.py", kept)
