"""Activation memory of one training step with and without gradient checkpointing, at the paper's base size.

Run from the repository root:
    python -m benchmarks.activation_memory
    python -m benchmarks.activation_memory --batch_size 64 --source_length 32 --target_length 32 --vocab_size 8000
    python -m benchmarks.activation_memory --d_model 64 --num_heads 4 --layers 2 --d_ff 128 --output_json /tmp/a.json

Builds the paper's base model (Table 3: d_model 512, 8 heads, 6 + 6 layers, d_ff 2048, dropout 0.1; the vocabulary
of --vocab_size, default 8000 as the Multi30k main job's), runs one forward + backward of a random batch of
--batch_size pairs of --source_length / --target_length tokens in training mode, and measures what autograd keeps
for backward: the bytes of every distinct tensor storage saved by the graph (torch.autograd.graph's
saved_tensors_hooks, counted once per storage, the parameters left out), without and with
`activation_checkpointing_enable()` (non-reentrant: a checkpointed layer saves only its inputs and recomputes the
rest in backward). On a CUDA device (--device cuda)
it also reports torch.cuda.max_memory_allocated over the step. The loss and the gradients of the two runs are
compared (same seed: the recompute replays the same dropout draws). Writes
outputs/activation_memory.json; with --record also benchmarks/results/activation_memory.json (or --output_json). Memory figures do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

from benchmarks import record
from benchmarks.quality import REPO_ROOT, git_commit, machine
from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m benchmarks.activation_memory", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--source_length", type=int, default=32)
    p.add_argument("--target_length", type=int, default=32)
    p.add_argument("--vocab_size", type=int, default=8000)
    p.add_argument("--d_model", type=int, default=512)
    p.add_argument("--num_heads", type=int, default=8)
    p.add_argument("--layers", type=int, default=6, help="encoder and decoder layers each")
    p.add_argument("--d_ff", type=int, default=2048)
    p.add_argument("--attn_implementation", default="sdpa")
    p.add_argument("--device", default="cpu")
    p.add_argument("--output_json", type=Path, default=REPO_ROOT / "outputs" / "activation_memory.json")
    p.add_argument("--record", action="store_true", help=record.RECORD_HELP.format(name="activation_memory", more=""))
    args = p.parse_args(argv)
    for name in ("batch_size", "source_length", "target_length", "vocab_size", "d_model", "num_heads", "layers",
                 "d_ff"):
        if getattr(args, name) <= 0:
            p.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
    return args


class SavedTensorBytes:
    """Context manager: the bytes of the distinct storages autograd saves for backward while it is active, the
    model's own parameters left out (they are held anyway)."""

    def __init__(self, model: torch.nn.Module):
        self.parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
        self.storages: dict[int, int] = {}

    def _pack(self, tensor: torch.Tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in self.parameters:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    def __enter__(self):
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda tensor: tensor)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)

    @property
    def total(self) -> int:
        return sum(self.storages.values())


def one_step(model, batch, device: str) -> dict:
    """Forward + backward of one batch, seeded; returns saved bytes, the loss and the gradients."""
    model.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
    torch.manual_seed(1)
    with SavedTensorBytes(model) as saved:
        loss = model(**batch).loss
    loss.backward()
    result = {"saved_for_backward_bytes": saved.total, "loss": loss.item(),
              "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}}
    if device.startswith("cuda"):
        result["cuda_peak_above_start_bytes"] = torch.cuda.max_memory_allocated() - start
    return result


def main(argv=None) -> dict:
    args = parse_args(argv)
    config = ScratchTransformerConfig(
        vocab_size=args.vocab_size, d_model=args.d_model, num_heads=args.num_heads, encoder_layers=args.layers,
        decoder_layers=args.layers, d_ff=args.d_ff, dropout=0.1,
        max_position_embeddings=max(args.source_length, args.target_length, 64),
    )
    torch.manual_seed(0)
    model = ScratchTransformerForConditionalGeneration(config).to(args.device).train()
    model.set_attn_implementation(args.attn_implementation)
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(3, args.vocab_size, (args.batch_size, args.source_length), generator=g),
        "labels": torch.randint(3, args.vocab_size, (args.batch_size, args.target_length), generator=g),
    }
    batch = {key: value.to(args.device) for key, value in batch.items()}
    plain = one_step(model, batch, args.device)
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    checkpointed = one_step(model, batch, args.device)
    max_grad_diff = max((checkpointed["grads"][n] - g).abs().max().item() for n, g in plain["grads"].items())
    tokens = args.batch_size * (args.source_length + args.target_length)
    runs = {}
    for name, run in (("plain", plain), ("checkpointed", checkpointed)):
        runs[name] = {key: value for key, value in run.items() if key != "grads"}
        runs[name]["saved_for_backward_mib"] = round(run["saved_for_backward_bytes"] / 2**20, 1)
        runs[name]["saved_bytes_per_token"] = round(run["saved_for_backward_bytes"] / tokens)
    result = {
        "benchmark": "activation_memory",
        "date": datetime.date.today().isoformat(),
        "commit": git_commit(),
        "machine": machine(),
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device,
        "torch": torch.__version__,
        "settings": {key: value for key, value in vars(args).items() if key not in ("output_json", "record")},
        "parameters": sum(p.numel() for p in model.parameters()),
        "runs": runs,
        "saved_ratio": round(plain["saved_for_backward_bytes"] / checkpointed["saved_for_backward_bytes"], 2),
        "same_loss": plain["loss"] == checkpointed["loss"],
        "max_abs_grad_difference": max_grad_diff,
    }
    args.output_json.parent.mkdir(parents=True, exist_ok=True)
    args.output_json.write_text(json.dumps(result, indent=2) + "\n")
    if args.record:
        path = record.record("activation_memory", [result], key=lambda run: (
            record.cpu_of(run), run["device"], run["settings"]["d_model"], run["settings"]["layers"]))
        print(f"recorded in {path}", file=sys.stderr)
    print(f"saved for backward: {runs['plain']['saved_for_backward_mib']} MiB plain, "
          f"{runs['checkpointed']['saved_for_backward_mib']} MiB checkpointed ({result['saved_ratio']}x less); "
          f"same loss: {result['same_loss']}, max |grad diff| {max_grad_diff:.2e}; wrote {args.output_json}",
          file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
