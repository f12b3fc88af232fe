"""The GPU run in one command: the model's checks on the device, the attention kernels against eager, the main job
trained in bf16 autocast, generate() with the dynamic and the compiled static cache, and the WMT 2014 base step.

Run from the repository root on a GPU machine (no network needed; docs/compatibility.md says what to carry):
    python benchmarks/gpu_check.py
    python benchmarks/gpu_check.py --device cpu --tiny --results_dir outputs/gpu_rehearsal   # the CPU rehearsal

Each part is one or more rows of one table (printed at the end, and written with everything measured to
--results_dir/gpu.json, keyed by device and size: benchmarks/record.py). A part that fails gives a FAIL row with its
one-line error and the others still run; the exit status is 1 when any row failed. A row with "-" is a note or a
check skipped (its figures say why): e.g. the installed versions outside pyproject's ranges (`datasets` absent).

  model      on the device, fp32: logits and gradients equal the CPU's (atol 1e-4), a save/load round trip gives
             the same logits, a padded batch gives each row's logits alone, greedy and beam-3 generate() give the
             CPU's ids
  attention  sdpa, flex_attention and flash_attention_2/3 (where installed) against eager on the device:
             logits in fp32 (flash: bf16, which it needs) and greedy ids
  train      the main job (configs/multi30k_de_en.json: model, batch, optimizer, schedule, label smoothing) in bf16
             autocast on Multi30k for --train_seconds: scripts/train_translation.py where `datasets` is installed,
             else the same model, batches and optimizer through transformers' Seq2SeqTrainer on in-memory lists
             (the gz files read directly); steps/s, (source + target) tokens/s, first and last logged loss
  generate   the trained model on the first 64 validation sentences, exactly --new_tokens new tokens each:
             greedy and beam 4, dynamic cache against the static cache compiled (generate()'s CompileConfig):
             new tokens/s and whether the ids agree
  wmt14      a training step (forward, label-smoothed loss, backward, fused AdamW) of the WMT 2014 base config
             (configs/wmt14_en_de_base.json: 512 / 8 heads / 6 + 6 / 2048, 37000 ids, shared embeddings) in bf16
             autocast on 3125 + 3125 tokens (one of the recipe's 8 processes) and on 25000 + 25000 (one GPU), in
             sentences of 30 tokens: ms/step against the FLOP estimate of docs/scale_out.md (benchmarks/flops.py)
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import importlib.util
import json
import math
import platform
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
if str(REPO_ROOT) not in sys.path:  # `python benchmarks/gpu_check.py` without the package installed
    sys.path.insert(0, str(REPO_ROOT))

import torch  # noqa: E402

# Dense bf16 peaks (TFLOP/s) that docs/scale_out.md assumes; the estimate there is 30-40% of the peak.
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}
DOC_UTILISATION = (0.30, 0.40)
DOC_HOST_MS = (10.0, 20.0)  # docs/scale_out.md: host time per step in eager PyTorch, 800-1,100 launched operators
MAIN_CONFIG = REPO_ROOT / "configs" / "multi30k_de_en.json"
WMT_CONFIG = REPO_ROOT / "configs" / "wmt14_en_de_base.json"
DATA_CANDIDATES = (REPO_ROOT / "outputs" / "multi30k", REPO_ROOT.parent / "shared" / "data" / "multi30k" / "raw")
DATA_FILES = [f"{split}.{lang}.gz" for split in ("train", "val", "test_2016_flickr") for lang in ("de", "en")]
TINY = "d_model=32,num_heads=4,encoder_layers=1,decoder_layers=1,d_ff=64,dropout=0.0"


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (the rehearsal)")
    p.add_argument("--tiny", action="store_true", help="tiny sizes and few steps everywhere: a rehearsal")
    p.add_argument("--data", type=Path, default=None,
                   help="Multi30k's raw folder ({split}.{lang}.gz); default: outputs/multi30k, else "
                        "../shared/data/multi30k/raw")
    p.add_argument("--train_seconds", type=float, default=None, help="training time (default 120; --tiny: 3)")
    p.add_argument("--train_loop", choices=("auto", "main_job", "trainer"), default="auto",
                   help="auto: the main job's script where `datasets` is installed, else Seq2SeqTrainer on lists")
    p.add_argument("--attention", default="eager,sdpa,flex_attention,flash_attention_2,flash_attention_3",
                   help="implementations compared with eager (those not installed are skipped)")
    p.add_argument("--compile", default="true", choices=("true", "false"),
                   help="also time the compiled static cache (false: the rehearsal's quick run)")
    p.add_argument("--new_tokens", type=int, default=None, help="tokens generate() makes per sentence (32; --tiny 4)")
    p.add_argument("--parts", default="model,attention,train,generate,wmt14", help="the parts to run")
    p.add_argument("--results_dir", type=Path, default=None,
                   help="where gpu.json goes (default benchmarks/results; with --tiny outputs/gpu_rehearsal)")
    p.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's own choice)")
    args = p.parse_args(argv)
    try:
        device = torch.device(args.device)
    except RuntimeError:
        p.error(f"--device {args.device!r}: not a torch device (cuda, cuda:0, cpu)")
    if device.type not in ("cuda", "cpu"):
        p.error(f"--device {args.device!r}: this check runs on cuda or cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device (torch.cuda.is_available() is False); "
                "use --device cpu --tiny to rehearse")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        p.error(f"--device {args.device}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    args.train_seconds = args.train_seconds if args.train_seconds is not None else (3.0 if args.tiny else 120.0)
    args.new_tokens = args.new_tokens if args.new_tokens is not None else (4 if args.tiny else 32)
    if args.train_seconds <= 0 or args.new_tokens < 1:
        p.error("--train_seconds must be > 0 and --new_tokens >= 1")
    args.parts = [x.strip() for x in args.parts.split(",") if x.strip()]
    unknown = set(args.parts) - set(PARTS)
    if unknown:
        p.error(f"--parts: unknown {', '.join(sorted(unknown))}; choose from {', '.join(PARTS)}")
    args.attention = [x.strip() for x in args.attention.split(",") if x.strip()]
    if args.results_dir is None and args.tiny:  # a rehearsal's figures are not results
        args.results_dir = REPO_ROOT / "outputs" / "gpu_rehearsal"
    if args.data is None:
        args.data = next((d for d in DATA_CANDIDATES if (d / "train.de.gz").is_file()), DATA_CANDIDATES[-1])
    if {"train", "generate"} & set(args.parts):
        missing = [f for f in DATA_FILES if not (args.data / f).is_file()]
        if missing:
            p.error(f"--data {args.data}: missing {', '.join(missing)} (Multi30k's raw folder; see "
                    "docs/compatibility.md for the copy that travels with the tree)")
    return args


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment(device) -> dict:
    env = {"python": platform.python_version(), "device": str(device),
           **{name: version(name) if importlib.util.find_spec(name) else None
              for name in ("torch", "transformers", "tokenizers", "accelerate", "datasets", "huggingface_hub",
                           "safetensors", "sacrebleu", "flash_attn")}}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env.update(device_name=props.name, memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                   capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                   bf16=torch.cuda.is_bf16_supported())
    else:
        from benchmarks.report import cpu_model

        env.update(device_name=cpu_model(), bf16=True)
    return env


def outside_ranges() -> list[str]:
    """The installed dependencies that lie outside pyproject.toml's ranges ("transformers 5.16.0 not in <6,>=5.17")."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        return []
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    outside = []
    for text in project["dependencies"]:
        req = Requirement(text)
        module = {"pyyaml": "yaml"}.get(req.name.lower(), req.name.replace("-", "_"))
        installed = version(req.name) if importlib.util.find_spec(module) else None
        if installed is None:
            outside.append(f"{req.name} not installed")
        elif not req.specifier.contains(installed.split("+")[0], prereleases=True):
            outside.append(f"{req.name} {installed} not in {req.specifier}")
    return outside


