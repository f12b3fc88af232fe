"""The data pipeline at scale: time and peak memory of every stage up to the first training step.

For each size, a synthetic parallel corpus (nothing is fetched) is written as a folder of line-aligned files
(`train.de`, `train.en`, `val.de`, `val.en`), the folder form that `--dataset_name` reads; then a fresh child
process runs the main job's steps on it (configs/multi30k_de_en.json with that folder, one training step, no
evaluation, nothing saved), and a second child reruns them on the same datasets cache (the cached rerun),
after the first run's files have been flushed to disk (os.sync; its seconds are reported as
sync_seconds_before_rerun). With --cold_rerun a third child reruns them once more after the kernel's page cache
has been emptied (Linux, root: /proc/sys/vm/drop_caches), the worst case of a rerun, whose every file (the
libraries imported included) comes from the disk; how warm the page cache is otherwise depends on the machine
and on what ran before.

Usage (from the repository root):
    python -m benchmarks.data_scale --pairs 100000,1000000,4500000
    python -m benchmarks.data_scale --pairs 2000 --work_dir /tmp/ds --output_json /tmp/ds.json
    python -m benchmarks.data_scale --pairs 1000000 --cold_rerun     # also a rerun from an empty page cache

The corpus: sentence lengths in words drawn from a lognormal of mean 25 words (sigma 0.5, cut to 1..150),
the target's length the source's times a lognormal factor (sigma 0.15); words drawn from a Zipf law
(exponent 1.0) over a vocabulary of 500,000 random letter strings per language, so that the number of word
types grows with the corpus as in real text (which is what BPE training's memory depends on); the words are
made of 1..4 syllables from a Zipf-distributed inventory, so that BPE finds pieces to share (about 1.5-2
tokens a word, as in WMT with a joint vocabulary), the most frequent words the shortest.

Stages, each timed in the child (seconds) with its peak resident set size (VmHWM of /proc/self/status, reset
by writing 5 to /proc/self/clear_refs at the stage's start; the peak so far where that is not possible):
    startup     importing torch, transformers, datasets and the package
    load        translation.load_data: the files into Arrow (datasets cache), normalised
    tokenizer   the joint BPE: trained from Arrow batches, or loaded from the cache
    model       the model built from the config (main job's size)
    tokenize    every split tokenised by batched map (--preprocessing_num_workers), or loaded from the cache
    trainer     the Trainer built (with --max_tokens_per_batch: the token batches packed)
    batches     the training DataLoader: the sampler's epoch order (lengths from Arrow) and the first batch
    first_step  trainer.train() up to the end of its first optimizer step
Worker processes of the tokenising map are reported apart (children_peak_rss_mb: the largest of them).

Goals reported against (from the issue): time linear in pairs (data stages' seconds per million pairs within
1.5x across sizes), peak RSS under 6 GB at 4.5M pairs, first training step within 15 minutes at 4.5M pairs on
2 cores, cached rerun within 1 minute.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import record

START = time.perf_counter()
REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_DIR = Path(__file__).resolve().parent
STAGES = ("startup", "load", "tokenizer", "model", "tokenize", "trainer", "batches", "first_step")
DATA_STAGES = ("load", "tokenizer", "tokenize", "trainer", "batches")  # the stages that grow with the pairs
CORPUS_VERSION = 2
VOCABULARY = 500_000
MEAN_WORDS, SIGMA_WORDS, SIGMA_RATIO, ZIPF = 25.0, 0.5, 0.15, 1.0
VALIDATION_PAIRS = 1000
GOALS = {"peak_rss_gb_at_4.5M": 6.0, "first_step_minutes_at_4.5M": 15.0, "rerun_minutes": 1.0,
         "linearity_ratio": 1.5}


# ------------------------------------------------------------------------------------------ the corpus


def _vocabulary(rng, consonants: str, vowels: str, size: int) -> list[str]:
    """`size` distinct words of 1..4 syllables (consonant, vowel, optional consonant; syllables drawn from a Zipf
    law over the inventory, so that words share pieces as real words share stems and endings), shortest first:
    the most frequent ranks get the shortest words, as in real text."""
    import numpy as np

    inventory = np.array([c + v + e for c in consonants for v in vowels for e in ("", *consonants)])
    inventory = inventory[rng.permutation(len(inventory))]
    weights = 1.0 / np.arange(1, len(inventory) + 1)
    cdf = np.cumsum(weights) / weights.sum()
    words: dict[str, None] = {}
    while len(words) < size:
        n = 2 * (size - len(words))
        counts = np.clip(1 + rng.poisson(1.2, n), 1, 4)
        pieces = inventory[np.searchsorted(cdf, rng.random(int(counts.sum())), side="right")].tolist()
        ends = np.cumsum(counts).tolist()
        words.update(dict.fromkeys("".join(pieces[end - k : end]) for end, k in zip(ends, counts.tolist())))
    return sorted(list(words)[:size], key=len)


def _sentences(rng, vocab: list[str], cdf, lengths) -> list[str]:
    """One sentence per entry of `lengths` (words), words drawn from the Zipf `cdf` over `vocab`."""
    import numpy as np

    ids = np.searchsorted(cdf, rng.random(int(lengths.sum())), side="right")
    words = [vocab[i] for i in ids.tolist()]
    out, start = [], 0
    for n in lengths.tolist():
        out.append(" ".join(words[start : start + n]) + " .")
        start += n
    return out


def make_corpus(folder: Path, pairs: int, seed: int = 0, chunk: int = 100_000) -> dict:
    """Write the synthetic corpus of `pairs` training pairs (and VALIDATION_PAIRS validation pairs) into
    `folder`, unless it holds that corpus already (corpus.json). Returns its description (words, bytes)."""
    import numpy as np

    spec = {"version": CORPUS_VERSION, "pairs": pairs, "seed": seed, "vocabulary": VOCABULARY,
            "mean_words": MEAN_WORDS, "zipf": ZIPF}
    meta = folder / "corpus.json"
    if meta.is_file() and json.loads(meta.read_text()).get("spec") == spec:
        return json.loads(meta.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    vocabs = {"de": _vocabulary(rng, "bcdfghklmnprstwzß", "aeiouäöü", VOCABULARY),
              "en": _vocabulary(rng, "bcdfghklmnprstvwy", "aeiou", VOCABULARY)}
    weights = 1.0 / np.arange(1, VOCABULARY + 1) ** ZIPF
    cdf = np.cumsum(weights) / weights.sum()
    mu = np.log(MEAN_WORDS) - SIGMA_WORDS ** 2 / 2  # the lognormal's mean is MEAN_WORDS
    words = 0
    for split, n in (("train", pairs), ("val", VALIDATION_PAIRS)):
        handles = {lang: open(folder / f"{split}.{lang}", "w", encoding="utf-8") for lang in vocabs}
        try:
            for offset in range(0, n, chunk):
                k = min(chunk, n - offset)
                source = np.clip(np.rint(rng.lognormal(mu, SIGMA_WORDS, k)), 1, 150).astype(np.int64)
                target = np.clip(np.rint(source * rng.lognormal(0.0, SIGMA_RATIO, k)), 1, 150).astype(np.int64)
                for lang, lengths in (("de", source), ("en", target)):
                    handles[lang].write("\n".join(_sentences(rng, vocabs[lang], cdf, lengths)) + "\n")
                    words += int(lengths.sum()) if split == "train" else 0
        finally:
            for handle in handles.values():
                handle.close()
    info = {"spec": spec, "train_words": words, "bytes": sum(p.stat().st_size for p in folder.glob("*.??")),
            "seconds": time.perf_counter() - start}
    meta.write_text(json.dumps(info, indent=1))
    return info


# ------------------------------------------------------------------------------------------ the child


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")
        return True
    except OSError:
        return False


def _peak_rss_mb() -> float:
    try:
        with open("/proc/self/status") as handle:
            for line in handle:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def run_stages(dataset: str, output_dir: str, config: str, extra_flags: list[str]) -> dict:
    """The main job's steps up to its first training step on `dataset`, timed stage by stage (see the module
    docstring). Returns {"stages": {name: {"seconds", "peak_rss_mb"}}, "children_peak_rss_mb", "log": [...]}."""
    stages: dict[str, dict] = {}
    resettable = _reset_peak()
    import logging

    import torch  # noqa: F401  (startup: the libraries the run imports)
    from transformers import TrainerCallback

    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import train_translation

    from scratch_transformer import translation
    from scratch_transformer.training import WallClockBudgetCallback

    stages["startup"] = {"seconds": time.perf_counter() - START, "peak_rss_mb": _peak_rss_mb()}
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(f"{record.name}: {record.getMessage()}")

    logging.getLogger("scratch_transformer").addHandler(Keep())
    logging.getLogger("scratch_transformer").setLevel(logging.INFO)

    flags = [config, "--dataset_name", dataset, "--validation_split", "val", "--test_split", "val",
             "--output_dir", output_dir, "--do_eval", "false", "--do_predict", "false", "--max_steps", "1",
             "--eval_strategy", "no", "--save_strategy", "no", "--report_to", "none", "--disable_tqdm", "true",
             *extra_flags]
    model_args, data_args, training_args = train_translation.parse_args(flags)

    def stage(name, function, *args, **kwargs):
        _reset_peak()
        start = time.perf_counter()
        value = function(*args, **kwargs)
        stages[name] = {"seconds": time.perf_counter() - start, "peak_rss_mb": _peak_rss_mb()}
        return value

    raw = stage("load", translation.load_data, data_args, training_args)
    tokenizer = stage("tokenizer", translation._build_tokenizer, model_args, data_args, raw, training_args)
    model = stage("model", translation._build_model, model_args, tokenizer)
    tokenized = stage("tokenize", translation._tokenize, raw, tokenizer, data_args, training_args)
    budget = WallClockBudgetCallback(training_args.max_train_minutes) if training_args.max_train_minutes else None
    decoding = translation._resolve_decoding(model_args, data_args, model)
    trainer, _ = stage("trainer", translation.build_trainer, model, tokenizer, raw, data_args, training_args,
                       decoding, budget, tokenized=tokenized)

    def first_batch():
        batch = next(iter(trainer.get_train_dataloader()))
        return {name: list(tensor.shape) for name, tensor in batch.items()}

    batch_shapes = stage("batches", first_batch)

    class FirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if "first_step" not in stages:
                stages["first_step"] = {"seconds": time.perf_counter() - start, "peak_rss_mb": _peak_rss_mb()}
            control.should_training_stop = True

    trainer.add_callback(FirstStep())
    _reset_peak()
    start = time.perf_counter()
    trainer.train()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"stages": stages, "children_peak_rss_mb": children, "peak_reset": resettable,
            "train_pairs": len(tokenized[data_args.train_split]), "first_batch": batch_shapes,
            "vocab_size": len(tokenizer), "log": records}


# ------------------------------------------------------------------------------------------ the parent


def _child(folder: Path, cache: Path, output_dir: Path, args) -> dict:
    """One run of `run_stages` in a fresh process with its datasets cache in `cache`."""
    shutil.rmtree(output_dir, ignore_errors=True)
    result = output_dir.parent / f"{output_dir.name}.json"
    env = dict(os.environ, HF_DATASETS_CACHE=str(cache), TOKENIZERS_PARALLELISM=os.environ.get(
        "TOKENIZERS_PARALLELISM", "true"), PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "benchmarks.data_scale", "--child", "--dataset", str(folder), "--output_dir",
               str(output_dir), "--child_result", str(result), "--config", args.config]
    command += ["--flags", *args.flags] if args.flags else []
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"the stage run on {folder} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-6000:]}")
    out = json.loads(result.read_text())
    out["wall_seconds"] = wall
    out["to_first_step_seconds"] = sum(stage["seconds"] for stage in out["stages"].values())
    out["peak_rss_mb"] = max(stage["peak_rss_mb"] for stage in out["stages"].values())
    return out


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_page_cache(path: Path = DROP_CACHES) -> None:
    """Flush written files to disk, then empty the kernel's page cache (Linux: write 1 to `path`).

    Raises:
        RuntimeError: the page cache cannot be emptied here (not Linux, or not root); names the file.
    """
    os.sync()
    try:
        with open(path, "w", encoding="ascii") as handle:
            handle.write("1\n")
    except OSError as error:
        raise RuntimeError(f"--cold_rerun empties the page cache by writing to {path}, which failed ({error}): "
                           f"it needs Linux and root; run without --cold_rerun") from error


def measure(pairs: int, args) -> dict:
    """Corpus, first run (empty cache) and, unless --no-rerun, the cached rerun, for one size."""
    work = Path(args.work_dir)
    folder = work / f"corpus_{pairs}"
    corpus = make_corpus(folder, pairs, seed=args.seed)
    cache = work / f"hf_datasets_cache_{pairs}"
    shutil.rmtree(cache, ignore_errors=True)  # the first run starts from nothing
    entry = {"pairs": pairs, "corpus": corpus, "first": _child(folder, cache, work / f"run_{pairs}", args)}
    if args.rerun:
        # The first run leaves gigabytes of Arrow files written but not yet on disk; the kernel flushes them
        # in the background, and reads made meanwhile wait behind the writes. A user's rerun comes later:
        # flush first (the seconds are reported), so that the rerun measures the pipeline, not the flush.
        start = time.perf_counter()
        os.sync()
        entry["sync_seconds_before_rerun"] = time.perf_counter() - start
        entry["rerun"] = _child(folder, cache, work / f"rerun_{pairs}", args)
        if args.cold_rerun:
            drop_page_cache()
            entry["cold_rerun"] = _child(folder, cache, work / f"cold_rerun_{pairs}", args)
    if not args.keep:
        shutil.rmtree(cache, ignore_errors=True)
        for name in (f"run_{pairs}", f"rerun_{pairs}", f"cold_rerun_{pairs}"):
            shutil.rmtree(work / name, ignore_errors=True)
    return entry


def goals(entries: list[dict]) -> dict:
    """Each goal of the issue: the figure, the bound and whether it is met (None where its size was not run)."""
    out = {}
    per_million = {e["pairs"]: sum(e["first"]["stages"][s]["seconds"] for s in DATA_STAGES) / e["pairs"] * 1e6
                   for e in entries}
    if len(per_million) > 1:
        ratio = max(per_million.values()) / min(per_million.values())
        out["linear_in_pairs"] = {"data_stage_seconds_per_million_pairs": per_million, "max_over_min": ratio,
                                  "bound": GOALS["linearity_ratio"], "met": ratio <= GOALS["linearity_ratio"]}
    else:
        out["linear_in_pairs"] = {"data_stage_seconds_per_million_pairs": per_million, "met": None,
                                  "note": "needs two sizes or more"}
    big = next((e for e in entries if e["pairs"] == 4_500_000), None)
    if big is None:
        out["peak_rss_at_4.5M"] = out["first_step_at_4.5M"] = {"met": None, "note": "run --pairs 4500000"}
    else:
        peak = max(big["first"]["peak_rss_mb"], big["first"]["children_peak_rss_mb"]) / 1024
        out["peak_rss_at_4.5M"] = {"gb": peak, "bound": GOALS["peak_rss_gb_at_4.5M"],
                                   "met": peak < GOALS["peak_rss_gb_at_4.5M"]}
        minutes = big["first"]["to_first_step_seconds"] / 60
        out["first_step_at_4.5M"] = {"minutes": minutes, "bound": GOALS["first_step_minutes_at_4.5M"],
                                     "met": minutes <= GOALS["first_step_minutes_at_4.5M"]}
    reruns = {e["pairs"]: e["rerun"]["to_first_step_seconds"] / 60 for e in entries if "rerun" in e}
    out["cached_rerun"] = {"minutes": reruns, "bound": GOALS["rerun_minutes"],
                           "met": all(m <= GOALS["rerun_minutes"] for m in reruns.values()) if reruns else None}
    cold = {e["pairs"]: e["cold_rerun"]["to_first_step_seconds"] / 60 for e in entries if "cold_rerun" in e}
    if cold:  # the worst case, reported beside the goal (which is judged on the rerun as the machine left it)
        out["cached_rerun"]["cold_page_cache_minutes"] = cold
    return out


def table(entries: list[dict]) -> str:
    """The printed table: one row per stage, seconds and peak RSS (MB) of each size's first run and rerun."""
    runs = [(f"{e['pairs']:,} {kind.replace('_', ' ')}", e[kind]) for e in entries
            for kind in ("first", "rerun", "cold_rerun") if kind in e]
    head = f"{'stage':<12}" + "".join(f"{name:>26}" for name, _ in runs)
    lines = [head, f"{'':<12}" + "".join(f"{'s':>14}{'peak MB':>12}" for _ in runs)]
    for name in STAGES:
        lines.append(f"{name:<12}" + "".join(f"{run['stages'][name]['seconds']:>14.2f}"
                                             f"{run['stages'][name]['peak_rss_mb']:>12.0f}" for _, run in runs))
    lines.append(f"{'total':<12}" + "".join(f"{run['to_first_step_seconds']:>14.2f}{run['peak_rss_mb']:>12.0f}"
                                             for _, run in runs))
    lines.append(f"{'workers':<12}" + "".join(f"{'':>14}{run['children_peak_rss_mb']:>12.0f}" for _, run in runs))
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.data_scale", description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", default="100000", help="comma-separated corpus sizes in training pairs")
    p.add_argument("--work_dir", default=str(REPO_ROOT / "outputs" / "data_scale"),
                   help="corpora, datasets caches and run folders (corpora are kept and reused)")
    p.add_argument("--output_json", default=str(BENCHMARKS_DIR.parent / "outputs" / "data_scale.json"))
    p.add_argument("--record", action="store_true", help=record.RECORD_HELP.format(name="data_scale", more=""))
    p.add_argument("--config", default=str(REPO_ROOT / "configs" / "multi30k_de_en.json"),
                   help="the run's settings; the dataset, splits and step count are set by the benchmark")
    p.add_argument("--no-rerun", dest="rerun", action="store_false", help="skip the cached rerun")
    p.add_argument("--cold_rerun", action="store_true",
                   help="also rerun after emptying the page cache (Linux, root): every file read from the disk")
    p.add_argument("--keep", action="store_true", help="keep the datasets caches and run folders")
    p.add_argument("--seed", type=int, default=0, help="the corpus's seed")
    p.add_argument("--flags", nargs=argparse.REMAINDER, default=[],
                   help="training flags passed on to the run, last, e.g. --flags --preprocessing_num_workers 2")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dataset", help=argparse.SUPPRESS)
    p.add_argument("--output_dir", help=argparse.SUPPRESS)
    p.add_argument("--child_result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    try:
        args.pairs = [int(x.replace("_", "")) for x in args.pairs.split(",") if x.strip()]
    except ValueError:
        p.error(f"--pairs must be comma-separated whole numbers, got {args.pairs!r}")
    if args.cold_rerun and not args.rerun:
        p.error("--cold_rerun is a second rerun: it cannot go with --no-rerun")
    if not args.pairs or any(n < 1 for n in args.pairs):
        p.error(f"--pairs must name sizes >= 1, got {args.pairs}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.child:
        result = run_stages(args.dataset, args.output_dir, args.config, args.flags)
        Path(args.child_result).write_text(json.dumps(result, indent=1))
        return result
    entries = []
    for pairs in args.pairs:
        print(f"{pairs:,} pairs ...", flush=True)
        entries.append(measure(pairs, args))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    env = {k: os.environ[k] for k in ("OMP_NUM_THREADS", "RAYON_NUM_THREADS") if k in os.environ}
    from benchmarks.report import cpu_model

    result = {"machine": {"cpus": cpus, "cpu_model": cpu_model(),
                          "processor": platform.processor() or platform.machine(),
                          "python": platform.python_version(), "env": env},
              "command": " ".join(["python -m benchmarks.data_scale", *(argv if argv is not None else sys.argv[1:])]),
              "sizes": entries, "goals": goals(entries)}
    print(f"CPU: {result['machine']['cpu_model']}, {cpus} cores")
    print(table(entries))
    for name, goal in result["goals"].items():
        print(f"{name}: {'met' if goal['met'] else 'not met' if goal['met'] is False else 'not measured'} "
              f"{ {k: v for k, v in goal.items() if k != 'met'} }")
    Path(args.output_json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output_json).write_text(json.dumps(result, indent=1))
    print(f"written {args.output_json}")
    if args.record:
        print(f"recorded in {record.record('data_scale', [record.stamped(result)], key=record.cpu_of)}")
    return result


if __name__ == "__main__":
    main()
