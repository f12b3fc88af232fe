"""A trained model through each inference engine: a whole test set as scripts/translate.py translates it.

    python -m benchmarks.inference_engines --model outputs/multi30k_de_en --threads 2 --repeats 3

Engines: our generate() in fp32 (`torch`), our model after torch's dynamic int8 quantization
(`torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)`: `torch-int8`), and the
model converted by scripts/export_ctranslate2.py in float32 and int8 (`ct2-float32`, `ct2-int8`). Each
translates the test set (default Multi30k test_2016_flickr, 1000 sentences) through `inference.translate`,
the function translate.py calls, in batches of `--batch_size`, with beam 4 (the model's saved decoding)
and greedy; the engines alternate (A B C D A B C D ...) after one untimed warm-up pass, and each figure is
the median over `--repeats` passes. Printed: sentences/s, the ratio to `torch`, sacreBLEU and chrF against
the references, and the share of sentences translated exactly as `torch` does (and, for beam search, as
`torch` with early_stopping=True and renormalize_logits=True, the search CTranslate2 runs with patience 1;
generate()'s default search, early_stopping False, it approximates with patience 2). CTranslate2 runs one
worker of one thread per --threads, each batch split among them. The CPU model,
its native-bf16 flag, the command, the date and the commit are printed and written to --output_json.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks import record

ENGINES = ("torch", "torch-int8", "ct2-float32", "ct2-int8")
MULTI30K = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "multi30k" / "raw"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.inference_engines", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a trained model folder (the main job's: outputs/multi30k_de_en)")
    p.add_argument("--source", default=str(MULTI30K / "test_2016_flickr.de.gz"), help="source sentences, one per line")
    p.add_argument("--reference", default=str(MULTI30K / "test_2016_flickr.en.gz"), help="reference translations")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {','.join(ENGINES)}")
    p.add_argument("--searches", default="beam4,greedy", help="beam4 (the model's saved decoding) and/or greedy")
    p.add_argument("--threads", type=int, default=os.cpu_count(),
                   help="torch threads; CTranslate2 workers of one thread (each takes a share of a batch)")
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max_sentences", type=int, default=None, help="first N sentences only (quick checks)")
    p.add_argument("--ct2_dir", default=None, help="where the conversions go (default: a temporary folder)")
    p.add_argument("--output_json", default=None)
    p.add_argument("--record", action="store_true", help=record.RECORD_HELP.format(name="inference_engines", more=""))
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    args.searches = [s.strip() for s in args.searches.split(",") if s.strip()]
    for engine in args.engines:
        if engine not in ENGINES:
            p.error(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    for search in args.searches:
        if search not in ("beam4", "greedy"):
            p.error(f"unknown search {search!r}; choose from beam4, greedy")
    for name in ("threads", "batch_size", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    return args


def read_lines(path: str) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def build_engines(args, ct2_dir: str) -> tuple[dict, object, dict]:
    """{engine: model with generate()}, the tokenizer, and facts per engine (quantized layer counts)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import scratch_transformer  # noqa: F401  (registers the Auto classes)
    from scratch_transformer.ctranslate2_engine import CTranslate2Model, export_ctranslate2

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    engines, facts = {}, {}
    for name in args.engines:
        if name in ("torch", "torch-int8"):
            model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
            if name == "torch-int8":
                model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
                quantized = sum(isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in model.modules())
                linears = sum(type(m) is torch.nn.Linear for m in model.modules())  # left in fp32
                facts[name] = {"quantized_linear_layers": quantized, "fp32_linear_layers": linears}
            engines[name] = model
        else:
            quantization = name.split("-", 1)[1]
            folder = os.path.join(ct2_dir, quantization)
            if not os.path.isdir(folder):
                export_ctranslate2(args.model, folder, quantization=quantization)
            engines[name] = CTranslate2Model.from_pretrained(folder, inter_threads=args.threads, intra_threads=1)
            facts[name] = {"model_bin_bytes": os.path.getsize(os.path.join(folder, "model.bin"))}
    return engines, tokenizer, facts


def search_options(search: str) -> dict:
    """greedy: one beam (no length penalty); beam4: {} = the model's saved generation config."""
    return {"num_beams": 1, "length_penalty": 1.0} if search == "greedy" else {}


def main(argv=None) -> dict:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, argv)
    finally:
        torch.set_num_threads(threads)  # called from Python (tests): leave the caller's setting as it was


