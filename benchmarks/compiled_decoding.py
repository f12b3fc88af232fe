"""generate() with the dynamic cache, the static cache, and the static cache compiled, ours against Marian's.

Run from the repository root, with the cores free (timings):
    python -m benchmarks.compiled_decoding --threads 2 --repeats 5
    python -m benchmarks.compiled_decoding --size base --batch_sizes 1,16 --searches greedy --repeats 3
    python -m benchmarks.compiled_decoding --size tiny --repeats 1 --output_json /tmp/c.json   # a quick check

Both models get the same size (--size small: d_model 256, 4 heads, 3 + 3 layers, d_ff 1024, the Multi30k main
job's; base: the paper's 512 / 8 / 6 + 6 / 2048; tiny: a smoke test), a vocabulary of --vocab_size, shared and tied
embeddings, random weights (speed does not depend on training: every run decodes exactly --new_tokens tokens,
min_new_tokens = max_new_tokens, so both do the same number of steps) and a random source batch of
--source_length tokens. For each model, batch size and search (greedy, beam 4), generate() runs as
`dynamic` (DynamicCache, eager PyTorch), `static` (cache_implementation="static", eager PyTorch) and
`static-compiled` (the same, with generate()'s own compilation of the decoding step: CompileConfig, which
generate() applies on CPU only when told, `_compile_all_devices`; torch.compile's default inductor backend,
fullgraph). Each timing is the median of --repeats passes after an untimed warm-up pass (which holds the
compilation; its seconds are reported apart). Printed and written to --output_json: tokens/s of each,
the ratio to the same model's `dynamic`, and whether each mode's tokens equal `dynamic`'s.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks import record
from benchmarks.quality import REPO_ROOT, git_commit, machine

SIZES = {
    "tiny": dict(d_model=64, heads=4, layers=2, d_ff=128),
    "small": dict(d_model=256, heads=4, layers=3, d_ff=1024),
    "base": dict(d_model=512, heads=8, layers=6, d_ff=2048),
}
MODES = ("dynamic", "static", "static-compiled")
SEARCHES = {"greedy": 1, "beam4": 4}


def _ints(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers separated by commas, got {text!r}")
    return values


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.compiled_decoding", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--models", default="ours,marian", help="comma-separated subset of ours,marian")
    p.add_argument("--modes", default=",".join(MODES), help=f"comma-separated subset of {','.join(MODES)}")
    p.add_argument("--searches", default="greedy,beam4", help="comma-separated subset of greedy,beam4")
    p.add_argument("--batch_sizes", type=_ints, default=[1, 32])
    p.add_argument("--source_length", type=int, default=20)
    p.add_argument("--new_tokens", type=int, default=24)
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--output_json", type=Path, default=REPO_ROOT / "outputs" / "compiled_decoding.json")
    p.add_argument("--record", action="store_true", help=record.RECORD_HELP.format(name="compiled_decoding", more=", size and threads"))
    args = p.parse_args(argv)
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    args.searches = [s.strip() for s in args.searches.split(",") if s.strip()]
    if not args.models or any(m not in ("ours", "marian") for m in args.models):
        p.error("--models: a subset of ours,marian")
    if "dynamic" not in args.modes or any(m not in MODES for m in args.modes):
        p.error(f"--modes: a subset of {','.join(MODES)} that includes dynamic (the reference)")
    if not args.searches or any(s not in SEARCHES for s in args.searches):
        p.error("--searches: a subset of greedy,beam4")
    for name in ("source_length", "new_tokens", "vocab_size", "threads", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    return args


def build(name: str, size: dict, vocab_size: int, max_positions: int):
    """A random-weight model of the given size: ours, or transformers' MarianMTModel."""
    torch.manual_seed(0)
    if name == "ours":
        from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration

        config = ScratchTransformerConfig(
            vocab_size=vocab_size, d_model=size["d_model"], num_heads=size["heads"], encoder_layers=size["layers"],
            decoder_layers=size["layers"], d_ff=size["d_ff"], share_encoder_decoder_embeddings=True,
            max_position_embeddings=max_positions)
        return ScratchTransformerForConditionalGeneration(config).eval()
    from transformers import MarianConfig, MarianMTModel

    config = MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=size["d_model"],
        encoder_attention_heads=size["heads"], decoder_attention_heads=size["heads"], encoder_layers=size["layers"],
        decoder_layers=size["layers"], encoder_ffn_dim=size["d_ff"], decoder_ffn_dim=size["d_ff"],
        max_position_embeddings=max_positions, share_encoder_decoder_embeddings=True, scale_embedding=True,
        pad_token_id=0, eos_token_id=2, decoder_start_token_id=0, forced_eos_token_id=None)
    return MarianMTModel(config).eval()


