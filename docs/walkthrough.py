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
# # From the paper to a translator: a walk-through that runs, and says why
#
# This walk-through builds the Transformer of *Attention Is All You Need* (Vaswani et al., 2017) piece by
# piece with this package's own classes, and for each choice of the paper shows *why* with a number computed
# here: why the dot products are divided by √d_k, why several heads, why positions must be added and why as
# sinusoids, what shift-right and teacher forcing are, what the KV cache saves, what label smoothing does. Then
# it trains a small German→English translator on a made-up language whose word alignment we know, decodes by
# hand, and looks at where its attention goes. It is a short run on a CPU, and prints its own time at the
# end.
#
# Run it as a notebook (`pip install jupytext notebook`, then `jupytext --to notebook docs/walkthrough.py`
# and open `docs/walkthrough.ipynb`), or as a plain script (`python docs/walkthrough.py`). The test suite
# runs it (tests/test_walkthrough.py), so every number it prints and every claim it checks holds with the code
# beside it.
#
# **The pictures** are written to `docs/walkthrough_pictures/`, next to this file (a notebook also shows them
# inline), and the small translator it trains to `docs/walkthrough_pictures/model/`, ready for
# `python scripts/demo.py --model docs/walkthrough_pictures/model`. Settings (environment variables):
# - `WALKTHROUGH_OUTPUT`: another folder for the pictures and the translator.
# - `WALKTHROUGH_MODEL`: a trained model folder or Hub id to look inside at the end (default:
#   `outputs/multi30k_de_en`, which the main job writes, when it is there; `none` skips that part).
#
# Where the code differs from the paper, or offers an option, is listed in
# [the paper and this code](paper_and_code.md). The Annotated Transformer (harvardnlp) and *Dive into Deep
# Learning* (d2l.ai, chapter 11) tell the same story at more length.
#
# Notation: b batch, s source length, t target length, d = d_model, h heads, k = d / h, v vocabulary.

# %%
# %matplotlib inline
import json
import math
import os
import random
import time
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers.utils import logging as transformers_logging

import scratch_transformer  # registers the model with transformers' Auto classes
from scratch_transformer import ScratchTransformerConfig, ScratchTransformerForConditionalGeneration
from scratch_transformer import attention_maps
from scratch_transformer.modeling_scratch_transformer import (
    ScratchTransformerAttention,
    ScratchTransformerEmbedding,
    ScratchTransformerEncoderLayer,
    ScratchTransformerFeedForward,
    cross_entropy_loss,
    shift_tokens_right,
    sinusoidal_position_encoding,
)

WALL_START = time.perf_counter()
torch.manual_seed(0)
torch.set_num_threads(1)  # models this small run fastest on one thread (more only synchronise)
transformers_logging.set_verbosity_error()  # quiet: the numbers below are what this walk-through prints
transformers_logging.disable_progress_bar()
warnings.filterwarnings("ignore", category=UserWarning)
REPO = next(p for p in [Path.cwd(), *Path.cwd().parents] if (p / "pyproject.toml").is_file())
OUT = Path(os.environ.get("WALKTHROUGH_OUTPUT") or REPO / "docs" / "walkthrough_pictures")
OUT.mkdir(parents=True, exist_ok=True)
print("pictures go to", OUT)


def show(figure, name):
    """Save a picture into OUT and return it (a notebook displays it)."""
    figure.savefig(OUT / f"{name}.png", dpi=80)
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
# The table is fixed, not learned. Dimensions 2i and 2i+1 are a sine and a cosine of the *same* wavelength,
# 2π·10000^(2i/d_model): the pairs' wavelengths grow geometrically, from 2π for dimensions 0 and 1 to just
# under 2π·10000 for the last pair (2π·10000^((d-2)/d): 2π·8660 at the width drawn, d = 128). So the first dimensions tell neighbouring positions apart, the last ones hardly
# change over a sentence: in the picture, the left of the heatmap flickers and the right is flat, and the four
# curves (dimensions far apart) each have their own wavelength, written in the legend.

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
# ### Why positions at all: self-attention does not see order
#
# Attention mixes the values with weights that depend only on *what* the query and the keys are, not on
# *where* they are. Shuffle the input tokens of an encoder layer and its outputs come out shuffled the same way,
# with the same values: self-attention (and the position-wise feed-forward) is *permutation-equivariant*. Without
# positions, "Hund beißt Mann" and "Mann beißt Hund" would give the same vectors, only in another order.

# %%
layer = ScratchTransformerEncoderLayer(config).eval()
words = torch.randn(1, s, d)  # (1, s, d): token vectors without positions
order = torch.randperm(s)
with torch.no_grad():
    shuffled_then_layer = hidden(layer(words[:, order]))
    layer_then_shuffled = hidden(layer(words))[:, order]
    with_positions = hidden(layer(words[:, order] + sinusoidal_position_encoding(s, d)))
    with_positions_shuffled = hidden(layer(words + sinusoidal_position_encoding(s, d)))[:, order]
equivariance_gap = (shuffled_then_layer - layer_then_shuffled).abs().max().item()
position_gap = (with_positions - with_positions_shuffled).abs().max().item()
print(f"no positions:   max |layer(shuffled x) - shuffled layer(x)| = {equivariance_gap:.1e}  (the same vectors)")
print(f"with positions: max |layer(shuffled x) - shuffled layer(x)| = {position_gap:.2f}  (order now matters)")
assert equivariance_gap < 1e-5 and position_gap > 0.1

