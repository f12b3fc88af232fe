"""The contenders: one class per kind of model, each built by name in one place (`build`).

A contender owns its model at one size, the shared batch, and the workloads (`run(figure)`): a training
step (fp32, plain cross-entropy), the main job's training step (label smoothing 0.1 as the main job's Trainer
computes it: our model's fused loss, HF's LabelSmoother for Marian; in the precision the main job picks on this
machine), greedy decoding and beam-4 decoding. What differs between kinds lives in the
classes: how the model is built, how its loss and decoding are called, which figures it has,
whether its generate() time can be split (forward hooks), and which extra FLOPs it executes.
"""

from __future__ import annotations

import time
from typing import ClassVar

import torch
import torch.nn.functional as F

SIZES = {
    # tests only
    "tiny": dict(vocab_size=128, d_model=32, num_heads=2, encoder_layers=1, decoder_layers=1, d_ff=64,
                 batch_size=4, src_len=6, tgt_len=6),
    "small": dict(vocab_size=8000, d_model=256, num_heads=4, encoder_layers=3, decoder_layers=3, d_ff=1024,
                  batch_size=64, src_len=24, tgt_len=24),
    "base": dict(vocab_size=10000, d_model=512, num_heads=8, encoder_layers=6, decoder_layers=6, d_ff=2048,
                 batch_size=32, src_len=32, tgt_len=32),
}
COMMON = dict(dropout=0.1, attention_dropout=0.1, max_position_embeddings=1024,
              pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
FIRST_ORDINARY_ID = 4  # random tokens avoid pad/bos/eos and one spare special
FIGURES = ("train", "train_main_job", "greedy", "beam4")
TRAIN_FIGURES = ("train", "train_main_job")
MAIN_JOB_LABEL_SMOOTHING = 0.1  # configs/multi30k_de_en.json: label_smoothing_factor


def main_job_precision() -> tuple[str, str]:
    """(precision, reason) that the main job's `--precision auto` picks on this CPU: "bf16" (autocast) where the
    CPU computes bf16 natively (avx512_bf16 / amx_bf16), else "fp32" (scratch_transformer.training)."""
    from scratch_transformer.training import choose_precision

    return choose_precision(on_cpu=True)


def ours_config(sizes: dict):
    from scratch_transformer import ScratchTransformerConfig

    keys = ("vocab_size", "d_model", "num_heads", "encoder_layers", "decoder_layers", "d_ff")
    return ScratchTransformerConfig(
        **{k: sizes[k] for k in keys}, **COMMON,
        activation_function="relu", pre_layer_norm=False, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True, layer_norm_eps=1e-5,
    )


def marian_config(sizes: dict):
    from transformers import MarianConfig

    return MarianConfig(
        vocab_size=sizes["vocab_size"], d_model=sizes["d_model"],
        encoder_attention_heads=sizes["num_heads"], decoder_attention_heads=sizes["num_heads"],
        encoder_layers=sizes["encoder_layers"], decoder_layers=sizes["decoder_layers"],
        encoder_ffn_dim=sizes["d_ff"], decoder_ffn_dim=sizes["d_ff"],
        activation_function="relu", activation_dropout=0.0, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        forced_eos_token_id=None, encoder_layerdrop=0.0, decoder_layerdrop=0.0,
        **COMMON,
    )


def count_params(model) -> dict:
    unique = {id(p): p for p in model.parameters()}.values()
    return {
        "trainable": sum(p.numel() for p in unique if p.requires_grad),
        "frozen": sum(p.numel() for p in unique if not p.requires_grad),
    }


def make_batch(sizes: dict, seed: int) -> dict:
    """One fixed batch for every contender: ids, an all-ones attention mask, labels, teacher-forcing
    inputs, and the naive baseline's masks."""
    from benchmarks.naive_transformer import make_masks

    g = torch.Generator().manual_seed(seed + 1)
    bsz, s, t, v = sizes["batch_size"], sizes["src_len"], sizes["tgt_len"], sizes["vocab_size"]
    src = torch.randint(FIRST_ORDINARY_ID, v, (bsz, s), generator=g)
    labels = torch.randint(FIRST_ORDINARY_ID, v, (bsz, t), generator=g)
    tgt_in = torch.full_like(labels, COMMON["decoder_start_token_id"])
    tgt_in[:, 1:] = labels[:, :-1]
    naive_src_mask, naive_tgt_mask = make_masks(src, tgt_in, COMMON["pad_token_id"])
    return dict(src=src, src_mask=torch.ones_like(src), labels=labels, tgt_in=tgt_in,
                naive_src_mask=naive_src_mask, naive_tgt_mask=naive_tgt_mask)


class Contender:
    """One model plus the workloads on a fixed batch. Subclasses build the model and call it."""

    figures: ClassVar[tuple] = FIGURES  # the figures this kind can run
    splits_generate: ClassVar[bool] = False  # True: model_seconds counts the time inside the model's forward calls
    executed_flops: ClassVar[dict] = {}  # figure -> analytic_flops() key of the FLOPs it executes, if not the useful ones
    attn_implementation: str

    def __init__(self, name: str, sizes: dict, seed: int, lr: float = 1e-4):
        self.name = name
        self.sizes = sizes
        torch.manual_seed(seed)
        self.model = self.build_model()
        self.params = count_params(self.model)
        self.model_seconds = 0.0  # time inside the model's forward calls, for kinds that split generate()
        self.optimizer = None
        self.lr = lr
        self.batch = None

    @classmethod
    def supports(cls, figure: str) -> bool:
        return figure in cls.figures

    def build_model(self) -> torch.nn.Module:
        raise NotImplementedError

    def set_batch(self, batch: dict):
        self.batch = batch

    def make_optimizer(self):
        self.optimizer = torch.optim.AdamW([p for p in self.model.parameters() if p.requires_grad], lr=self.lr)

    # ---- workloads -------------------------------------------------------------------

    def loss(self, b: dict) -> torch.Tensor:
        raise NotImplementedError

    def train_step(self) -> float:
        if self.optimizer is None:
            self.make_optimizer()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(self.batch)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def main_job_loss(self, b: dict) -> torch.Tensor:
        """The loss as the main job's TranslationTrainer computes it with label_smoothing_factor=0.1 and its
        precision, under bf16 autocast when the main job would pick bf16 here. A model whose forward takes
        `label_smoothing` (ours) gets the labels and epsilon 0.1 and computes the smoothed loss itself (fused
        cross-entropy); any other (Marian) runs the forward pass without labels (teacher-forcing inputs from
        the collator, use_cache off as Trainer sets it), its logits made float32 as accelerate's mixed-precision
        forward returns them, then HF's LabelSmoother (epsilon 0.1, -100 ignored) outside it."""
        from transformers.trainer_pt_utils import LabelSmoother

        from scratch_transformer.trainer import takes_label_smoothing

        precision, _ = main_job_precision()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            if takes_label_smoothing(self.model):
                return self.model(input_ids=b["src"], attention_mask=b["src_mask"], decoder_input_ids=b["tgt_in"],
                                  labels=b["labels"], use_cache=False,
                                  label_smoothing=MAIN_JOB_LABEL_SMOOTHING).loss
            logits = self.logits(b)
        return LabelSmoother(epsilon=MAIN_JOB_LABEL_SMOOTHING)({"logits": logits.float()}, b["labels"])

    def logits(self, b: dict) -> torch.Tensor:
        raise NotImplementedError(f"{self.name} has no main-job training step")

    def train_step_main_job(self) -> float:
        if self.optimizer is None:
            self.make_optimizer()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.main_job_loss(self.batch)
        loss.backward()
        self.optimizer.step()
        return float(loss.detach())

    def greedy(self) -> torch.Tensor:
        raise NotImplementedError

    def beam4(self) -> torch.Tensor:
        raise NotImplementedError(f"{self.name} has no beam search")

    def run(self, figure: str):
        if figure == "train":
            return self.train_step()
        if figure == "train_main_job":
            return self.train_step_main_job()
        out = {"greedy": self.greedy, "beam4": self.beam4}[figure]()
        expected = (self.sizes["batch_size"], 1 + self.sizes["tgt_len"])
        if tuple(out.shape) != expected:
            raise RuntimeError(f"{self.name} {figure}: output shape {tuple(out.shape)}, expected {expected}")
        return None


class HFContender(Contender):
    """A transformers seq2seq model: loss from labels in forward, decoding through generate()."""

    splits_generate = True

    def __init__(self, name: str, sizes: dict, seed: int, attn: str, lr: float = 1e-4):
        self.attn_implementation = attn
        super().__init__(name, sizes, seed, lr)
        configs = {m.config._attn_implementation for m in self.model.modules() if hasattr(m, "config")}
        if configs != {attn}:
            raise RuntimeError(f"{name}: attention implementation not applied everywhere: {configs}")
        self.model.generation_config.forced_eos_token_id = None
        self._time_model(self.model)
        self._time_model(self.model.get_encoder())

    def _time_model(self, module):
        """Add the wall time of each forward call of `module` to self.model_seconds (forward hooks).

        generate() calls the encoder once and the whole model once per step; the rest of a decoding
        call (logits processors, token selection, stopping checks, beam bookkeeping, cache reordering)
        is generate()'s own work."""
        def pre(*_):
            self._model_start = time.perf_counter()

        def post(*_):
            self.model_seconds += time.perf_counter() - self._model_start

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)

    def loss(self, b: dict) -> torch.Tensor:
        return self.model(input_ids=b["src"], attention_mask=b["src_mask"], labels=b["labels"]).loss

    def logits(self, b: dict) -> torch.Tensor:
        return self.model(input_ids=b["src"], attention_mask=b["src_mask"], decoder_input_ids=b["tgt_in"],
                          use_cache=False).logits

    def _generate(self, num_beams: int) -> torch.Tensor:
        b, m = self.batch, self.sizes["tgt_len"]
        self.model.eval()
        return self.model.generate(
            input_ids=b["src"], attention_mask=b["src_mask"], do_sample=False, num_beams=num_beams,
            min_new_tokens=m, max_new_tokens=m,
        )

    def greedy(self) -> torch.Tensor:
        return self._generate(num_beams=1)

    def beam4(self) -> torch.Tensor:
        return self._generate(num_beams=4)