def _run(args, argv) -> dict:
    import sacrebleu

    from scratch_transformer.inference import translate
    from scratch_transformer.training import native_bf16_cpu

    sources, references = read_lines(args.source), read_lines(args.reference)
    if len(sources) != len(references):
        raise SystemExit(f"{args.source} has {len(sources)} lines but {args.reference} has {len(references)}")
    if args.max_sentences:
        sources, references = sources[: args.max_sentences], references[: args.max_sentences]
    with tempfile.TemporaryDirectory() as scratch:
        engines, tokenizer, facts = build_engines(args, args.ct2_dir or scratch)
        reference_model = engines.get("torch")
        results = {"searches": {}}
        for search in args.searches:
            runs = {name: {"seconds": [], "output": None} for name in engines}
            for repeat in range(args.repeats + 1):  # pass 0: warm-up, untimed
                for name, model in engines.items():
                    options = search_options(search)
                    start = time.perf_counter()
                    output = translate(model, tokenizer, sources, batch_size=args.batch_size, **options)
                    seconds = time.perf_counter() - start
                    if repeat:
                        runs[name]["seconds"].append(seconds)
                    runs[name]["output"] = output
            ct2_like = None
            if search == "beam4" and reference_model is not None:  # the search CTranslate2 runs, in torch
                ct2_like = translate(reference_model, tokenizer, sources, batch_size=args.batch_size,
                                     early_stopping=True, renormalize_logits=True)
            table = {}
            for name, run in runs.items():
                output, median = run["output"], statistics.median(run["seconds"])
                row = {"seconds": run["seconds"], "median_seconds": median,
                       "sentences_per_second": len(sources) / median,
                       "bleu": sacrebleu.corpus_bleu(output, [references]).score,
                       "chrf": sacrebleu.corpus_chrf(output, [references]).score}
                if "torch" in runs:
                    torch_output = runs["torch"]["output"]
                    row["same_as_torch"] = sum(a == b for a, b in zip(output, torch_output)) / len(sources)
                    row["speed_over_torch"] = statistics.median(runs["torch"]["seconds"]) / median
                if ct2_like is not None:
                    row["same_as_torch_early_stopping"] = sum(a == b for a, b in zip(output, ct2_like)) / len(sources)
                table[name] = row
            if ct2_like is not None:
                results["torch_early_stopping_bleu"] = sacrebleu.corpus_bleu(ct2_like, [references]).score
            results["searches"][search] = table
    bf16, bf16_evidence = native_bf16_cpu()
    from benchmarks.report import cpu_model

    results.update(
        command="python -m benchmarks.inference_engines " + " ".join(sys.argv[1:] if argv is None else argv),
        date=datetime.date.today().isoformat(), commit=_git_commit(), cpu_model=cpu_model(),
        native_bf16=bf16, native_bf16_evidence=bf16_evidence, threads=args.threads, sentences=len(sources),
        batch_size=args.batch_size, repeats=args.repeats, engine_facts=facts, model=args.model,
        torch=torch.__version__,
    )
    print(render(results))
    if args.output_json:
        Path(args.output_json).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    if args.record:
        print(f"recorded in {record.record('inference_engines', [results], key=record.cpu_of)}")
    return results


def render(results: dict) -> str:
    lines = [f"Machine: {results['cpu_model']} (native bf16: {'yes' if results['native_bf16'] else 'no'}), "
             f"{results['threads']} threads, torch {results['torch']}; {results['date']}, commit {results['commit']}.",
             f"{results['sentences']} sentences, batches of {results['batch_size']}, median of {results['repeats']} "
             "passes after a warm-up, engines alternating.", ""]
    for search, table in results["searches"].items():
        lines += [f"### {search}", "",
                  "| engine | sentences/s | x torch | BLEU | chrF | same as torch | same as torch early-stopping |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for name, row in table.items():
            def pct(key, row=row):
                return f"{100 * row[key]:.1f}%" if key in row else "n/a"

            ratio = f"{row['speed_over_torch']:.2f}" if "speed_over_torch" in row else "n/a"
            lines.append(f"| {name} | {row['sentences_per_second']:.1f} | {ratio} | {row['bleu']:.2f} | "
                         f"{row['chrf']:.2f} | {pct('same_as_torch')} | {pct('same_as_torch_early_stopping')} |")
        lines.append("")
    if "torch_early_stopping_bleu" in results:
        lines.append(f"torch with early_stopping=True, renormalize_logits=True (beam): BLEU "
                     f"{results['torch_early_stopping_bleu']:.2f}.")
    for name, fact in results["engine_facts"].items():
        lines.append(f"{name}: " + ", ".join(f"{k} {v}" for k, v in fact.items()))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
