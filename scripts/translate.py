"""Translate sentences with a trained model (local folder or Hub id).

Examples:
    python scripts/translate.py --model outputs/multi30k_de_en "Ein Hund rennt über die Wiese."
    python scripts/translate.py --model outputs/multi30k_de_en --input_file de.txt --output_file en.txt
    echo "Zwei Kinder spielen im Sand." | python scripts/translate.py --model user/scratch-de-en --trust_remote_code
"""

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


def main(argv=None) -> list[str]:
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser(TranslateArguments)
    args, sentences = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    if args.input_file and sentences:
        parser.error("give sentences as arguments or --input_file, not both")
    if args.input_file:
        with open(args.input_file, encoding="utf-8") as handle:
            sentences = handle.read().splitlines()
    elif not sentences:
        sentences = sys.stdin.read().splitlines()

    from scratch_transformer.inference import translate  # importing the package registers the model

    tokenizer = AutoTokenizer.from_pretrained(args.model, revision=args.revision)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model, revision=args.revision,
                                                  trust_remote_code=args.trust_remote_code)
    translations = translate(model, tokenizer, sentences, batch_size=args.batch_size, num_beams=args.num_beams,
                             max_new_tokens=args.max_new_tokens, progress=args.input_file is not None)
    text = "\n".join(translations) + "\n"
    if args.output_file:
        with open(args.output_file, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        sys.stdout.write(text)
    return translations


if __name__ == "__main__":
    main()
