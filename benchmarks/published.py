"""Ours beside published Multi30k figures: a finished run scored as sacreBLEU and as papers score Multi30k.

Run from the repository root, after the English→German main job (25 minutes, nothing else on the cores):
    python scripts/train_translation.py configs/multi30k_en_de.json
    python -m benchmarks.published --record     # into benchmarks/results/multi30k_en_de.json
    python -m benchmarks.tables                 # the table in docs/results.md

Reads the run's test predictions (generated_predictions[_<split>].txt) and all_results.json, the references from
the config's data folder, and scores every test set twice: sacreBLEU as the main job does (mixed case, 13a tokens
on detokenised text; the figure in all_results.json) and the papers' BLEU (`metrics.papers_bleu`: lowercased,
Moses-tokenised, BLEU over those tokens), the way Wu et al. 2021 (fairseq's scorer on lowercased, Moses-tokenised
data) and most Multi30k papers report. Prints a table; `--record` puts the run into
benchmarks/results/multi30k_en_de.json beside the published figures.

Raises (exits with a message): a run folder without all_results.json or predictions, a reference file that is
missing or of another length.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import sys
from pathlib import Path

from benchmarks import record
from benchmarks.quality import git_commit, machine

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIG = "configs/multi30k_en_de.json"
# What the results table sets ours beside; "bleu" is as the source reports it.
PUBLISHED = [
    {"model": "Transformer-Tiny, text only (Wu et al. 2021, \"Good for Misconceived Reasons\", Table 1; recipe in "
              "LividWo/Revisit-MMT)", "direction": "en->de", "bleu": 41.02,
     "decoding": "beam 5, last 10 checkpoints averaged",
     "trained": "4+4 layers of width 128, FFN 256, dropout 0.3, 8000 updates of 4096 tokens, 2 GPUs",
     "scoring": "fairseq generate.py --remove-bpe: BLEU over lowercased Moses tokens, no smoothing"},
    {"model": "bentrevett/pytorch-seq2seq, 6 - Attention is All You Need (teaching notebook)",
     "direction": "de->en", "bleu": 36.52, "decoding": "greedy",
     "trained": "3+3 layers of width 256, 8 heads, FFN 512, dropout 0.1, 10 epochs, the checkpoint of lowest "
                "validation loss",
     "scoring": "torchtext bleu_score over lowercased spaCy tokens, test_2016_flickr"},
]


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.published", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--config", default=CONFIG, help="the run's config file (its data, languages and test sets)")
    p.add_argument("--run", default=None, help="the run's output folder (default: the config's output_dir)")
    p.add_argument("--record", action="store_true", help="put the run into benchmarks/results/multi30k_en_de.json")
    p.add_argument("--results_dir", default=None, help=argparse.SUPPRESS)  # tests
    return p.parse_args(argv)


def _lines(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n").rstrip("\r") for line in handle]


def references(folder: Path, split: str, lang: str) -> list[str]:
    """The reference lines of `split` in `lang` from a folder of {split}.{lang}[.gz] files.

    Raises:
        ValueError: no such file.
    """
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        if (folder / name).is_file():
            return _lines(folder / name)
    raise ValueError(f"no {split}.{lang}[.gz] in {folder}")


def score_run(run: Path, config: dict) -> dict:
    """Each test set of a finished run: sacreBLEU (from all_results.json) and the papers' BLEU.

    Raises:
        ValueError: no all_results.json or predictions, or predictions and references of different lengths.
    """
    from scratch_transformer.metrics import papers_bleu

    results_path = run / "all_results.json"
    if not results_path.is_file():
        raise ValueError(f"{run} holds no all_results.json: not a finished run of the main job")
    results = json.loads(results_path.read_text(encoding="utf-8"))
    data = (REPO_ROOT / config["dataset_name"]) if not Path(config["dataset_name"]).is_absolute() \
        else Path(config["dataset_name"])
    lang = config["target_lang"]
    scores = {}
    for index, split in enumerate(config["test_split"].split(",")):
        name = "generated_predictions.txt" if index == 0 else f"generated_predictions_{split}.txt"
        if not (run / name).is_file():
            raise ValueError(f"{run} holds no {name} (the predictions on {split})")
        hypotheses, refs = _lines(run / name), references(data, split, lang)
        if len(hypotheses) != len(refs):
            raise ValueError(f"{run / name}: {len(hypotheses)} lines, but {len(refs)} references in {split}.{lang}")
        sacre = (results.get("test_sets") or {}).get(split) or {}
        papers = papers_bleu(hypotheses, refs, lang)
        scores[split] = {"bleu": sacre.get("bleu"), "chrf": sacre.get("chrf"), "papers_bleu": papers["bleu"],
                         "papers_signature": papers["signature"]}
    return {"languages": f"{config['source_lang']}->{lang}", "steps": results.get("train_steps"),
            "precision": results.get("precision"), "eval_bleu": results.get("eval_bleu"), "test_sets": scores}


def main(argv=None) -> dict:
    args = parse_args(argv)
    config = json.loads((REPO_ROOT / args.config).read_text(encoding="utf-8"))
    run = Path(args.run or config["output_dir"])
    entry = {**score_run(run, config), "run": str(run), "commit": git_commit(),
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
             "cpu_model": machine().get("cpu_model")}
    print("| test set | sacreBLEU | papers' BLEU (lowercased, Moses tokens) |\n|---|---:|---:|")
    for split, scores in entry["test_sets"].items():
        print(f"| {split} | {scores['bleu']} | {scores['papers_bleu']} |")
    if args.record:
        path = record.record("multi30k_en_de", [entry], key=lambda r: (r.get("cpu_model"), r.get("languages")),
                             results_dir=args.results_dir,
                             command="python scripts/train_translation.py configs/multi30k_en_de.json && "
                                     "python -m benchmarks.published --record",
                             published=PUBLISHED)
        print(f"[published] recorded in {path}", file=sys.stderr)
    return entry


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError, ImportError) as error:
        sys.exit(f"python -m benchmarks.published: error: {error}")