# %% [markdown]
# ### Why sinusoids: a fixed offset is a fixed linear map
#
# > "We chose this function because we hypothesized it would allow the model to easily learn to attend by
# > relative positions, since for any fixed offset k, PE_{pos+k} can be represented as a linear function of
# > PE_{pos}." (paper 3.5)
#
# With ω_i = 1 / 10000^(2i/d), the pair (sin(pos·ω_i), cos(pos·ω_i)) moved on by k is a *rotation* of it by the
# angle k·ω_i (the angle-sum formulas): so PE(pos + k) = M_k · PE(pos), with M_k block-diagonal, one 2×2 rotation
# per pair, and **the same M_k for every position**. A layer can learn "look two words back" once, as one
# matrix, instead of once per position. It is also why the paper hoped sinusoids would extrapolate to sentences
# longer than those seen in training (learned position embeddings did as well on its test set, Table 3 (E)).

# %%
def offset_matrix(k, d_model):
    """M_k (d, d) with PE(pos + k) = M_k PE(pos) for every pos: a 2x2 rotation by k·ω_i per (sin, cos) pair."""
    matrix = torch.zeros(d_model, d_model)
    for i in range(d_model // 2):
        angle = k / 10000 ** (2 * i / d_model)
        c, s_ = math.cos(angle), math.sin(angle)
        matrix[2 * i: 2 * i + 2, 2 * i: 2 * i + 2] = torch.tensor([[c, s_], [-s_, c]])  # (sin, cos) -> shifted
    return matrix


print("M_3 for d_model = 4 (two rotation blocks):\n", offset_matrix(3, 4).numpy().round(3))
pe = sinusoidal_position_encoding(60, d)  # (60, d)
k_offset = 3
shift_error = (pe[:-k_offset] @ offset_matrix(k_offset, d).T - pe[k_offset:]).abs().max().item()
print(f"max |M_{k_offset} PE(pos) - PE(pos + {k_offset})| over positions 0..{60 - k_offset - 1}: {shift_error:.1e}")
assert shift_error < 1e-4

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
# ### Why divide by √d_k
#
# > "assume that the components of q and k are independent random variables with mean 0 and variance 1. Then
# > their dot product, q · k = Σ q_i k_i, has mean 0 and variance d_k." (paper, footnote 4)
#
# A sum of d_k products of variance 1 has variance d_k: with d_k = 64 the scores spread over ±8 and more, and
# the softmax of such scores puts almost all the weight on one key. There its gradient vanishes (a one-hot
# softmax hardly moves when its inputs move): "pushing the softmax function into regions where it has extremely
# small gradients". Dividing by √d_k brings the variance back to 1, whatever the head size. Measured on 20000
# random queries against 10 random keys each:

# %%
def softmax_statistics(scale, d_k, n=20000, keys=10):
    """Variance of the scores, mean largest weight, mean size of the softmax's gradient, for random q and k."""
    generator_ = torch.Generator().manual_seed(1)
    query = torch.randn(n, 1, d_k, generator=generator_)
    key = torch.randn(n, keys, d_k, generator=generator_)
    scores = ((query @ key.transpose(-2, -1)) * scale).squeeze(1).requires_grad_()  # (n, keys)
    weights = scores.softmax(-1)
    upstream = torch.randn(n, keys, generator=generator_)  # a loss's gradient arriving at the weights
    (weights * upstream).sum().backward()
    return scores.var().item(), weights.max(-1).values.mean().item(), scores.grad.abs().mean().item()


d_k = 64
raw_variance, raw_peak, raw_gradient = softmax_statistics(1.0, d_k)
scaled_variance, scaled_peak, scaled_gradient = softmax_statistics(1 / math.sqrt(d_k), d_k)
print(f"d_k = {d_k}      score variance   mean largest weight   mean |gradient of the scores|")
print(f"q·k            {raw_variance:10.1f}   {raw_peak:19.2f}   {raw_gradient:23.4f}")
print(f"q·k / √d_k     {scaled_variance:10.2f}   {scaled_peak:19.2f}   {scaled_gradient:23.4f}")
assert abs(raw_variance / d_k - 1) < 0.05 and abs(scaled_variance - 1) < 0.05
assert raw_peak > 0.85 and scaled_peak < 0.6 and scaled_gradient > 3 * raw_gradient

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
# ### Why several heads
#
# > "Multi-head attention allows the model to jointly attend to information from different representation
# > subspaces at different positions. With a single attention head, averaging inhibits this."
#
# One head's output is *one* weighted average of the values. Suppose a word needs two things at once: from
# token A what the first half of the dimensions says (its subject, say) and from token B what the second half
# says (its object). Below, the query matches A in the first half of the dimensions and B in the second. One head
# of width 8 sees both matches, splits its weight 50/50 between A and B, and returns their average; with values
# +1 (A) and −1 (B) that average is 0: what each token said is *averaged away*. Two heads of width 4, one per half,
# each put their weight on one token, and the concatenation keeps both: +1 in the first half, −1 in the second.

# %%
strength = 6.0
query = torch.tensor([[strength, 0, 0, 0, strength, 0, 0, 0]])  # (1, 8): one query
keys = torch.tensor([[strength, 0, 0, 0, 0, 0, 0, 0],             # A: matches the first half
                     [0, 0, 0, 0, strength, 0, 0, 0],             # B: matches the second half
                     [0, 0, 0, 0, 0, 0, 0, 0.0]])                 # C: matches nothing
values = torch.stack([torch.ones(8), -torch.ones(8), torch.zeros(8)])  # (3, 8): A says +1, B says -1
one_head, one_head_weights = attention(query, keys, values)  # (1, 8), (1, 3)
halves = lambda y: y.view(-1, 2, 4).transpose(0, 1)  # (n, 8) -> (2 heads, n, 4)
two_heads, two_head_weights = attention(halves(query), halves(keys), halves(values))  # (2, 1, 4), (2, 1, 3)
two_heads = two_heads.transpose(0, 1).reshape(1, 8)  # concat the heads
print("one head:  weights on A, B, C", one_head_weights[0].numpy().round(2), "-> output", one_head[0].numpy().round(2))
for head_index in range(2):
    print(f"head {head_index + 1}:    weights on A, B, C", two_head_weights[head_index, 0].numpy().round(2))
print("two heads, concatenated -> output", two_heads[0].numpy().round(2))
assert one_head.abs().max() < 0.05  # A and B averaged away
assert torch.allclose(two_heads, torch.tensor([[1.0] * 4 + [-1.0] * 4]), atol=0.05)  # both kept

# %% [markdown]
# ## 5. The masks (paper 3.2.3), shift-right and teacher forcing
#
# Padding is never attended to, by anyone; and the decoder's self-attention is *masked*:
# > "We need to prevent leftward information flow in the decoder to preserve the auto-regressive property.
# > We implement this inside of scaled dot-product attention by masking out (setting to −∞) all values in the
# > input of the softmax which correspond to illegal connections."
#
# Below are the masks **the model itself** hands to its attention layers for a padded batch of two sentence
# pairs, read with forward hooks during one forward pass (`attention_maps.model_masks`): each stack builds its
# mask once and every layer receives it. The numbers the model adds to the scores are 0 (may attend) or the
# most negative float32 (≈ −3.4e38, the paper's −∞, finite so that a fully masked row gives no NaN); the
# picture draws them as yellow (may attend) and dark (masked). The first sentence is the shorter one: its
# padded source columns are dark in the two masks that have source columns, the encoder's self-attention and
# the encoder-decoder (cross) attention; the decoder's self-attention has target columns only, and for it the
# mask is the causal triangle with the padded target columns dark too.

# %%
from scratch_transformer.tokenization import train_tokenizer

sentences = ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen Fußball.", "A dog runs across the meadow.",
             "Two men are playing football."]