# ------------------------------------------------------------------------------------------------ model


def tiny_model(**overrides):
    from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration

    values = dict(vocab_size=40, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=2, d_ff=64, dropout=0.0,
                  max_position_embeddings=64, init_std=0.3)
    values.update(overrides)
    torch.manual_seed(0)
    return ScratchTransformerForConditionalGeneration(ScratchTransformerConfig(**values)).eval()


def tiny_inputs():
    """Source ids (3, 9) right-padded to lengths 9, 6 and 3, their mask, and decoder ids (3, 7)."""
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(3, 40, (3, 9), generator=g)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = 0
    attention_mask[2, 3:] = 0
    decoder_input_ids = torch.randint(3, 40, (3, 7), generator=g)
    return input_ids.masked_fill(attention_mask == 0, 0), attention_mask, decoder_input_ids


def close(a, b, atol) -> tuple[bool, float]:
    diff = (a.float().cpu() - b.float().cpu()).abs().max().item()
    return diff <= atol, diff


def part_model(args, device, rows, figures):
    cpu_model_ = tiny_model(attn_implementation="eager")
    dev_model = tiny_model(attn_implementation="eager").to(device)
    input_ids, attention_mask, decoder_input_ids = tiny_inputs()
    batch = dict(input_ids=input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids)
    on_dev = {k: v.to(device) for k, v in batch.items()}

    logits_cpu = cpu_model_(**batch, labels=decoder_input_ids)
    logits_dev = dev_model(**on_dev, labels=on_dev["decoder_input_ids"])
    ok, diff = close(logits_dev.logits, logits_cpu.logits, 1e-4)
    rows.append(("model", "fp32 logits = CPU's", ok, f"max |diff| {diff:.1e}"))
    logits_cpu.loss.backward()
    logits_dev.loss.backward()
    diffs = [close(p_dev.grad, p_cpu.grad, 1e-4) for p_dev, p_cpu in
             zip(dev_model.parameters(), cpu_model_.parameters()) if p_cpu.grad is not None]
    rows.append(("model", "gradients = CPU's", all(d[0] for d in diffs), f"max |diff| {max(d[1] for d in diffs):.1e}"))

    from scratch_transformer import ScratchTransformerForConditionalGeneration

    with torch.no_grad(), tempfile.TemporaryDirectory() as tmp:
        dev_model.save_pretrained(tmp)
        loaded = ScratchTransformerForConditionalGeneration.from_pretrained(tmp, attn_implementation="eager")
        loaded = loaded.to(device).eval()
        same, diff = close(loaded(**on_dev).logits, dev_model(**on_dev).logits, 1e-6)
    rows.append(("model", "save/load: same logits", same, f"max |diff| {diff:.1e}"))

    with torch.no_grad():
        whole = dev_model(**on_dev).logits
        diff = 0.0
        for row in range(3):
            length = int(attention_mask[row].sum())
            alone = dev_model(input_ids=on_dev["input_ids"][row:row + 1, :length],
                              attention_mask=on_dev["attention_mask"][row:row + 1, :length],
                              decoder_input_ids=on_dev["decoder_input_ids"][row:row + 1]).logits
            diff = max(diff, close(alone, whole[row:row + 1], 1e-4)[1])
    rows.append(("model", "padded batch = rows alone", diff <= 1e-4, f"max |diff| {diff:.1e}"))

    with torch.no_grad():
        for beams in (1, 3):
            options = dict(num_beams=beams, do_sample=False, max_new_tokens=8, min_new_tokens=8)
            ids_cpu = cpu_model_.generate(input_ids=input_ids, attention_mask=attention_mask, **options)
            ids_dev = dev_model.generate(input_ids=on_dev["input_ids"], attention_mask=on_dev["attention_mask"],
                                         **options)
            same = torch.equal(ids_dev.cpu(), ids_cpu)
            rows.append(("model", f"generate, {'greedy' if beams == 1 else 'beam 3'}: CPU's ids", same,
                         f"{tuple(ids_dev.shape)}"))


