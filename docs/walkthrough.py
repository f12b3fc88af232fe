# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # From the paper to a translator: a walk-through that runs
#
# This walk-through builds the Transformer of *Attention Is All You Need* (Vaswani et al., 2017) piece by
# piece with this package's own classes, checks every shape on the way, trains it to copy sequences, then
# loads (or trains for a minute) a German→English model and looks inside it.
#
# Run it as a notebook (`pip install jupytext notebook`, then `jupytext --to notebook docs/walkthrough.py`
# and open `docs/walkthrough.ipynb`), or as a plain script (`python docs/walkthrough.py`). The test suite
# runs it (tests/test_walkthrough.py), so what you read here works with the code beside it.
#
# Settings (environment variables):
# - `WALKTHROUGH_MODEL`: a trained model folder or Hub id (default: `outputs/multi30k_de_en`, which the main
#   job writes, when it is there); without one, or set to `train`, part 9 trains a small model for a minute.
# - `MULTI30K`: where the Multi30k files are (default `../shared/data/multi30k/raw` beside the repository);
#   a Hub dataset id works too: the package's data loading reads either.
# - `WALKTHROUGH_OUTPUT`: a folder for the pictures (default: a temporary folder).
#
# Where the code differs from the paper, or offers an option, is listed in
# [the paper and this code](paper_and_code.md).
#
# Notation: b batch, s source length, t target length, d = d_model, h heads, k = d / h, v vocabulary.

# %%
# %matplotlib inline
import math
import os
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

import scratch_transformer  # registers the model with transformers' Auto classes
from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer import attention_maps
from scratch_transformer.modeling_scratch_transformer import (
    ScratchTransformerAttention,
    ScratchTransformerEmbedding,
    ScratchTransformerEncoderLayer,
    ScratchTransformerFeedForward,
    sinusoidal_position_encoding,
)

torch.manual_seed(0)
torch.set_num_threads(1)  # models this small run fastest on one thread (more only synchronise)
OUT = Path(os.environ.get("WALKTHROUGH_OUTPUT") or tempfile.mkdtemp(prefix="walkthrough_"))
OUT.mkdir(parents=True, exist_ok=True)
REPO = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "pyproject.toml").is_file())


def show(figure, name):
    """Save a picture into OUT and return it (a notebook displays it)."""
    figure.savefig(OUT / f"{name}.png", dpi=70)
    return figure


def hidden(output):
    """A layer's hidden states, whether it returns them alone or with its attention weights."""
    return output[0] if isinstance(output, tuple) else output


# %% [markdown]
# ## 1. The model's sizes: one config
#
# `ScratchTransformerConfig`'s defaults are the paper's base model (Table 3): d_model 512, 8 heads, 6 + 6
# layers, d_ff 2048, dropout 0.1. We use a tiny one to look at the pieces; every class reads its sizes from it.

# %%
base = ScratchTransformerConfig(vocab_size=37000, share_encoder_decoder_embeddings=True)
print("base:", base.d_model, base.num_heads, base.encoder_layers, base.decoder_layers, base.d_ff, base.dropout)
with torch.device("meta"):  # sizes only: no memory, no initialisation
    base_model = ScratchTransformerForConditionalGeneration(base)
parameters = sum(p.numel() for p in base_model.parameters())
print(f"base model, shared 37k vocabulary: {parameters / 1e6:.1f}M parameters (paper, Table 3: 65M)")
assert 60e6 < parameters < 66e6

config = ScratchTransformerConfig(vocab_size=20, d_model=32, num_heads=4, encoder_layers=2, decoder_layers=2,
                                  d_ff=64, dropout=0.0, max_position_embeddings=64)
config._attn_implementation = "eager"  # the written-out attention, which returns its weights
b, s, t, d, h = 2, 7, 5, config.d_model, config.num_heads