toy_tokenizer = train_tokenizer(sentences * 3, vocab_size=300, min_frequency=1, model_max_length=64)
mask_config = ScratchTransformerConfig(vocab_size=len(toy_tokenizer), d_model=32, num_heads=4, encoder_layers=2,
                                       decoder_layers=2, d_ff=64, dropout=0.0, max_position_embeddings=64)
mask_config._attn_implementation = "eager"
mask_model = ScratchTransformerForConditionalGeneration(mask_config).eval()
batch = toy_tokenizer(["Ein Hund.", "Zwei Männer spielen Fußball."], text_target=["A dog.", "Two men are playing football."],
                      return_tensors="pt", padding=True)
labels = batch["labels"].masked_fill(batch["labels"] == toy_tokenizer.pad_token_id, -100)  # -100: no loss here

# %% [markdown]
# **Shift-right and teacher forcing.** The decoder predicts token i of the target from the tokens *before* i. So
# its input is the target shifted one place to the right, behind a start token `<s>`: at position i it reads
# y_{i-1} and must output y_i (the label). In training it reads the *true* previous tokens, not its own guesses:
# that is *teacher forcing*. It lets one forward pass train every position at once, and the causal mask is
# what keeps it honest: position i cannot peek at y_i, which sits at position i+1 of the input.

# %%
decoder_input_ids = shift_tokens_right(labels, toy_tokenizer.pad_token_id, mask_config.decoder_start_token_id)
decoder_attention_mask = torch.cat([torch.ones_like(batch["attention_mask"][:, :1]),
                                    (labels[:, :-1] != -100).long()], dim=1)  # (b, t): the shifted padding
row = decoder_input_ids[1]
print(f"{'position':>8}  {'decoder reads':>14}  {'must predict (label)':>20}")
for position, (read, predict) in enumerate(zip(row.tolist(), labels[1].tolist())):
    print(f"{position:>8}  {toy_tokenizer.convert_ids_to_tokens(read):>14}  "
          f"{toy_tokenizer.convert_ids_to_tokens(predict) if predict != -100 else '(padding)':>20}")
assert (decoder_input_ids[:, 0] == mask_config.decoder_start_token_id).all()
assert (decoder_input_ids[:, 1:] == labels[:, :-1].masked_fill(labels[:, :-1] == -100, 0)).all()
with torch.no_grad():  # given only labels, the model shifts them itself: the same logits
    from_labels = mask_model(**{k_: v_ for k_, v_ in batch.items() if k_ != "labels"}, labels=labels).logits
    from_inputs = mask_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                             decoder_input_ids=decoder_input_ids).logits
assert torch.allclose(from_labels, from_inputs, atol=1e-5)

# %%
masks = attention_maps.model_masks(mask_model, batch["input_ids"], decoder_input_ids, batch["attention_mask"],
                                   decoder_attention_mask)
raw_decoder = masks["raw"]["decoder"]  # (b, 1, t, t), float32, added to the scores
print("values the model adds to the decoder's scores:", sorted(set(raw_decoder.unique().tolist())))
print("first sentence, 1 = may attend (rows: queries, columns: keys):")
print((raw_decoder[0, 0] == 0).int())
s_, t_ = batch["input_ids"].size(1), decoder_input_ids.size(1)
source_keys, target_keys = batch["attention_mask"].bool(), decoder_attention_mask.bool()
assert (masks["encoder"] == source_keys[:, None, :]).all() and (masks["cross"] == source_keys[:, None, :]).all()
assert (masks["decoder"] == (torch.ones(t_, t_, dtype=torch.bool).tril() & target_keys[:, None, :])).all()
assert not batch["attention_mask"][0].all()  # the first source is padded
masks["source_tokens"] = [toy_tokenizer.convert_ids_to_tokens(r) for r in batch["input_ids"].tolist()]
masks["target_tokens"] = [toy_tokenizer.convert_ids_to_tokens(r) for r in decoder_input_ids.tolist()]
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
# β₂ = 0.98 and ε = 10⁻⁹ (5.3), a warmup then a linear decay of the learning rate (part 9 draws the paper's
# schedule beside the main job's), no label smoothing, and greedy `generate()` on sequences it never saw: every
# training sequence is kept in a set, and the test sequences are drawn afresh with those left out. (Short ones
# are few, 10³ of length 3, so the training batches hold most of them; a fresh draw that merely looks new would
# often be one the model was trained on.)