# ------------------------------------------------------------------------------------------------ attention


def attention_available(name: str) -> str | None:
    """None where the implementation can run here, else why not."""
    if name in ("eager", "sdpa"):
        return None
    if name == "flex_attention":
        return None if importlib.util.find_spec("torch.nn.attention.flex_attention") else "torch has no flex_attention"
    if name == "flash_attention_2":
        return None if importlib.util.find_spec("flash_attn") else "flash_attn not installed"
    if name == "flash_attention_3":
        return None if importlib.util.find_spec("flash_attn_interface") else "flash_attn_interface (FA3) not installed"
    return "unknown implementation"


def part_attention(args, device, rows, figures):
    input_ids, attention_mask, decoder_input_ids = tiny_inputs()
    batch = {k: v.to(device) for k, v in dict(input_ids=input_ids, attention_mask=attention_mask,
                                                decoder_input_ids=decoder_input_ids).items()}
    reference = {}
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_model(attn_implementation="eager").to(device, dtype)
        with torch.no_grad():
            reference[dtype] = (model(**batch).logits, model.generate(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], do_sample=False, num_beams=1,
                max_new_tokens=8, min_new_tokens=8))
    for name in args.attention:
        if name == "eager":
            continue
        why_not = attention_available(name)
        if why_not:
            rows.append(("attention", f"{name} = eager", None, f"skipped: {why_not}"))
            continue
        flash = name.startswith("flash")
        if flash and device.type != "cuda":
            rows.append(("attention", f"{name} = eager", None, "skipped: needs a CUDA device"))
            continue
        dtype = torch.bfloat16 if flash else torch.float32
        # fp32: 1e-4; bf16 (8 bits of mantissa): 2% of the largest logit, for two roundings of different order
        atol = 2e-2 * max(1.0, reference[dtype][0].abs().max().item()) if flash else 1e-4
        model = tiny_model(attn_implementation=name).to(device, dtype)
        with torch.no_grad():
            logits = model(**batch).logits
            ids = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 do_sample=False, num_beams=1, max_new_tokens=8, min_new_tokens=8)
        ok, diff = close(logits, reference[dtype][0], atol)
        same_ids = torch.equal(ids, reference[dtype][1])
        rows.append(("attention", f"{name} = eager ({str(dtype)[6:]})", ok and same_ids,
                     f"max |diff| {diff:.1e}; greedy ids {'same' if same_ids else 'DIFFER'}"))
        figures.setdefault("attention", {})[name] = {"dtype": str(dtype), "max_abs_diff": diff, "same_ids": same_ids}