class OursContender(HFContender):
    def build_model(self):
        from scratch_transformer import ScratchTransformerForConditionalGeneration

        model = ScratchTransformerForConditionalGeneration(ours_config(self.sizes))
        # the attention implementation is read from the config at every call (as set_attn_implementation does)
        model.config._attn_implementation = self.attn_implementation
        return model


class MarianContender(HFContender):
    def build_model(self):
        from transformers import MarianMTModel

        model = MarianMTModel(marian_config(self.sizes))
        model.set_attn_implementation(self.attn_implementation)
        return model


class NaiveContender(Contender):
    """The tutorial-style baseline: F.cross_entropy on its logits, greedy decoding without a cache."""

    figures = ("train", "greedy")  # no main-job step: the baseline is not an HF model
    executed_flops: ClassVar[dict] = {"greedy": "naive_greedy_executed_per_call"}
    attn_implementation = "naive (matmul + masked_fill + softmax)"

    def build_model(self):
        from benchmarks.naive_transformer import NaiveTransformer

        return NaiveTransformer.from_config(ours_config(self.sizes))

    def loss(self, b: dict) -> torch.Tensor:
        logits = self.model(b["src"], b["tgt_in"], b["naive_src_mask"], b["naive_tgt_mask"])
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), b["labels"].reshape(-1))

    def greedy(self) -> torch.Tensor:
        from benchmarks.naive_transformer import naive_greedy_decode

        b, m = self.batch, self.sizes["tgt_len"]
        self.model.eval()
        return naive_greedy_decode(self.model, b["src"], b["naive_src_mask"], m, COMMON["decoder_start_token_id"])