# %%
PAD, BOS, EOS, SYMBOLS = 0, 1, 2, 10
copy_config = ScratchTransformerConfig(vocab_size=3 + SYMBOLS, d_model=64, num_heads=4, encoder_layers=2,
                                       decoder_layers=2, d_ff=128, dropout=0.0, max_position_embeddings=16)
copy_config._attn_implementation = "eager"
generator = torch.Generator().manual_seed(0)


def copy_batch(size, shortest=3, longest=8, rng=None):
    """Random sequences of symbols 3.., then EOS, right-padded: ids and attention mask (size, n). rng: a
    torch.Generator (default: this part's own)."""
    rng = rng or generator
    lengths = torch.randint(shortest, longest + 1, (size,), generator=rng)
    ids = torch.full((size, longest + 1), PAD)
    for row, length in enumerate(lengths.tolist()):
        ids[row, :length] = torch.randint(3, 3 + SYMBOLS, (length,), generator=rng)
        ids[row, length] = EOS
    return ids, (ids != PAD).long()


torch.manual_seed(0)
copier = ScratchTransformerForConditionalGeneration(copy_config)
steps, warmup = 400, 40
optimizer = torch.optim.Adam(copier.parameters(), lr=3e-3, betas=(0.9, 0.98), eps=1e-9)
schedule = torch.optim.lr_scheduler.LambdaLR(
    optimizer, lambda step: min((step + 1) / warmup, max(0.0, (steps - step) / (steps - warmup))))
start = time.perf_counter()
copy_training = set()  # every sequence trained on, as a tuple of symbols
copier.train()
for step in range(steps):
    ids, mask = copy_batch(32)
    copy_training.update(tuple(row[: row.index(EOS)]) for row in ids.tolist())
    loss = copier(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(ids == PAD, -100)).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    schedule.step()
    if step % 100 == 0 or step == steps - 1:
        print(f"step {step:4d}  loss {loss.item():.4f}")

copier.eval()
ids, mask = copy_batch(400)
unseen = torch.tensor([tuple(row[: row.index(EOS)]) not in copy_training for row in ids.tolist()])
ids, mask = ids[unseen][:200], mask[unseen][:200]  # 200 sequences not among the training ones
copy_test = [tuple(row[: row.index(EOS)]) for row in ids.tolist()]
assert len(copy_test) == 200 and not set(copy_test) & copy_training
print(f"{len(copy_training)} distinct training sequences; of 400 fresh draws {int((~unseen).sum())} were among them "
      f"and are left out; the test takes 200 of the {int(unseen.sum())} others")
with torch.no_grad():
    copies = copier.generate(input_ids=ids, attention_mask=mask, num_beams=1, max_new_tokens=ids.size(1))
correct = 0
for source_row, copy_row in zip(ids.tolist(), copies[:, 1:].tolist()):  # drop the decoder start token
    wanted = source_row[: source_row.index(EOS)]
    correct += copy_row[: copy_row.index(EOS)] == wanted if EOS in copy_row else False
print(f"copied {correct}/200 unseen sequences exactly (none in the training set) in "
      f"{time.perf_counter() - start:.0f} s")
assert correct == 200

# %% [markdown]
# Where its attention looks: the encoder-decoder attention of the last layer follows the diagonal (output
# token i looks at source token i): the model has learnt to copy by position.

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
# ## 9. Two training choices: label smoothing and the learning-rate schedule (paper 5.3, 5.4)
#
# **Label smoothing.** > "During training, we employed label smoothing of value ε_ls = 0.1. This hurts perplexity,
# as the model learns to be more unsure, but improves accuracy and BLEU score."
#
# The loss compares the model's prediction with a *target distribution*. Without smoothing the target is
# one-hot: all the probability on the right token, so the loss keeps rewarding ever larger logits for it. With
# ε = 0.1 (this package's `label_smoothing`, like HF's `label_smoothing_factor`) the target keeps 1 − ε on the
# right token and spreads ε evenly over all v tokens. A cross-entropy is lowest when the prediction *equals* the
# target, and that lowest value is the target's entropy: so a smoothed model is pushed to say about 90 %,
# never 100 %, and its loss cannot fall below that entropy. Below: the target for v = 10, its entropy computed
# two ways (the formula, and the package's own loss evaluated at the target itself).

# %%
def smoothed_target(label, vocabulary, epsilon):
    """(v,) the label-smoothed target distribution: 1 - eps on `label`, eps spread over all v ids."""
    target = torch.full((vocabulary,), epsilon / vocabulary)
    target[label] += 1 - epsilon
    return target


def entropy(p):
    return -(p * p.log()).sum().item()


def smoothing_floor(vocabulary, epsilon):
    """The least the smoothed loss can be: the entropy of the smoothed target, from the package's loss itself."""
    target = smoothed_target(0, vocabulary, epsilon)
    return cross_entropy_loss(target.log()[None, None], torch.tensor([[0]]), label_smoothing=epsilon).item()