# %% [markdown]
# ## 2. Embeddings and positional encoding (paper 3.4, 3.5)
#
# > "we use learned embeddings to convert the input tokens and output tokens to vectors of dimension
# > d_model [...] In the embedding layers, we multiply those weights by √d_model."
#
# > "PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model))"
#
# The table is fixed, not learned; each dimension is a sinusoid of its own wavelength, from 2π to 10000·2π.

# %%
table = sinusoidal_position_encoding(50, d)  # (positions, d)
assert table.shape == (50, d)
assert math.isclose(table[7, 2 * 3], math.sin(7 / 10000 ** (2 * 3 / d)), abs_tol=1e-6)
assert math.isclose(table[7, 2 * 3 + 1], math.cos(7 / 10000 ** (2 * 3 / d)), abs_tol=1e-6)

embed = ScratchTransformerEmbedding(config, nn.Embedding(config.vocab_size, d, config.pad_token_id))
input_ids = torch.randint(3, config.vocab_size, (b, s))  # (b, s)
x = embed(input_ids)  # (b, s) -> (b, s, d)
assert x.shape == (b, s, d)
expected = embed.embed_tokens(input_ids) * math.sqrt(d) + sinusoidal_position_encoding(s, d)
assert torch.allclose(x, expected, atol=1e-5)  # token embedding * sqrt(d) + position (dropout is 0 here)
show(attention_maps.plot_positional_encoding(d_model=128, num_positions=100), "positional_encoding")

# %% [markdown]
# ## 3. Scaled dot-product attention (paper 3.2.1)
#
# > "Attention(Q, K, V) = softmax(QKᵀ / √d_k) V"
#
# Written out, in three lines. Each row of the weights is a probability distribution over the keys.

# %%
def attention(query, key, value, mask=None):
    """query (..., t, k), key and value (..., s, k), mask (..., t, s) True = may attend -> ((..., t, k), (..., t, s))."""
    scores = query @ key.transpose(-2, -1) / math.sqrt(query.size(-1))  # (..., t, s)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ value, weights


q, k, v = torch.randn(b, t, 8), torch.randn(b, s, 8), torch.randn(b, s, 8)
output, weights = attention(q, k, v)
assert output.shape == (b, t, 8) and weights.shape == (b, t, s)
assert torch.allclose(weights.sum(-1), torch.ones(b, t))

# %% [markdown]
# ## 4. Multi-head attention (paper 3.2.2)
#
# > "MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O where head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)"
#
# The h projections of width k = d/h are one d×d matrix each (all heads side by side); splitting is a reshape.
# We rebuild the package's `ScratchTransformerAttention` from its own weights and our `attention` above.

# %%
mha = ScratchTransformerAttention(config).eval()
x = torch.randn(b, s, d)


def split_heads(y):
    return y.view(b, -1, h, d // h).transpose(1, 2)  # (b, n, d) -> (b, h, n, k)


by_hand, by_hand_weights = attention(split_heads(mha.q_proj(x)), split_heads(mha.k_proj(x)), split_heads(mha.v_proj(x)))
by_hand = mha.out_proj(by_hand.transpose(1, 2).reshape(b, s, d))  # (b, h, s, k) -> (b, s, d): concat, W^O
with torch.no_grad():
    package, package_weights = mha(x, output_attentions=True)
assert package.shape == (b, s, d) and package_weights.shape == (b, h, s, s)
assert torch.allclose(package, by_hand, atol=1e-5) and torch.allclose(package_weights, by_hand_weights, atol=1e-5)
print("multi-head attention: the package's module and the paper's formula agree")

# %% [markdown]
# ## 5. The masks (paper 3.2.3)
#
# Padding is never attended to, by anyone; and the decoder's self-attention is *masked*:
# > "We need to prevent leftward information flow in the decoder to preserve the auto-regressive property.
# > We implement this inside of scaled dot-product attention by masking out (setting to −∞) all values in the
# > input of the softmax which correspond to illegal connections."
#
# Below, the masks of a padded batch (yellow: may attend). With the right-padding used here, the causal
# triangle already hides the target's padding from every real token: a mask bug that lets the decoder see the
# future shows up as a training loss that falls to zero while generation stays bad.

# %%
from scratch_transformer.tokenization import train_tokenizer

sentences = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "A dog runs across the meadow.",
             "Two men are playing football."]
