"""The training curve and sample translations of a finished run of the main job, for the docs.

Example (after `python scripts/train_translation.py configs/multi30k_de_en.json`):
    python scripts/show_run.py outputs/multi30k_de_en --curve docs/multi30k_training_curve.png --samples 3 \
        --docs docs/results.md

Draws the run's training loss and validation BLEU by step (trainer_state.json) into --curve, and prints the
first --samples sentences of its headline test set as source / reference / ours lines (generated_predictions.txt
beside the references of the config's data folder); with --docs, also writes them into that file between
`<!-- samples -->` and `<!-- /samples -->`, with the run's commit, date and BLEU.
"""

import argparse
import gzip
import json
import re
import sys
from pathlib import Path

from scratch_transformer.paths import output_problem, split_lines, write_text
from scratch_transformer.training import plot_training_curve


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    p.add_argument("run", help="the run's output folder")
    p.add_argument("--curve", default=None, help="where to draw the training curve (PNG)")
    p.add_argument("--samples", type=int, default=3, help="how many test sentences to show (default 3)")
    p.add_argument("--dataset_name", default="../shared/data/multi30k/raw",
                   help="the folder of {split}.{lang}[.gz] files the run was tested on")
    p.add_argument("--split", default="test_2016_flickr", help="the run's first test split")
    p.add_argument("--source_lang", default="de")
    p.add_argument("--target_lang", default="en")
    p.add_argument("--docs", default=None, help="a Markdown file with <!-- samples --> ... <!-- /samples -->")
    p.add_argument("--force", action="store_true", help="replace a --curve picture this script did not draw")
    args = p.parse_args(argv)
    problem = args.curve and output_problem(args.curve, force=args.force, tool="training_curve")
    if problem:
        p.error(f"--curve {args.curve}: {problem}")
    if args.samples < 0:
        p.error(f"--samples must be >= 0, got {args.samples}")
    return args


def read_lines(folder: Path, split: str, lang: str) -> list[str]:
    """The lines of {split}.{lang}[.gz] in `folder`. Raises ValueError when there is no such file."""
    for path in (folder / f"{split}.{lang}", folder / f"{split}.{lang}.gz"):
        if path.is_file():
            opener = gzip.open if path.suffix == ".gz" else open
            with opener(path, "rt", encoding="utf-8", newline="") as handle:
                return split_lines(handle.read())
    raise ValueError(f"no {split}.{lang}[.gz] in {folder}")


def samples(run: Path, args) -> list[str]:
    """Markdown list lines "source / reference / ours" of the first `args.samples` test sentences.

    Raises:
        ValueError: the run has no generated_predictions.txt, or it and the references differ in length.
    """
    predictions_path = run / "generated_predictions.txt"
    if not predictions_path.is_file():
        raise ValueError(f"{run} holds no generated_predictions.txt: not a finished run with a test")
    ours = split_lines(predictions_path.read_text(encoding="utf-8"))
    sources = read_lines(Path(args.dataset_name), args.split, args.source_lang)
    references = read_lines(Path(args.dataset_name), args.split, args.target_lang)
    if not len(ours) == len(sources) == len(references):
        raise ValueError(f"{predictions_path} has {len(ours)} lines, {args.split} {len(sources)} sources and "
                         f"{len(references)} references")
    return [f"- {s} / {r} / {o}" for s, r, o in list(zip(sources, references, ours))[:args.samples]]


def main(argv=None) -> list[str]:
    args = parse_args(argv)
    run = Path(args.run)
    if not (run / "trainer_state.json").is_file():
        raise ValueError(f"{run} holds no trainer_state.json: not a finished training run")
    state = json.loads((run / "trainer_state.json").read_text(encoding="utf-8"))
    if args.curve:
        plot_training_curve(state["log_history"], args.curve)
        print(f"drew {args.curve} ({state['global_step']} steps)", file=sys.stderr)
    lines = samples(run, args)
    print("\n".join(lines))
    if args.docs:
        results = json.loads((run / "all_results.json").read_text(encoding="utf-8")) \
            if (run / "all_results.json").is_file() else {}
        head = (f"{args.split} (source / reference / ours), from a run of {state['global_step']} steps, test BLEU "
                f"{results.get('test_bleu', '-')}:")
        path = Path(args.docs)
        text = path.read_text(encoding="utf-8")
        block = "<!-- samples -->\n" + "\n".join([head, *lines]) + "\n<!-- /samples -->"
        new, count = re.subn(r"<!-- samples -->.*?<!-- /samples -->", lambda _: block, text, flags=re.S)
        if count != 1:
            raise ValueError(f"{path} has no <!-- samples --> ... <!-- /samples --> block")
        write_text(path, new)
    return lines


if __name__ == "__main__":
    try:
        main()
    except (ValueError, OSError) as error:
        sys.exit(f"show_run.py: error: {error}")