epsilon, small_v = 0.1, 10
target = smoothed_target(3, small_v, epsilon)
print(f"target for label 3 of {small_v}:", target.numpy().round(3), f" entropy {entropy(target):.3f} nats")
print(f"the package's loss at prediction = target: {smoothing_floor(small_v, epsilon):.3f} nats (the same)")
assert math.isclose(target.sum().item(), 1.0, abs_tol=1e-6) and math.isclose(target[3].item(), 0.91, abs_tol=1e-6)
assert math.isclose(entropy(target), smoothing_floor(small_v, epsilon), abs_tol=1e-4)
sharper = smoothed_target(3, small_v, 0.0).clamp(min=1e-6)  # a more confident prediction scores worse
assert cross_entropy_loss(sharper.log()[None, None], torch.tensor([[3]]), label_smoothing=epsilon) > smoothing_floor(small_v, epsilon)

from matplotlib.figure import Figure

figure = Figure(figsize=(8, 3), layout="constrained")
ax = figure.subplots()
ax.bar(range(small_v), smoothed_target(3, small_v, 0.0).numpy(), width=0.8, color="lightgray", label="one-hot (ε = 0)")
ax.bar(range(small_v), target.numpy(), width=0.5, label=f"smoothed (ε = {epsilon}): entropy {entropy(target):.2f} nats")
ax.set_xticks(range(small_v))
ax.set_xlabel("token id (the label is 3)")
ax.set_ylabel("target probability")
ax.set_title("Label smoothing: the target the loss pulls the prediction towards", fontsize=10)
ax.legend(fontsize=8)
show(figure, "label_smoothing")

# %% [markdown]
# **The learning-rate schedule.** > "lrate = d_model^−0.5 · min(step_num^−0.5, step_num · warmup_steps^−1.5)
# [...] increasing the learning rate linearly for the first warmup_steps training steps, and decreasing it
# thereafter proportionally to the inverse square root of the step number. We used warmup_steps = 4000."
#
# Why warm up: a post-LN Transformer's early gradients are large and badly scaled, and Adam's estimates of them
# are not yet reliable: full-size steps at the start can throw it into a place it does not leave. Measured below
# on part 8's copy model, below the schedules. The main job
# (configs/multi30k_de_en.json) uses another common shape: a linear warm-up over a third of its 25-minute
# budget, then a linear decay to zero at the end of the budget, which suits a run whose length is fixed in
# advance (it is laid on the clock; drawn here against steps, as if every step took the same time). Both are
# drawn below at their own scale; the main job's step count is read from benchmarks/results/quality.json. The translator of part 10 uses the paper's shape.

# %%
def paper_rate(step, d_model=512, warmup=4000):
    return d_model ** -0.5 * min(step ** -0.5, step * warmup ** -1.5)


from scratch_transformer.training import noam_peak_learning_rate

main_job = json.loads((REPO / "configs" / "multi30k_de_en.json").read_text())
main_runs = [run for run in json.loads((REPO / "benchmarks" / "results" / "quality.json").read_text())["runs"]
             if run["side"] == "ours"]
main_steps, main_peak, main_warmup = main_runs[-1]["steps"], main_job["learning_rate"], main_job["warmup_steps"]


def main_job_rate(step):
    warmup_steps = main_warmup * main_steps  # a fraction of the budget
    return main_peak * (step / warmup_steps if step < warmup_steps else (main_steps - step) / (main_steps - warmup_steps))


paper_steps = list(range(1, 100_001, 100))
assert math.isclose(max(paper_rate(step) for step in range(1, 100_001)), noam_peak_learning_rate(512, 4000), rel_tol=1e-9)
print(f"paper: peak {noam_peak_learning_rate(512, 4000):.2e} at step 4000, {paper_rate(100_000):.1e} at step 100k; "
      f"main job: peak {main_peak:g} at step {main_warmup * main_steps:.0f} of {main_steps}")
figure = Figure(figsize=(11, 3.2), layout="constrained")
left, right = figure.subplots(1, 2)
left.plot(paper_steps, [paper_rate(step) for step in paper_steps])
left.set_title("the paper (base model): warm-up 4000 steps, then 1/√step", fontsize=9)
main_grid = list(range(1, main_steps + 1, 10))
right.plot(main_grid, [main_job_rate(step) for step in main_grid], color="tab:orange")
right.set_title(f"the main job: linear warm-up over a third, linear decay ({main_steps} steps)", fontsize=9)
for ax in (left, right):
    ax.set_xlabel("step")
    ax.set_ylabel("learning rate")
    ax.grid(alpha=0.3)
show(figure, "learning_rate_schedules")

# %% [markdown]
# **Does the warm-up matter? A small measurement.** Part 8's copy model twice, from the same initial weights on the
# same batches, 150 steps at a peak rate of 10⁻² (above part 8's 3·10⁻³, where this small model copes without it):
# once at the full rate from the first step, once after a linear warm-up over 30 steps. A model that guesses
# uniformly among the 13 ids has a loss of ln 13 = 2.56 nats. One small model and one seed: it shows the direction,
# not how large the effect is for the base model.

# %%
def copy_loss_after(warmup_steps, steps=150, peak=1e-2, seed=0):
    """Mean loss (nats) of the last 20 of `steps` steps training part 8's copy model at a constant `peak` rate,
    reached by a linear warm-up over `warmup_steps` steps (0: from the first step)."""
    torch.manual_seed(seed)
    model_ = ScratchTransformerForConditionalGeneration(copy_config)
    rng_ = torch.Generator().manual_seed(seed)
    optimizer_ = torch.optim.Adam(model_.parameters(), lr=peak, betas=(0.9, 0.98), eps=1e-9)
    schedule_ = torch.optim.lr_scheduler.LambdaLR(optimizer_, lambda step: min(1.0, (step + 1) / warmup_steps)
                                                  if warmup_steps else 1.0)
    losses_ = []
    for _ in range(steps):
        ids_, mask_ = copy_batch(32, rng=rng_)
        loss_ = model_(input_ids=ids_, attention_mask=mask_, labels=ids_.masked_fill(ids_ == PAD, -100)).loss
        optimizer_.zero_grad()
        loss_.backward()
        optimizer_.step()
        schedule_.step()
        losses_.append(loss_.item())
    return sum(losses_[-20:]) / 20