toy_tokenizer = train_tokenizer(sentences * 3, vocab_size=300, min_frequency=1, model_max_length=64)
masks = attention_maps.batch_masks(toy_tokenizer, ["Ein Hund.", "Zwei Männer spielen Fußball."],
                                   ["A dog.", "Two men are playing football."])
assert masks["encoder"].shape[0] == 2 and not masks["attention_mask"][0].all()  # the first source is padded
show(attention_maps.plot_masks(masks), "masks")

# %% [markdown]
# ## 6. Feed-forward network and the sublayer connection: post-LN or pre-LN (paper 3.3, 3.1)
#
# > "FFN(x) = max(0, xW₁ + b₁)W₂ + b₂" — the same on every position.
#
# > "We employ a residual connection around each of the two sub-layers, followed by layer normalization.
# > That is, the output of each sub-layer is LayerNorm(x + Sublayer(x))" — and (5.4) "We apply dropout to the
# > output of each sub-layer, before it is added to the sub-layer input and normalized."
#
# **Where does the LayerNorm go?** The paper puts it *after* the residual sum: post-LN, this package's default
# (`pre_layer_norm=False`). Many implementations (tensor2tensor's later versions, the Annotated Transformer
# "for code simplicity") put it *before* the sublayer, x + Sublayer(LayerNorm(x)), and add one final LayerNorm
# to each stack: pre-LN, `pre_layer_norm=True` here. Pre-LN trains more stably without warmup (Xiong et al.,
# 2020); post-LN is what the paper describes. The check below shows the difference: a post-LN layer's output is
# normalised at every position, a pre-LN layer's is not (its stack's final LayerNorm does it).

# %%
ffn = ScratchTransformerFeedForward(config)
assert ffn(x).shape == (b, s, d)  # (b, s, d) -> (b, s, f) -> (b, s, d)

for pre_layer_norm in (False, True):
    layer_config = ScratchTransformerConfig(**{**config.to_diff_dict(), "pre_layer_norm": pre_layer_norm})
    layer_config._attn_implementation = "eager"
    layer = ScratchTransformerEncoderLayer(layer_config).eval()
    with torch.no_grad():
        y = hidden(layer(x * 3 + 1))  # (b, s, d): an input far from normalised
    spread = y.std(-1, unbiased=False).mean().item()
    print(f"pre_layer_norm={pre_layer_norm}: output mean {y.mean(-1).abs().mean():.3f}, std {spread:.3f}")
    assert y.shape == (b, s, d)
    assert (abs(spread - 1) < 1e-3) == (not pre_layer_norm)  # post-LN: LayerNorm last, so std 1 per position

# %% [markdown]
# ## 7. The stacks and the whole model (paper 3.1, figure 1)
#
# N encoder layers turn the source into (b, s, d) vectors; N decoder layers read the target prefix and, through
# encoder-decoder attention, those vectors; the output projection (tied to the target embedding, paper 3.4)
# gives next-token logits (b, t, v). One forward with `output_attentions=True` returns every layer's weights.

# %%
model = ScratchTransformerForConditionalGeneration(config).eval()
source = torch.randint(3, config.vocab_size, (b, s))
prefix = torch.cat([torch.full((b, 1), config.decoder_start_token_id), torch.randint(3, config.vocab_size, (b, t - 1))], 1)
with torch.no_grad():
    memory = model.get_encoder()(source).last_hidden_state  # (b, s) -> (b, s, d)
    out = model(input_ids=source, decoder_input_ids=prefix, output_attentions=True)
