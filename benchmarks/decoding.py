"""Decoding chosen on validation: a trained model's BLEU for each beam size and length penalty.

Run from the repository root:
    python -m benchmarks.decoding --model outputs/multi30k_de_en
    python -m benchmarks.decoding --model outputs/multi30k_de_en --num_beams 1,4,6 --length_penalty 0.6,1.0,1.2
    python -m benchmarks.decoding --model outputs/multi30k_de_en --num_beams 4 --early_stopping false,true \
        --renormalize_logits false,true

Translates the validation split (default: the main job's config, ../shared/data/multi30k/raw, split val) with
every combination of --num_beams x --length_penalty x --early_stopping x --renormalize_logits (the last two
and no_repeat_ngram_size as the model's generation config has them unless given), scores each with sacreBLEU,
prints a Markdown table with the best row marked and the model's own generation defaults named, and writes it to
<model>/decoding_val.json (or --output_json). Choose on val, then report test with the chosen settings: test sets
are never read here.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from benchmarks.quality import CONFIG, REPO_ROOT, git_commit, machine


def _numbers(text: str, kind, name: str) -> list:
    try:
        values = [kind(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--{name}: expected comma-separated numbers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"--{name}: no values in {text!r}")
    return values


def _booleans(text: str, name: str) -> list[bool]:
    words = {"true": True, "false": False}
    values = [item.strip().lower() for item in text.split(",") if item.strip()]
    if not values or any(value not in words for value in values):
        raise argparse.ArgumentTypeError(f"--{name}: expected comma-separated true/false, got {text!r}")
    return [words[value] for value in values]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.decoding", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--model", required=True, help="a trained model folder (or Hub id)")
    p.add_argument("--num_beams", type=lambda t: _numbers(t, int, "num_beams"), default=[4, 6])
    p.add_argument("--length_penalty", type=lambda t: _numbers(t, float, "length_penalty"),
                   default=[0.6, 1.0, 1.2, 1.5])
    p.add_argument("--no_repeat_ngram_size", type=int, default=None, help="default: the model's generation config")
    p.add_argument("--early_stopping", type=lambda t: _booleans(t, "early_stopping"), default=None,
                   help="beam search's stopping rule(s), e.g. false,true (default: the model's generation config)")
    p.add_argument("--renormalize_logits", type=lambda t: _booleans(t, "renormalize_logits"), default=None,
                   help="renormalise after blocked tokens, e.g. false,true (default: the model's generation config)")
    p.add_argument("--config", default=CONFIG, help="the main job's config: where the data is, which languages")
    p.add_argument("--split", default=None, help="default: the config's validation_split")
    p.add_argument("--max_samples", type=int, default=None, help="only the first N sentences of the split")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--output_json", default=None, help="default: <model>/decoding_val.json")
    args = p.parse_args(argv)
    if any(n < 1 for n in args.num_beams):
        p.error("--num_beams values must be >= 1")
    if args.batch_size < 1:
        p.error("--batch_size must be >= 1")
    if args.max_samples is not None and args.max_samples < 1:
        p.error("--max_samples must be >= 1")
    return args


def main(argv=None) -> dict:
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import scratch_transformer  # noqa: F401  (registers the model with the Auto classes)
    from scratch_transformer.data import load_translation_dataset
    from scratch_transformer.inference import translate
    from scratch_transformer.metrics import corpus_scores

    args = parse_args(argv)
    with open(REPO_ROOT / args.config, encoding="utf-8") as handle:
        shipped = json.load(handle)
    split = args.split or shipped.get("validation_split", "validation")
    src, tgt = shipped["source_lang"], shipped["target_lang"]
    # a folder given relative to the repository root (the shipped config's), else as given (a Hub id, a path)
    name = shipped["dataset_name"]
    local = REPO_ROOT / name
    dataset = load_translation_dataset(str(local) if local.exists() else name, src, tgt, splits=[split],
                                       dataset_config_name=shipped.get("dataset_config_name"))[split]
    if args.max_samples is not None:
        dataset = dataset.select(range(min(args.max_samples, len(dataset))))
    sources, references = list(dataset[src]), list(dataset[tgt])
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    defaults = model.generation_config
    no_repeat = defaults.no_repeat_ngram_size if args.no_repeat_ngram_size is None else args.no_repeat_ngram_size
    own_stop, own_renorm = defaults.early_stopping is True, bool(defaults.renormalize_logits)
    stops = args.early_stopping or [own_stop]
    renorms = args.renormalize_logits or [own_renorm]
    rows = []
    for beams in args.num_beams:
        for penalty in args.length_penalty if beams > 1 else [1.0]:  # greedy has no length penalty
            for stop in stops if beams > 1 else [False]:  # nor a stopping rule
                for renorm in renorms:
                    with torch.inference_mode():
                        hypotheses = translate(model, tokenizer, sources, batch_size=args.batch_size,
                                               num_beams=beams, length_penalty=penalty,
                                               no_repeat_ngram_size=no_repeat or 0, early_stopping=stop,
                                               renormalize_logits=renorm)
                    scores = corpus_scores(hypotheses, references)
                    rows.append({"num_beams": beams, "length_penalty": penalty, "early_stopping": stop,
                                 "renormalize_logits": renorm, "bleu": scores["bleu"], "chrf": scores["chrf"]})
                    print(f"[decoding] beam {beams} lp {penalty:g} early_stopping {stop} renormalize_logits "
                          f"{renorm}: BLEU {scores['bleu']:.2f}", file=sys.stderr, flush=True)
    best = max(rows, key=lambda row: (row["bleu"], row["chrf"]))
    current = (defaults.num_beams or 1, 1.0 if defaults.length_penalty is None else defaults.length_penalty)
    current_row = (*current, own_stop and current[0] > 1, own_renorm)
    lines = [f"## Decoding chosen on {split}: {args.model}", "",
             f"no_repeat_ngram_size {no_repeat or 0}; the model's defaults: beam {current[0]}, length penalty "
             f"{current[1]:g}, early_stopping {own_stop}, renormalize_logits {own_renorm}; "
             f"{datetime.date.today()}, commit {git_commit()}, CPU {machine()['cpu_model']}.", "",
             "| beams | length penalty | early stopping | renormalised | BLEU | chrF |",
             "|---:|---:|---|---|---:|---:|"]
    for row in rows:
        key = (row["num_beams"], row["length_penalty"], row["early_stopping"], row["renormalize_logits"])
        mark = " (best)" if row is best else (" (model default)" if key == current_row else "")
        lines.append(f"| {row['num_beams']} | {row['length_penalty']:g}{mark} | {row['early_stopping']} | "
                     f"{row['renormalize_logits']} | {row['bleu']:.2f} | {row['chrf']:.2f} |")
    result = {"model": args.model, "split": split, "sentences": len(sources), "no_repeat_ngram_size": no_repeat,
              "defaults": {"num_beams": current[0], "length_penalty": current[1], "early_stopping": own_stop,
                           "renormalize_logits": own_renorm}, "rows": rows, "best": best,
              "table": "\n".join(lines)}
    output = Path(args.output_json) if args.output_json else Path(args.model) / "decoding_val.json"
    output.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(result["table"])
    return result


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as error:
        sys.exit(f"python -m benchmarks.decoding: error: {error}")