no_warmup_loss, warmup_loss = copy_loss_after(0), copy_loss_after(30)
print(f"copy model, 150 steps at 1e-2: loss of the last 20 steps {no_warmup_loss:.2f} nats without warm-up, "
      f"{warmup_loss:.2f} with 30 steps of warm-up (uniform guessing: {math.log(3 + SYMBOLS):.2f})")
assert no_warmup_loss > warmup_loss + 0.5

# %% [markdown]
# ## 10. A translator whose alignment we know
#
# A real corpus (Multi30k, the main job: 25 minutes) takes too long here. Instead: a small made-up slice of
# German with its English, generated from a lexicon, so that we know which English word comes from which German
# word. It has one thing that makes it more than a copy: German may put the place first and the verb second
# ("Im Schnee spielen zwei Hunde."), English keeps subject–verb–place ("Two dogs play in the snow."). The
# pair (dogs, play, snow) is held out of training, so the sentences we translate below are new to the model.
# The training is a plain loop: the package's tokenizer and model, Adam with the paper's β₂ and ε, label
# smoothing 0.1, and the paper's schedule shape (linear warm-up, then 1/√step).

# %%
NUMBERS = {"zwei": "two", "drei": "three", "vier": "four", "viele": "many"}
ADJECTIVES = {"kleine": "little", "große": "big", "schwarze": "black", "weiße": "white", "braune": "brown"}
NOUNS = {"Hunde": "dogs", "Katzen": "cats", "Männer": "men", "Frauen": "women", "Kinder": "children",
         "Pferde": "horses", "Vögel": "birds", "Jungen": "boys", "Mädchen": "girls"}
VERBS = {"spielen": "play", "laufen": "run", "schlafen": "sleep", "sitzen": "sit", "warten": "wait",
         "stehen": "stand"}
PLACES = {"im Schnee": "in the snow", "im Park": "in the park", "im Wasser": "in the water",
          "im Gras": "in the grass", "auf der Straße": "on the street", "auf der Wiese": "on the meadow",
          "am Strand": "on the beach", "unter dem Baum": "under the tree"}
HELD_OUT = ("Hunde", "spielen", "im Schnee")


def sentence_pair(rng):
    """(German, English, alignment): alignment maps each English word's index to its German word's index."""
    number, noun, verb, place = (rng.choice(list(words)) for words in (NUMBERS, NOUNS, VERBS, PLACES))
    adjective = rng.choice(list(ADJECTIVES)) if rng.random() < 0.5 else None
    subject = [number] + ([adjective] if adjective else []) + [noun]
    place_first = rng.random() < 0.5
    german = place.split() + [verb] + subject if place_first else subject + [verb] + place.split()
    english = ([NUMBERS[number]] + ([ADJECTIVES[adjective]] if adjective else []) + [NOUNS[noun], VERBS[verb]]
               + PLACES[place].split())
    where = {word: index for index, word in enumerate(german)}
    place_words = place.split()  # "in the snow" <- "im Schnee": in, the <- im; "on the street" <- "auf der Straße"
    place_source = ([place_words[0], place_words[0], place_words[1]] if len(place_words) == 2 else place_words)
    alignment = [where[w] for w in subject + [verb] + place_source]
    capital = lambda words: " ".join(words)[0].upper() + " ".join(words)[1:] + "."
    return capital(german), capital(english), alignment, (noun, verb, place)


rng = random.Random(0)
pairs = []
while len(pairs) < 20000:
    german, english, _, key = sentence_pair(rng)
    if key != HELD_OUT:
        pairs.append((german, english))
print(len(pairs), "training pairs, e.g.", pairs[0], pairs[1])
tokenizer = train_tokenizer([side for pair in pairs for side in pair], vocab_size=320, min_frequency=1,
                            initial_alphabet=None, model_max_length=32)
print("tokens:", tokenizer.tokenize("Im Schnee spielen zwei kleine Hunde."))

# %%
translator_config = ScratchTransformerConfig(
    vocab_size=len(tokenizer), d_model=64, num_heads=4, encoder_layers=2, decoder_layers=2, d_ff=128, dropout=0.0,
    max_position_embeddings=32, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
    eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id)
translator_config._attn_implementation = "eager"
torch.manual_seed(0)
translator = ScratchTransformerForConditionalGeneration(translator_config)
steps, warmup, peak, batch_size = 600, 60, 3e-3, 32
optimizer = torch.optim.Adam(translator.parameters(), lr=peak, betas=(0.9, 0.98), eps=1e-9)
schedule = torch.optim.lr_scheduler.LambdaLR(  # the paper's shape: linear warm-up, then 1/sqrt(step)
    optimizer, lambda step: min((step + 1) / warmup, math.sqrt(warmup / (step + 1))))
start, losses = time.perf_counter(), []
translator.train()
for step in range(steps):
    chunk = pairs[(step * batch_size) % len(pairs):][:batch_size]
    source = tokenizer([german for german, _ in chunk], return_tensors="pt", padding=True)
    labels = tokenizer(text_target=[english for _, english in chunk], return_tensors="pt", padding=True)["input_ids"]
    labels = labels.masked_fill(labels == tokenizer.pad_token_id, -100)  # the model shifts them right itself
    loss = translator(**source, labels=labels, label_smoothing=epsilon).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    schedule.step()
    losses.append(loss.item())
    if step % 150 == 0 or step == steps - 1:
        print(f"step {step:4d}  loss {loss.item():.3f}")
