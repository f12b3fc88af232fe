"""Translate sentences with a trained model (local folder or Hub id).

Examples:
    python scripts/translate.py --model outputs/multi30k_de_en "Ein Hund rennt über die Wiese."
    python scripts/translate.py --model outputs/multi30k_de_en --input_file de.txt --output_file en.txt
    echo "Zwei Kinder spielen im Sand." | python scripts/translate.py --model user/scratch-de-en --trust_remote_code
"""

import os
import sys
from dataclasses import dataclass, field

from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, HfArgumentParser


@dataclass
class TranslateArguments:
    model: str = field(metadata={"help": "A trained model: local folder or Hub id."})
    input_file: str | None = field(default=None, metadata={"help": "One sentence per line (default: arguments or stdin)."})
    output_file: str | None = field(default=None, metadata={"help": "Write translations here (default: stdout)."})
    batch_size: int = field(default=32, metadata={"help": "Sentences per batch."})
    num_beams: int | None = field(default=None, metadata={"help": "Beam size (default: the model's generation config)."})
    max_new_tokens: int | None = field(default=None, metadata={"help": "Longest translation, in tokens."})
    revision: str | None = field(default=None, metadata={"help": "Hub revision (branch, tag or commit id)."})
    trust_remote_code: bool = field(default=False, metadata={"help": "Allow the model's own code from the Hub."})


def _read_lines(path: str) -> list[str]:
    try:
        with open(path, encoding="utf-8-sig") as handle:  # -sig: drop a byte-order mark if an editor wrote one
            return handle.read().splitlines()
    except UnicodeDecodeError as error:
        raise SystemExit(f"{path}: not UTF-8 text (byte {error.start}: {error.object[error.start:error.start + 1]!r}); "
                         "convert it, e.g. iconv -f latin1 -t utf-8") from None


def main(argv=None) -> list[str]:
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser(TranslateArguments)
    args, sentences = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    unknown = [s for s in sentences if s.startswith("--")]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.input_file and sentences:
        parser.error("give sentences as arguments or --input_file, not both")
    if args.num_beams is not None and args.num_beams < 1:
        parser.error(f"--num_beams must be >= 1, got {args.num_beams}")
    if os.path.isabs(args.model) or args.model.startswith((".", "~")) or args.model.count("/") > 1:
        if not os.path.isdir(os.path.expanduser(args.model)):
            parser.error(f"--model {args.model}: no such folder (give a trained model's folder or a Hub id)")
    if args.output_file and not os.path.isdir(os.path.dirname(os.path.abspath(args.output_file))):
        parser.error(f"--output_file {args.output_file}: its folder does not exist")
    if args.input_file:
        sentences = _read_lines(args.input_file)
    elif not sentences:
        sentences = sys.stdin.read().removeprefix("\ufeff").splitlines()

    from scratch_transformer.inference import translate  # importing the package registers the model

    tokenizer = AutoTokenizer.from_pretrained(args.model, revision=args.revision)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, revision=args.revision,
                                                  trust_remote_code=args.trust_remote_code)
    translations = translate(model, tokenizer, sentences, batch_size=args.batch_size, num_beams=args.num_beams,
                             max_new_tokens=args.max_new_tokens, progress=args.input_file is not None)
    text = "".join(line + "\n" for line in translations)  # no input lines: no output lines
    if args.output_file:
        with open(args.output_file, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return translations


if __name__ == "__main__":
    main()