# ------------------------------------------------------------------------------------------------ train


def read_pairs(folder: Path, split: str, limit: int | None = None) -> tuple[list[str], list[str]]:
    sides = []
    for lang in ("de", "en"):
        with gzip.open(folder / f"{split}.{lang}.gz", "rt", encoding="utf-8") as fh:
            sides.append([line.rstrip("\n") for line in fh][:limit])
    return sides[0], sides[1]


def main_job_flags(args, device, output_dir: Path) -> list[str]:
    flags = [str(MAIN_CONFIG), "--dataset_name", str(args.data), "--output_dir", str(output_dir),
             "--max_train_minutes", str(args.train_seconds / 60), "--eval_strategy", "no",
             "--test_split", "test_2016_flickr", "--max_predict_samples", "8" if args.tiny else "200",
             "--save_strategy", "no", "--average_last_checkpoints", "0", "--long_run_dropout", "0",
             "--report_to", "none", "--logging_steps", "1" if args.tiny else "50",
             "--use_cpu", str(device.type == "cpu").lower(), "--precision", "bf16"]
    if args.tiny:
        flags += ["--config_overrides", TINY, "--vocab_size", "300", "--max_train_samples", "256",
                  "--per_device_train_batch_size", "16", "--num_beams", "2"]
    return flags