translator.eval()
floor = smoothing_floor(len(tokenizer), epsilon)
final_loss = sum(losses[-50:]) / 50
print(f"trained in {time.perf_counter() - start:.0f} s; loss of the last 50 steps {final_loss:.3f} nats, "
      f"the least a smoothed loss can be with v = {len(tokenizer)}: {floor:.3f}")
assert abs(final_loss - floor) < 0.05  # learnt: it sits on the floor label smoothing sets

# %% [markdown]
# The loss stops at the floor computed in part 9, not at 0: that is label smoothing at work. And the model's
# confidence shows it: its most likely token gets about 1 − ε of the probability, where the copier of part 8,
# trained without smoothing, is all but certain.

# %%
with torch.no_grad():
    check = tokenizer([g for g, _ in pairs[:64]], return_tensors="pt", padding=True)
    check_labels = tokenizer(text_target=[e for _, e in pairs[:64]], return_tensors="pt", padding=True)["input_ids"]
    probabilities = translator(**check, labels=check_labels.masked_fill(check_labels == 0, -100)).logits.softmax(-1)
    translator_confidence = probabilities.max(-1).values[check_labels != 0].mean().item()
    ids, mask = copy_batch(64)
    copier_probabilities = copier(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(ids == PAD, -100)).logits.softmax(-1)
    copier_confidence = copier_probabilities.max(-1).values[ids != PAD].mean().item()
print(f"mean probability of the top token: translator (ε = 0.1) {translator_confidence:.3f}, "
      f"copier (ε = 0) {copier_confidence:.3f}")
assert 0.85 < translator_confidence < 0.95 and copier_confidence > 0.97

# %% [markdown]
# ## 11. Decoding, written out: greedy, then with the KV cache
#
# At inference there is no teacher: the decoder reads what it has produced so far. Greedy decoding: run the
# encoder once, start the decoder with `<s>`, take the most likely next token, append it, run again, until
# `</s>`. Written over the model's own forward:

