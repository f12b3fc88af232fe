"""A trained model exported with transformers' own exporter, decoding greedily beside generate() and CTranslate2.

Run from the repository root:
    python -m benchmarks.exported_decoding --model outputs/multi30k_de_en --threads 2 --repeats 3
    python -m benchmarks.exported_decoding --model outputs/multi30k_de_en --max_sentences 100 --repeats 0

The exporter is transformers.integrations.executorch.Seq2SeqLMExportableModule: torch.export (strict) of the
encoder, with a dynamic source length, and of one decoding step over a static cache (batch 1,
--max_cache_length slots). Its own generate() starts from id 0 (T5's start token), so the greedy loop here is
its loop with the model's decoder_start_token_id: encoder once, then argmax of the exported step until the end
token or --max_new_tokens. Each sentence of the test set (default Multi30k test_2016_flickr) is translated
one at a time (the exported program's batch is 1) by: `generate` (model.generate, greedy, dynamic cache),
`exported` (the loop above) and `ct2-float32` (scripts/export_ctranslate2.py's conversion, greedy, batch 1),
all in float32 after an untimed warm-up pass, engines alternating, the median of --repeats passes.
Reported: the share of sentences whose exported token ids equal generate()'s (and CTranslate2's decoded text
equal to generate()'s), sentences/s of each engine and the ratio to `generate`, BLEU of each. --repeats 0
measures agreement only (no timing). Written to --output_json (default
outputs/exported_decoding.json; with --record also benchmarks/results/exported_decoding.json).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.inference_engines import MULTI30K, read_lines
from benchmarks import record
from benchmarks.quality import REPO_ROOT, git_commit, machine

ENGINES = ("generate", "exported", "ct2-float32")


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.exported_decoding", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--model", required=True, help="a trained model folder (the main job's: outputs/multi30k_de_en)")
    p.add_argument("--source", default=str(MULTI30K / "test_2016_flickr.de.gz"))
    p.add_argument("--reference", default=str(MULTI30K / "test_2016_flickr.en.gz"))
    p.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated subset of {','.join(ENGINES)}")
    p.add_argument("--max_sentences", type=int, default=None, help="first N sentences only")
    p.add_argument("--max_new_tokens", type=int, default=64)
    p.add_argument("--max_cache_length", type=int, default=128, help="static cache slots of the exported step")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=3, help="timed passes; 0 = agreement only")
    p.add_argument("--output_json", type=Path, default=REPO_ROOT / "outputs" / "exported_decoding.json")
    p.add_argument("--record", action="store_true", help=record.RECORD_HELP.format(name="exported_decoding", more=""))
    args = p.parse_args(argv)
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if "generate" not in args.engines or any(e not in ENGINES for e in args.engines):
        p.error(f"--engines: a subset of {','.join(ENGINES)} that includes generate")
    for name in ("max_new_tokens", "max_cache_length", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.repeats < 0:
        p.error("--repeats must be >= 0")
    if args.max_new_tokens >= args.max_cache_length:
        p.error("--max_new_tokens must be smaller than --max_cache_length (the static cache holds every step)")
    return args


class ExportedGreedy:
    """The model exported by transformers' Seq2SeqLMExportableModule, decoding greedily (batch 1)."""

    def __init__(self, model, max_source_length: int, max_cache_length: int):
        from transformers.integrations.executorch import Seq2SeqLMExportableModule

        self.start, self.eos = model.config.decoder_start_token_id, model.config.eos_token_id
        exporter = Seq2SeqLMExportableModule(model, batch_size=1, max_hidden_seq_length=max_source_length,
                                             max_cache_length=max_cache_length)
        exporter.export(encoder_input_ids=torch.ones(1, 8, dtype=torch.long),
                        decoder_input_ids=torch.tensor([[self.start]]))
        self.encoder = exporter.exported_encoder.module()
        self.decoder = exporter.exported_decoder.module()

    @torch.no_grad()
    def __call__(self, input_ids: torch.Tensor, max_new_tokens: int) -> list[int]:
        """input_ids (1, s) -> [start, y1, ..., eos]; the exported step's argmax, as generate() picks."""
        hidden = self.encoder(input_ids)  # (1, s, d)
        tokens = [self.start]
        for position in range(max_new_tokens):
            logits = self.decoder(torch.tensor([[tokens[-1]]]), hidden, torch.tensor([position]))  # (1, 1, v)
            tokens.append(int(logits[0, -1].argmax()))
            if tokens[-1] == self.eos:
                break
        return tokens