def train_main_job(args, device, folder: Path) -> dict:
    if str(REPO_ROOT / "scripts") not in sys.path:
        sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import train_translation

    output_dir = folder / "main_job"
    train_translation.main(main_job_flags(args, device, output_dir))
    results = json.loads((output_dir / "all_results.json").read_text(encoding="utf-8"))
    state = output_dir / "trainer_state.json"
    history = json.loads(state.read_text(encoding="utf-8"))["log_history"] if state.is_file() else []
    losses = [h["loss"] for h in history if "loss" in h]
    bleu = {k: v for k, v in results.items() if k.endswith("_bleu") and k.startswith("predict")}
    return {"loop": "main_job", "steps": results.get("train_steps", None) or (history[-1].get("step") if history else None),
            "steps_per_second": results.get("train_steps_per_second"), "train_runtime": results.get("train_runtime"),
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "test_bleu": bleu, "precision": results.get("precision"), "model_dir": str(output_dir)}


def train_on_lists(args, device, folder: Path) -> dict:
    """The main job's model, batch size, optimizer and label smoothing through Seq2SeqTrainer, without `datasets`."""
    from transformers import (DataCollatorForSeq2Seq, PrinterCallback, Seq2SeqTrainer, Seq2SeqTrainingArguments,
                              TrainerCallback)

    from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
    from scratch_transformer.tokenization import train_tokenizer

    job = json.loads(MAIN_CONFIG.read_text(encoding="utf-8"))
    de, en = read_pairs(args.data, "train", 256 if args.tiny else None)
    vocab = 300 if args.tiny else job["vocab_size"]
    tokenizer = train_tokenizer(de + en, vocab_size=vocab, min_frequency=1 if args.tiny else 2,
                                model_max_length=job["max_source_length"])
    config = ScratchTransformerConfig(vocab_size=len(tokenizer), **tokenizer_ids(tokenizer))
    config.update_from_string(TINY if args.tiny else job["config_overrides"])
    torch.manual_seed(job["seed"])
    model = ScratchTransformerForConditionalGeneration(config)
    model.set_attn_implementation(job["attn_implementation"])
    encoded = tokenizer(de, text_target=en, truncation=True, max_length=job["max_source_length"])
    features = [{"input_ids": i, "attention_mask": m, "labels": t}
                for i, m, t in zip(encoded["input_ids"], encoded["attention_mask"], encoded["labels"])]

    class StopAfter(TrainerCallback):
        def __init__(self):
            self.start = None

        def on_step_begin(self, targs, state, control, **kwargs):
            self.start = self.start or time.perf_counter()

        def on_step_end(self, targs, state, control, **kwargs):
            if time.perf_counter() - self.start >= args.train_seconds:
                control.should_training_stop = True

    targs = Seq2SeqTrainingArguments(
        output_dir=str(folder / "trainer"), per_device_train_batch_size=16 if args.tiny else 64,
        learning_rate=job["learning_rate"], adam_beta2=job["adam_beta2"], adam_epsilon=job["adam_epsilon"],
        label_smoothing_factor=job["label_smoothing_factor"], max_grad_norm=job["max_grad_norm"],
        max_steps=100000, warmup_steps=500 if not args.tiny else 2, lr_scheduler_type="constant_with_warmup",
        bf16=True, use_cpu=device.type == "cpu", logging_steps=1 if args.tiny else 50, save_strategy="no",
        report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=job["seed"], **length_grouping())
    trainer = Seq2SeqTrainer(model=model, args=targs, train_dataset=features, processing_class=tokenizer,
                             data_collator=DataCollatorForSeq2Seq(tokenizer, model=model), callbacks=[StopAfter()])
    trainer.remove_callback(PrinterCallback)  # the table says it; no line per logging step
    output = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    model_dir = folder / "trainer" / "model"
    trainer.save_model(str(model_dir))
    return {"loop": "Seq2SeqTrainer on lists (no datasets)", "steps": output.global_step,
            "steps_per_second": output.metrics.get("train_steps_per_second"),
            "train_runtime": output.metrics.get("train_runtime"),
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else output.training_loss,
            "precision": "bf16", "model_dir": str(model_dir)}