assert memory.shape == (b, s, d)
assert out.logits.shape == (b, t, config.vocab_size)
assert len(out.encoder_attentions) == config.encoder_layers and out.encoder_attentions[0].shape == (b, h, s, s)
assert out.decoder_attentions[0].shape == (b, h, t, t) and out.cross_attentions[0].shape == (b, h, t, s)
assert (out.decoder_attentions[0].triu(1) == 0).all()  # no peeking at the future
assert model.lm_head.weight is model.model.decoder.embed_tokens.weight  # tied output projection (3.4)
print("logits", tuple(out.logits.shape), "- every shape as the paper's figure 1 has it")

# %% [markdown]
# ## 8. Training: the copy task
#
# The smallest test that the whole machine works: copy a random sequence of symbols. Adam with the paper's
# β₂ = 0.98 and ε = 10⁻⁹ (5.3), a warmup then a linear decay of the learning rate (the main job's schedule; the
# paper's own, "inverse square root" after warmup, is `lr_scheduler_type="inverse_sqrt"` in
# scripts/train_copy_task.py), and greedy `generate()` on sequences it never saw. A few seconds on a free CPU.

# %%
PAD, BOS, EOS, SYMBOLS = 0, 1, 2, 10
copy_config = ScratchTransformerConfig(vocab_size=3 + SYMBOLS, d_model=64, num_heads=4, encoder_layers=2,
                                       decoder_layers=2, d_ff=128, dropout=0.0, max_position_embeddings=16)
copy_config._attn_implementation = "eager"
generator = torch.Generator().manual_seed(0)


def copy_batch(size, shortest=3, longest=8):
    """Random sequences of symbols 3.., then EOS, right-padded: ids and attention mask (size, n)."""
    lengths = torch.randint(shortest, longest + 1, (size,), generator=generator)
    ids = torch.full((size, longest + 1), PAD)
    for row, length in enumerate(lengths.tolist()):
        ids[row, :length] = torch.randint(3, 3 + SYMBOLS, (length,), generator=generator)
        ids[row, length] = EOS
    return ids, (ids != PAD).long()


torch.manual_seed(0)
copier = ScratchTransformerForConditionalGeneration(copy_config)
steps, warmup = 400, 40
optimizer = torch.optim.Adam(copier.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
schedule = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda step: min((step + 1) / warmup, max(0.0, (steps - step) / (steps - warmup))))
start, rates = time.perf_counter(), []
copier.train()
for step in range(steps):
    ids, mask = copy_batch(32)
    loss = copier(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(ids == PAD, -100)).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    rates.append(schedule.get_last_lr()[0])
    schedule.step()
    if step % 100 == 0 or step == steps - 1:
        print(f"step {step:4d}  loss {loss.item():.4f}")

copier.eval()
ids, mask = copy_batch(200)
with torch.no_grad():
    copies = copier.generate(input_ids=ids, attention_mask=mask, num_beams=1, max_new_tokens=ids.size(1))
correct = 0
for source_row, copy_row in zip(ids.tolist(), copies[:, 1:].tolist()):  # drop the decoder start token
    wanted = source_row[: source_row.index(EOS)]
    correct += copy_row[: copy_row.index(EOS)] == wanted if EOS in copy_row else False
print(f"copied {correct}/200 unseen sequences exactly in {time.perf_counter() - start:.0f} s")
assert correct == 200

# %% [markdown]
# Its learning rate, step by step, and where its attention looks: the encoder-decoder attention of the last
# layer follows the diagonal (output token i looks at source token i): the model has learnt to copy by position.

# %%
show(attention_maps.plot_learning_rate([{"step": i + 1, "learning_rate": r} for i, r in enumerate(rates)]),
     "copy_learning_rate")

# %%
ids, mask = copy_batch(1)
n = int(mask.sum())
ids = ids[:, :n]  # one sequence: no padding
produced = copier.generate(input_ids=ids, num_beams=1, max_new_tokens=n)  # (1, 1 + n): start, copy, EOS
weights = attention_maps.attention_weights(copier, ids, produced[:, :-1])  # decoder reads start + copy
cross = weights["cross"][0]  # (L, h, n, n)
diagonal = cross[-1].mean(0).diagonal()  # last layer, mean over heads: output i -> source i
print("mean weight of output token i on source token i, last layer:", [round(w, 2) for w in diagonal.tolist()])
symbols = [str(i) for i in ids[0, :-1].tolist()] + ["EOS"]
show(attention_maps.plot_heads(cross, symbols, symbols, title="copy task: encoder-decoder attention"),
     "copy_cross_attention")