# Every contender by name: its class and the arguments that make it this one.
REGISTRY: dict[str, tuple[type[Contender], dict]] = {
    "ours-eager": (OursContender, dict(attn="eager")),
    "ours-sdpa": (OursContender, dict(attn="sdpa")),
    "marian": (MarianContender, dict(attn="sdpa")),
    "naive": (NaiveContender, {}),
    "marian-eager": (MarianContender, dict(attn="eager")),
}
ALL_CONTENDERS = tuple(REGISTRY)
DEFAULT_CONTENDERS = ("ours-eager", "ours-sdpa", "marian", "naive")


def contender_class(name: str) -> type[Contender]:
    if name not in REGISTRY:
        raise ValueError(f"unknown contender {name!r}; choose from {ALL_CONTENDERS}")
    return REGISTRY[name][0]


def build(name: str, sizes: dict, seed: int) -> Contender:
    """The one place contenders are made."""
    cls = contender_class(name)
    return cls(name, sizes, seed, **REGISTRY[name][1])


def build_all(names, sizes: dict, seed: int) -> list[Contender]:
    """The named contenders, all given the same batch."""
    contenders = [build(name, sizes, seed) for name in names]
    batch = make_batch(sizes, seed)
    for c in contenders:
        c.set_batch(batch)
    return contenders