def length_grouping() -> dict:
    """The TrainingArguments field that groups batches by length: train_sampling_strategy on newer transformers,
    group_by_length on older ones."""
    import dataclasses

    from transformers import Seq2SeqTrainingArguments

    names = {f.name for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    if "train_sampling_strategy" in names:
        return {"train_sampling_strategy": "group_by_length"}
    return {"group_by_length": True} if "group_by_length" in names else {}


def tokenizer_ids(tokenizer) -> dict:
    from scratch_transformer.tokenization import tokenizer_special_ids

    return tokenizer_special_ids(tokenizer)


def part_train(args, device, rows, figures):
    loop = args.train_loop
    if loop == "auto":
        loop = "main_job" if importlib.util.find_spec("datasets") else "trainer"
    folder = Path(args.workdir)
    result = (train_main_job if loop == "main_job" else train_on_lists)(args, device, folder)
    figures["train"] = result
    losses = (result["first_loss"], result["last_loss"])
    ok = result["steps_per_second"] is not None and all(x is not None and x == x for x in losses)
    rows.append(("train", f"{result['loop']}, bf16, {args.train_seconds:g} s", ok,
                 f"{result['steps']} steps, {result['steps_per_second'] or 0:.2f} steps/s, loss "
                 f"{_num(losses[0])} -> {_num(losses[1])}"))
    for name, bleu in result.get("test_bleu", {}).items():
        rows.append(("train", name, True, f"{bleu:.2f}"))


def _num(value) -> str:
    return "-" if value is None else f"{value:.3f}"


# ------------------------------------------------------------------------------------------------ generate


def part_generate(args, device, rows, figures):
    from transformers import AutoTokenizer

    from benchmarks.compiled_decoding import mode_options
    from scratch_transformer import ScratchTransformerForConditionalGeneration

    model_dir = (figures.get("train") or {}).get("model_dir")
    if model_dir:
        model = ScratchTransformerForConditionalGeneration.from_pretrained(model_dir).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    else:  # the train part did not run: a random main-job-sized model on a tokenizer of the validation text
        from scratch_transformer.tokenization import train_tokenizer

        de, en = read_pairs(args.data, "val")
        tokenizer = train_tokenizer(de + en, vocab_size=300 if args.tiny else 8000, min_frequency=1,
                                    model_max_length=128)
        model = tiny_model(vocab_size=len(tokenizer), max_position_embeddings=128, **tokenizer_ids(tokenizer))
        model = model.to(device)
    sources, _ = read_pairs(args.data, "val", 8 if args.tiny else 64)
    batch = tokenizer(sources, return_tensors="pt", padding=True).to(device)
    modes = ["dynamic"] + (["static-compiled"] if args.compile == "true" else ["static"])
    out = figures.setdefault("generate", [])
    for search, beams in (("greedy", 1), ("beam4", 4)):
        common = dict(num_beams=beams, do_sample=False, max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                      early_stopping=True, no_repeat_ngram_size=0, length_penalty=1.0)
        reference = None
        for mode in modes:
            torch._dynamo.reset()
            sync(device)
            seconds, warm_up, ids = time_generate_synced(model, batch, {**common, **mode_options(mode)}, device,
                                                         repeats=1 if args.tiny else 3)
            reference = ids if reference is None else reference
            median = statistics.median(seconds)
            tokens_per_s = len(sources) * args.new_tokens / median
            differ = int((ids != reference).any(dim=-1).sum()) if ids.shape == reference.shape else len(ids)
            out.append({"search": search, "mode": mode, "batch_size": len(sources), "new_tokens": args.new_tokens,
                        "seconds": seconds, "warm_up_seconds": warm_up, "new_tokens_per_second": tokens_per_s,
                        "same_ids_as_dynamic": differ == 0, "sentences_differing": differ})
            rows.append(("generate", f"{search}, {mode}", differ == 0,
                         f"{tokens_per_s:,.0f} new tokens/s (batch {len(sources)}; warm-up {warm_up:.1f} s)"
                         + (f"; ids of {differ} of {len(ids)} sentences differ from dynamic's" if differ else "")))


def time_generate_synced(model, batch, options, device, repeats):
    """benchmarks.compiled_decoding.time_generate with the device synchronised (CUDA work is asynchronous)."""
    start = time.perf_counter()
    with torch.no_grad():
        ids = model.generate(**batch, **options)
    sync(device)
    warm_up = time.perf_counter() - start
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        with torch.no_grad():
            ids = model.generate(**batch, **options)
        sync(device)
        seconds.append(time.perf_counter() - start)
    return seconds, warm_up, ids


# ------------------------------------------------------------------------------------------------ wmt14


def part_wmt14(args, device, rows, figures):
    from benchmarks.flops import analytic_flops
    from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
    from scratch_transformer.modeling_scratch_transformer import cross_entropy_loss

    job = json.loads(WMT_CONFIG.read_text(encoding="utf-8"))
    config = ScratchTransformerConfig(vocab_size=300 if args.tiny else job["vocab_size"], max_position_embeddings=256)
    config.update_from_string(TINY + ",share_encoder_decoder_embeddings=true" if args.tiny else job["config_overrides"])
    torch.manual_seed(0)
    model = ScratchTransformerForConditionalGeneration(config).to(device).train()
    model.set_attn_implementation(job["attn_implementation"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(job["adam_beta1"], job["adam_beta2"]),
                                  eps=job["adam_epsilon"], weight_decay=0.0, fused=device.type == "cuda")
    peak = next((v for k, v in PEAK_BF16_TFLOPS.items() if k in figures["environment"].get("device_name", "")), None)
    length = 30
    out = figures.setdefault("wmt14", [])
    for tokens in ((96, 192) if args.tiny else (job["max_tokens_per_batch"], 25000)):
        sentences = tokens // length
        g = torch.Generator().manual_seed(tokens)
        src = torch.randint(4, config.vocab_size, (sentences, length), generator=g).to(device)
        labels = torch.randint(4, config.vocab_size, (sentences, length), generator=g).to(device)
        decoder_input_ids = torch.cat([torch.full_like(labels[:, :1], config.decoder_start_token_id), labels[:, :-1]], 1)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                logits = model(input_ids=src, decoder_input_ids=decoder_input_ids).logits
            loss = cross_entropy_loss(logits, labels, label_smoothing=job["label_smoothing_factor"])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return loss

        for _ in range(2 if args.tiny else 5):
            step()
        sync(device)
        seconds = []
        for _ in range(3 if args.tiny else 20):
            start = time.perf_counter()
            loss = step()
            sync(device)
            seconds.append(time.perf_counter() - start)
        ms = 1000 * statistics.median(seconds)
        flops = analytic_flops({"d_model": config.d_model, "d_ff": config.d_ff, "vocab_size": config.vocab_size,
                                "encoder_layers": config.encoder_layers, "decoder_layers": config.decoder_layers,
                                "batch_size": sentences, "src_len": length, "tgt_len": length})["train_per_step"]
        achieved = flops / (ms / 1000) / 1e12
        estimate = None
        if peak:
            arithmetic = [1000 * flops / (peak * u * 1e12) for u in DOC_UTILISATION[::-1]]
            estimate = {"arithmetic_ms": arithmetic, "host_ms": list(DOC_HOST_MS),
                        "expected_ms": [max(arithmetic[0], DOC_HOST_MS[0]), max(arithmetic[1], DOC_HOST_MS[1])]}
        entry = {"tokens_per_side": sentences * length, "sentences": sentences, "median_ms": ms, "seconds": seconds,
                 "tflop_per_step": flops / 1e12, "achieved_tflops": achieved, "assumed_peak_tflops": peak,
                 "utilisation": achieved / peak if peak else None, "estimate": estimate,
                 "loss": float(loss.detach())}
        out.append(entry)
        text = f"{ms:.1f} ms/step, {flops / 1e12:.3f} TFLOP, {achieved:.1f} TFLOP/s"
        if estimate:
            text += (f" ({100 * achieved / peak:.0f}% of {peak:g}); docs/scale_out.md: "
                     f"{estimate['expected_ms'][0]:.0f}-{estimate['expected_ms'][1]:.0f} ms")
        rows.append(("wmt14", f"base step, {sentences * length} + {sentences * length} tokens, bf16",
                     math.isfinite(entry["loss"]), text))


PARTS = {"model": part_model, "attention": part_attention, "train": part_train, "generate": part_generate,
         "wmt14": part_wmt14}


def table(rows) -> str:
    lines = ["| part | check | result | figures |", "|---|---|---|---|"]
    for part, check, ok, text in rows:
        lines.append(f"| {part} | {check} | {'ok' if ok else ('-' if ok is None else 'FAIL')} | {text} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    """Runs the parts, prints the table, writes gpu.json; returns the entry written (its "failed" counts FAIL rows).
    Raises SystemExit (status 2) on bad arguments, before any work."""
    args = parse_args(argv)
    device = torch.device(args.device)
    threads = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    args.workdir = tempfile.mkdtemp(prefix="gpu_check_")  # the trained model, until generate() has run
    try:
        return _run(args, argv, device)
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(args.workdir, ignore_errors=True)


def _run(args, argv, device) -> dict:
    import transformers

    from benchmarks import record

    transformers.logging.set_verbosity_error()
    rows, figures = [], {"environment": environment(device)}
    outside = outside_ranges()
    rows.append(("environment", "versions within pyproject's ranges", None if outside else True,
                 "; ".join(outside) + " (docs/compatibility.md)" if outside else "all"))
    for name in args.parts:
        start = time.perf_counter()
        try:
            PARTS[name](args, device, rows, figures)
        except Exception as error:  # one part's failure is a row; the others still run
            message = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
            rows.append((name, "(the part raised)", False, message[:300]))
            figures.setdefault("errors", {})[name] = traceback.format_exc()[-4000:]
        figures.setdefault("part_seconds", {})[name] = round(time.perf_counter() - start, 1)
    env = figures["environment"]
    failed = sum(1 for row in rows if row[2] is False)
    result = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"), "commit": _commit(),
              "command": "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv),
              "device_name": env["device_name"], "size": "tiny" if args.tiny else "full",
              "train_seconds": args.train_seconds, "failed": failed,
              "rows": [{"part": p, "check": c, "ok": ok, "figures": t} for p, c, ok, t in rows], **figures}
    print(f"{env['device_name']} ({env['device']}): torch {env['torch']}, transformers {env['transformers']}, "
          f"datasets {env['datasets'] or 'absent'}; {result['date']}, commit {result['commit']}\n")
    print(table(rows))
    path = record.record("gpu", [result], key=lambda run: (run.get("device_name"), run.get("size")),
                         results_dir=args.results_dir)
    print(f"\n{failed} failed; written to {path}")
    return result


def _commit() -> str:
    try:
        from benchmarks.quality import git_commit

        return git_commit()
    except Exception:  # no git in the tree that was copied to the GPU machine
        return "unknown"


if __name__ == "__main__":
    sys.exit(1 if main()["failed"] else 0)