# %% [markdown]
# ## 9. A translator: Multi30k German→English
#
# The main job (`python scripts/train_translation.py configs/multi30k_de_en.json`, 25 minutes on two CPU cores)
# trains the real model. If you have one, point `WALKTHROUGH_MODEL` at it. Otherwise we train a small model
# here for about a minute, with the same code path (the package's data loading, tokenizer, Seq2SeqTrainer);
# it will not translate well, but every piece is the real one.

# %%
from transformers import HfArgumentParser

from scratch_transformer.arguments import DataTrainingArguments, ModelArguments, TranslationTrainingArguments
from scratch_transformer.translation import run_translation

model_path = os.environ.get("WALKTHROUGH_MODEL", "")  # "train": train here even when the main job's model exists
if not model_path and (REPO / "outputs" / "multi30k_de_en" / "config.json").is_file():
    model_path = str(REPO / "outputs" / "multi30k_de_en")
if model_path in ("", "train"):
    data = os.environ.get("MULTI30K") or str(REPO.parent / "shared" / "data" / "multi30k" / "raw")
    model_path = str(OUT / "multi30k_short")
    flags = {
        "dataset_name": data, "source_lang": "de", "target_lang": "en", "validation_split": "val",
        "test_split": "test_2016_flickr", "max_train_samples": 3000, "max_eval_samples": 16, "max_predict_samples": 16,
        "config_overrides": "d_model=64,num_heads=4,encoder_layers=2,decoder_layers=2,d_ff=128,dropout=0.0",
        "vocab_size": 1000, "max_source_length": 32, "max_target_length": 32, "output_dir": model_path,
        "max_steps": 120, "per_device_train_batch_size": 32, "learning_rate": 3e-3, "warmup_steps": 20,
        "lr_scheduler_type": "linear", "logging_steps": 10, "save_steps": 1000, "eval_strategy": "no",
        "average_last_checkpoints": 0, "precision": "fp32", "num_beams": 1, "seed": 0, "report_to": "none",
        "disable_tqdm": True, "dataloader_num_workers": 0,
    }
    start = time.perf_counter()
    run_translation(*HfArgumentParser((ModelArguments, DataTrainingArguments, TranslationTrainingArguments)).parse_dict(flags))
    print(f"trained {model_path} in {time.perf_counter() - start:.0f} s")

translator, tokenizer = attention_maps.load_model(model_path)
sentence = "Zwei Hunde spielen im Schnee."
maps = attention_maps.sentence_attention(translator, tokenizer, sentence, max_new_tokens=24)
print(sentence, "->", maps.translation)
print("source tokens:", maps.source_tokens)
L, heads = translator.config.decoder_layers, translator.config.num_heads
assert maps.cross.shape == (L, heads, len(maps.output_tokens), len(maps.source_tokens))
assert torch.allclose(maps.cross.sum(-1), torch.ones(maps.cross.shape[:-1]), atol=1e-5)

# %% [markdown]
# Every layer and head: encoder self-attention, decoder self-attention (the causal triangle: nothing above the
# diagonal), and the encoder-decoder attention, where a trained model's heads follow the word alignment
# (the row of "dogs" lights up the column of "Hunde"). The same picture from the command line:
# `python scripts/show_attention.py --model outputs/multi30k_de_en "Zwei Hunde spielen im Schnee."`;
# in the browser: `python scripts/demo.py --model outputs/multi30k_de_en`.

# %%
show(attention_maps.plot_sentence_attention(maps), "multi30k_attention")

# %%
show(attention_maps.plot_learning_rate(model_path), "multi30k_learning_rate")