def mode_options(mode: str) -> dict:
    if mode == "dynamic":
        return {}
    options = {"cache_implementation": "static"}
    if mode == "static-compiled":
        from transformers import CompileConfig

        compile_config = CompileConfig(fullgraph=True)
        compile_config._compile_all_devices = True  # generate() compiles only on accelerators unless told
        options["compile_config"] = compile_config
    else:
        options["disable_compile"] = True
    return options


@torch.no_grad()
def time_generate(model, input_ids, attention_mask, options: dict, repeats: int) -> tuple[list, float, torch.Tensor]:
    start = time.perf_counter()
    output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)  # warm-up (compiles)
    warm_up = time.perf_counter() - start
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        output = model.generate(input_ids=input_ids, attention_mask=attention_mask, **options)
        seconds.append(time.perf_counter() - start)
    return seconds, warm_up, output


def main(argv=None) -> dict:
    args = parse_args(argv)
    threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _run(args, argv)
    finally:
        torch.set_num_threads(threads)


def _run(args, argv) -> dict:
    size = SIZES[args.size]
    rows = []
    for model_name in args.models:
        model = build(model_name, size, args.vocab_size, max(64, args.source_length + args.new_tokens + 2))
        for batch_size in args.batch_sizes:
            g = torch.Generator().manual_seed(batch_size)
            input_ids = torch.randint(3, args.vocab_size, (batch_size, args.source_length), generator=g)
            attention_mask = torch.ones_like(input_ids)
            for search in args.searches:
                common = dict(num_beams=SEARCHES[search], do_sample=False, max_new_tokens=args.new_tokens,
                              min_new_tokens=args.new_tokens, early_stopping=True)
                reference = None
                for mode in args.modes:
                    torch._dynamo.reset()
                    seconds, warm_up, output = time_generate(model, input_ids, attention_mask,
                                                             {**common, **mode_options(mode)}, args.repeats)
                    if mode == "dynamic":
                        reference = output
                    median = statistics.median(seconds)
                    rows.append({
                        "model": model_name, "batch_size": batch_size, "search": search, "mode": mode,
                        "seconds": seconds, "median_seconds": median, "warm_up_seconds": warm_up,
                        "new_tokens_per_second": batch_size * args.new_tokens / median,
                        "same_tokens_as_dynamic": bool(torch.equal(output, reference)),
                    })
    for row in rows:
        dynamic = next(r for r in rows if r["mode"] == "dynamic" and all(
            r[k] == row[k] for k in ("model", "batch_size", "search")))
        row["speed_over_dynamic"] = dynamic["median_seconds"] / row["median_seconds"]
    result = {
        "benchmark": "compiled_decoding",
        "command": "python -m benchmarks.compiled_decoding " + " ".join(sys.argv[1:] if argv is None else argv),
        "date": datetime.date.today().isoformat(), "commit": git_commit(), "machine": machine(),
        "torch": torch.__version__, "threads": args.threads, "size": {"name": args.size, **size},
        "source_length": args.source_length, "new_tokens": args.new_tokens, "vocab_size": args.vocab_size,
        "repeats": args.repeats, "rows": rows,
    }
    lines = [f"{args.size} size, {args.threads} threads, {result['machine']['cpu_model']}, commit {result['commit']}; "
             f"sources of {args.source_length} tokens, {args.new_tokens} new tokens; median of {args.repeats}", "",
             "| model | batch | search | mode | new tokens/s | x dynamic | warm-up s | same tokens |",
             "|---|---:|---|---|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch_size']} | {r['search']} | {r['mode']} | "
                     f"{r['new_tokens_per_second']:.0f} | {r['speed_over_dynamic']:.2f} | {r['warm_up_seconds']:.1f} | "
                     f"{'yes' if r['same_tokens_as_dynamic'] else 'NO'} |")
    print("\n".join(lines))
    args.output_json.parent.mkdir(parents=True, exist_ok=True)
    args.output_json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    if args.record:
        path = record.record("compiled_decoding", [result],
                             key=lambda run: (record.cpu_of(run), run["size"]["name"], run["threads"]))
        print(f"recorded in {path}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
