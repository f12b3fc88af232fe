"""Convert a trained model to CTranslate2, for fast CPU (int8) or GPU inference.

Examples:
    python scripts/export_ctranslate2.py --model outputs/multi30k_de_en --output_dir outputs/multi30k_de_en_ct2
    python scripts/export_ctranslate2.py --model outputs/multi30k_de_en --output_dir outputs/ct2_int8 \
        --quantization int8
    python scripts/translate.py --engine ctranslate2 --model outputs/ct2_int8 "Zwei Hunde spielen im Schnee."

The folder holds CTranslate2's model.bin, config.json and shared_vocabulary.json, beside the tokenizer and the
model's generation config (beams, length penalty, no-repeat n-gram size, max length), which translate.py
applies. Needs `pip install ctranslate2` (or the package's `[ctranslate2]` extra).
"""

import logging
import os
import sys
from dataclasses import dataclass, field

from transformers import HfArgumentParser  # torch and the model load only after the checks


@dataclass
class ExportArguments:
    model: str = field(metadata={"help": "A trained model: local folder or Hub id."})
    output_dir: str = field(metadata={"help": "The CTranslate2 folder to write."})
    quantization: str | None = field(default=None, metadata={
        "help": "Weight type: int8, int8_float32, int8_float16, int8_bfloat16, int16, float16, bfloat16, float32 "
                "(default float32)."})
    force: bool = field(default=False, metadata={
        "help": "Replace output_dir if it is an earlier export (never the model's folder, nor a folder of other "
                "files)."})
    check_file: str | None = field(default=None, metadata={
        "help": "Source sentences, one per line: translate them with generate() and with the conversion, and log "
                "how many differ (recorded in scratch_transformer_ctranslate2.json)."})
    revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit id)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the model's own code from the Hub."})


def main(argv=None) -> str:
    from scratch_transformer.paths import one_line_errors

    parser = one_line_errors(HfArgumentParser(ExportArguments))
    (args,) = parser.parse_args_into_dataclasses(args=sys.argv[1:] if argv is None else argv)
    from scratch_transformer.ctranslate2_engine import check_export_target
    from scratch_transformer.paths import split_lines

    parent = os.path.dirname(os.path.abspath(os.path.expanduser(args.output_dir)))
    if not os.path.isdir(parent):  # refused before the model is loaded, naming the missing folder
        parser.error(f"--output_dir {args.output_dir}: its folder does not exist "
                     f"({os.path.dirname(args.output_dir.rstrip('/')) or '.'}; make it first, or choose another)")

    try:
        check_export_target(args.model, args.output_dir, args.force)
    except FileExistsError:
        parser.error(f"--output_dir {args.output_dir} already exists (add --force to replace it)")
    except ValueError as error:
        parser.error(f"--{error}")
    sentences = None
    if args.check_file:
        try:
            with open(args.check_file, encoding="utf-8-sig", newline="") as handle:
                sentences = [line.strip() for line in split_lines(handle.read()) if line.strip()]
        except UnicodeDecodeError as error:
            parser.error(f"--check_file {args.check_file}: not UTF-8 text (byte {error.start})")
        except OSError as error:
            parser.error(f"--check_file {args.check_file}: cannot read it ({error.strerror or error})")
        if not sentences:
            parser.error(f"--check_file {args.check_file}: no sentences in it")
    folder = os.path.expanduser(args.model)
    if not os.path.isdir(folder):
        from scratch_transformer.paths import looks_like_local_path, missing_model_message

        if os.path.exists(folder):
            parser.error(f"--model {args.model}: a file, not a model folder")
        if looks_like_local_path(args.model):
            parser.error(f"--model {args.model}: {missing_model_message(args.model)}")
    else:
        from scratch_transformer.paths import model_folder_problem

        problem = model_folder_problem(folder)
        if problem:
            parser.error(f"--model {args.model}: {problem}")
    logging.basicConfig(format="%(levelname)s %(name)s: %(message)s", level=logging.INFO)
    from scratch_transformer.ctranslate2_engine import export_ctranslate2

    try:
        path = export_ctranslate2(args.model, args.output_dir, quantization=args.quantization, force=args.force,
                                  revision=args.revision, trust_remote_code=args.trust_remote_code,
                                  check_sentences=sentences)
    except (ValueError, OSError, ImportError) as error:
        parser.error(f"cannot convert {args.model}: {error}")
    print(f"wrote {path} ({args.quantization or 'float32'} weights)")
    return path


if __name__ == "__main__":
    from scratch_transformer.paths import run_main

    run_main(main, "export_ctranslate2.py", lambda: "the export is staged beside --output_dir and moved in once "
             "complete: an earlier export there is whole; the same command starts again")