def main(argv=None) -> dict:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, argv)
    finally:
        torch.set_num_threads(threads)


def _run(args, argv) -> dict:
    import sacrebleu
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import scratch_transformer  # noqa: F401  (registers the Auto classes)
    from scratch_transformer.ctranslate2_engine import CTranslate2Model, export_ctranslate2
    from scratch_transformer.inference import translate

    sources, references = read_lines(args.source), read_lines(args.reference)
    if args.max_sentences:
        sources, references = sources[: args.max_sentences], references[: args.max_sentences]
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model).eval()
    encoded = [tokenizer([s], return_tensors="pt", truncation=True,
                         max_length=model.config.max_position_embeddings)["input_ids"] for s in sources]
    greedy = dict(num_beams=1, do_sample=False, max_new_tokens=args.max_new_tokens, max_length=None,
                  no_repeat_ngram_size=0, repetition_penalty=1.0, length_penalty=1.0)
    start = time.perf_counter()
    exported = ExportedGreedy(model, max(ids.size(1) for ids in encoded) + 1, args.max_cache_length) \
        if "exported" in args.engines else None
    export_seconds = time.perf_counter() - start

    def run_generate():
        with torch.no_grad():
            return [model.generate(input_ids=ids, **greedy)[0].tolist() for ids in encoded]

    def run_exported():
        return [exported(ids, args.max_new_tokens) for ids in encoded]

    with tempfile.TemporaryDirectory() as scratch:
        engines = {"generate": run_generate}
        if exported is not None:
            engines["exported"] = run_exported
        if "ct2-float32" in args.engines:
            folder = export_ctranslate2(args.model, os.path.join(scratch, "float32"), quantization="float32")
            ct2 = CTranslate2Model.from_pretrained(folder, inter_threads=1, intra_threads=args.threads)
            engines["ct2-float32"] = lambda: translate(ct2, tokenizer, sources, batch_size=1, num_beams=1,
                                                       max_new_tokens=args.max_new_tokens, length_penalty=1.0)
        outputs, seconds = {}, {name: [] for name in engines}
        for repeat in range(args.repeats + 1):  # pass 0: warm-up and the outputs, untimed
            for name, run in engines.items():
                begin = time.perf_counter()
                output = run()
                if repeat:
                    seconds[name].append(time.perf_counter() - begin)
                outputs[name] = output

    def text(output):
        return output if isinstance(output[0], str) else [
            t.strip() for t in tokenizer.batch_decode(output, skip_special_tokens=True)]

    reference_tokens, reference_text = outputs["generate"], text(outputs["generate"])
    table = {}
    for name, output in outputs.items():
        row = {"bleu": sacrebleu.corpus_bleu(text(output), [references]).score,
               "same_text_as_generate": sum(a == b for a, b in zip(text(output), reference_text)) / len(sources)}
        if not isinstance(output[0], str):
            row["same_ids_as_generate"] = sum(a == b for a, b in zip(output, reference_tokens)) / len(sources)
        if seconds[name]:
            median = statistics.median(seconds[name])
            row.update(seconds=seconds[name], median_seconds=median, sentences_per_second=len(sources) / median,
                       speed_over_generate=statistics.median(seconds["generate"]) / median)
        table[name] = row
    result = {
        "benchmark": "exported_decoding",
        "command": "python -m benchmarks.exported_decoding " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.date.today().isoformat(), "commit": git_commit(), "machine": machine(),
        "torch": torch.__version__, "threads": args.threads, "model": args.model, "sentences": len(sources),
        "repeats": args.repeats, "export_seconds": export_seconds, "engines": table,
    }
    lines = [f"{len(sources)} sentences, one at a time, greedy; {args.threads} threads; "
             f"{result['machine']['cpu_model']}; commit {result['commit']}", "",
             "| engine | same ids as generate | same text as generate | BLEU | sentences/s | x generate |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, row in table.items():
        ids = f"{100 * row['same_ids_as_generate']:.1f}%" if "same_ids_as_generate" in row else "n/a"
        speed = f"{row['sentences_per_second']:.1f} | {row['speed_over_generate']:.2f}" if "median_seconds" in row \
            else "- | -"
        lines.append(f"| {name} | {ids} | {100 * row['same_text_as_generate']:.1f}% | {row['bleu']:.2f} | {speed} |")
    print("\n".join(lines))
    args.output_json.parent.mkdir(parents=True, exist_ok=True)
    args.output_json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.record:
        path = record.record("exported_decoding", [result], key=lambda run: (record.cpu_of(run),))
        print(f"recorded in {path}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