# %%
sentence = "Im Schnee spielen zwei Hunde."
source = tokenizer([sentence], return_tensors="pt")
with torch.no_grad():
    encoder_outputs = translator.get_encoder()(**source)  # the encoder runs once: (1, s, d)
    produced = torch.tensor([[translator_config.decoder_start_token_id]])  # (1, 1): <s>
    positions_without_cache = 0
    while produced.size(1) < 20 and produced[0, -1] != translator_config.eos_token_id:
        logits = translator(encoder_outputs=encoder_outputs, attention_mask=source["attention_mask"],
                            decoder_input_ids=produced).logits  # (1, i, v): the whole prefix again
        positions_without_cache += produced.size(1)
        produced = torch.cat([produced, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
print(sentence, "->", tokenizer.decode(produced[0], skip_special_tokens=True))
print("step by step:", tokenizer.convert_ids_to_tokens(produced[0]))

# %% [markdown]
# Each step above feeds the *whole* prefix again, and every layer recomputes the keys and values of all the
# earlier positions, which have not changed (the causal mask means earlier positions never see later ones).
# The **KV cache** keeps each layer's keys and values: a step then feeds only the newest token, computes its
# query, key and value, appends the key and value to the cache and attends over all of them. The cross-attention's
# keys and values (from the encoder's output) are computed at the first step and kept too. Same tokens, less work:

# %%
with torch.no_grad():
    cached = torch.tensor([[translator_config.decoder_start_token_id]])
    cache, positions_with_cache = None, 0
    while cached.size(1) < 20 and cached[0, -1] != translator_config.eos_token_id:
        output = translator(encoder_outputs=encoder_outputs, attention_mask=source["attention_mask"],
                            decoder_input_ids=cached[:, -1:], cache=cache, use_cache=True)  # only the newest token
        cache, positions_with_cache = output.cache, positions_with_cache + 1
        cached = torch.cat([cached, output.logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    generated = translator.generate(**source, num_beams=1, do_sample=False, max_new_tokens=19)
print("by hand:", produced[0].tolist())
print("cached: ", cached[0].tolist())
print("generate():", generated[0].tolist())
print(f"decoder positions computed: {positions_without_cache} without the cache, {positions_with_cache} with it "
      f"(n(n+1)/2 against n for n = {positions_with_cache} steps)")
assert produced.tolist() == cached.tolist() == generated.tolist()
assert positions_without_cache == positions_with_cache * (positions_with_cache + 1) // 2

# %% [markdown]
# ## 12. Where it looks: the alignment
#
# `generate()` translated "Im Schnee spielen zwei Hunde.", a sentence it never saw, with the place first. Now the
# encoder-decoder attention of that translation (`attention_maps.sentence_attention`: one teacher-forced forward
# with `output_attentions=True` over what generate() produced). Row: the English token being produced; column:
# the German token. The picture is the last layer, **averaged over its heads**, with the weights written in: the
# row of "dogs" lights up the column of "Hunde." at the *end* of the German sentence, "Two" looks at "zwei",
# "play" at "spielen": the attention follows the words, not the positions. The function words "in" and "the"
# have no German word of their own here ("im" holds both) and look less sharply. How often that holds is
# measured on 100 sentences that are *not* in the training set: fresh draws from the same lexicon, each checked
# against the 20000 training pairs (which hold about 11000 distinct sentences, so a fresh draw is often one of
# them) and skipped if it is there. For each English content word of each sentence translated exactly: is the
# German word with the most weight its translation?

# %%
maps = attention_maps.sentence_attention(translator, tokenizer, sentence, num_beams=1, max_new_tokens=20)
print(sentence, "->", maps.translation)
assert maps.translation == "Two dogs play in the snow."
last_layer = maps.cross[-1].mean(0)  # (t, s): last layer, averaged over heads
looked_at = {out: maps.source_tokens[int(last_layer[i].argmax())] for i, out in enumerate(maps.output_tokens)}
print("English token -> German token with the most weight:", looked_at)
assert looked_at["▁dogs"].startswith("▁Hunde") and looked_at["▁play"] == "▁spielen" and looked_at["▁Two"] == "▁zwei"
show(attention_maps.plot_attention_matrix(last_layer, maps.output_tokens, maps.source_tokens,
                                          title="encoder-decoder attention, last layer, mean over heads "
                                                "(rows: English produced, columns: German)"), "translation_alignment")


# %%
training_set = set(pairs)
rng_ = random.Random(1)
held_out_sentences, skipped = [], 0
while len(held_out_sentences) < 100:  # fresh draws, those in the training set left out
    german, english, alignment, _ = sentence_pair(rng_)
    if (german, english) in training_set:
        skipped += 1
    elif all(german != other[0] for other in held_out_sentences):
        held_out_sentences.append((german, english, alignment))
assert not {(german, english) for german, english, _ in held_out_sentences} & training_set
held_out_results = [attention_maps.sentence_attention(translator, tokenizer, german, num_beams=1, max_new_tokens=20)
                    for german, _, _ in held_out_sentences]
exact = sum(result.translation == english for result, (_, english, _) in zip(held_out_results, held_out_sentences))
print(f"{len(training_set)} distinct training pairs; {len(held_out_sentences)} test sentences not among them "
      f"({skipped} fresh draws that were training pairs skipped); translated exactly: {exact}/{len(held_out_sentences)}")


def word_alignment_agreement(layer):
    """Share of English content words whose German word (the sum of its tokens' weights, mean over heads) with
    the most weight is its translation, over the held-out sentences translated exactly."""
    hits = total = 0
    for result, (german, english, alignment) in zip(held_out_results, held_out_sentences):
        if result.translation != english:
            continue
        source_word, index = [], -1  # German word index of each source token ("▁" starts a word)
        for token in result.source_tokens:
            index += token.startswith("▁") or token == "</s>"
            source_word.append(index)
        english_word = -1
        grid = result.cross[layer].mean(0)  # (t, s)
        for i, token in enumerate(result.output_tokens[:-1]):  # the last row produces </s>
            english_word += token.startswith("▁")
            words = torch.zeros(max(source_word) + 1).index_add_(0, torch.tensor(source_word), grid[i])
            words = words[: len(german.split())]  # leave out </s>
            if english.split()[english_word].rstrip(".").lower() in ("in", "the", "on", "under"):
                continue  # function words: their German word is shared ("im" = "in the")
            hits += int(words.argmax()) == alignment[english_word]
            total += 1
    return hits / total


agreement = {layer_index + 1: word_alignment_agreement(layer_index) for layer_index in range(translator_config.decoder_layers)}
print("share of content words whose most-attended German word is their translation, by layer:",
      {layer_index: round(share, 2) for layer_index, share in agreement.items()})
assert agreement[translator_config.decoder_layers] > 0.8

# %% [markdown]
# Every layer and head of all three attentions: encoder self-attention (German to German), decoder
# self-attention (the causal triangle: nothing above the diagonal) and encoder-decoder attention. Heads differ:
# some follow the alignment sharply, others spread out or look at `</s>` (a common resting place when a head has
# nothing to fetch).

# %%
show(attention_maps.plot_sentence_attention(maps), "translation_attention")

# %% [markdown]
# The translator is saved (model and tokenizer, as `save_pretrained` writes them) into `model/` beside the
# pictures, `docs/walkthrough_pictures/model`, so the command-line pictures and the browser demo (values on hover,
# all three kinds) work on it at once; it knows only the made-up German above:
# `python scripts/show_attention.py --model docs/walkthrough_pictures/model "Im Schnee spielen zwei Hunde."` and
# `python scripts/demo.py --model docs/walkthrough_pictures/model` (`pip install -e ".[demo]"` first). For real
# German, the main job's model: `--model outputs/multi30k_de_en`.

# %%
MODEL_DIR = OUT / "model"
translator.save_pretrained(MODEL_DIR)
tokenizer.save_pretrained(MODEL_DIR)
assert attention_maps.model_problem(str(MODEL_DIR)) is None  # what the demo and show_attention.py check first
print("the translator is saved in", MODEL_DIR)

# %% [markdown]
# ## 13. Your trained model
#
# With the main job's model (`outputs/multi30k_de_en`) or another one named by `WALKTHROUGH_MODEL`, the same
# look at real German: the last layer's encoder-decoder attention, averaged over heads. Skipped when there is
# none.

# %%
model_path = os.environ.get("WALKTHROUGH_MODEL", "")
if not model_path and (REPO / "outputs" / "multi30k_de_en" / "config.json").is_file():
    model_path = str(REPO / "outputs" / "multi30k_de_en")
if model_path and model_path != "none":
    trained, trained_tokenizer = attention_maps.load_model(model_path)
    real = attention_maps.sentence_attention(trained, trained_tokenizer, "Zwei Hunde spielen im Schnee.", max_new_tokens=24)
    print(f"{model_path}: Zwei Hunde spielen im Schnee. -> {real.translation}")
    show(attention_maps.plot_attention_matrix(real.cross[-1].mean(0), real.output_tokens, real.source_tokens,
                                              title=f"{model_path}: encoder-decoder attention, last layer, mean over heads"),
         "trained_model_alignment")
else:
    print("no trained model (WALKTHROUGH_MODEL); the main job writes one: "
          "python scripts/train_translation.py configs/multi30k_de_en.json")
print(f"walk-through done in {time.perf_counter() - WALL_START:.0f} s; pictures in {OUT}: "
      f"{', '.join(sorted(path.name for path in OUT.glob('*.png')))}")
