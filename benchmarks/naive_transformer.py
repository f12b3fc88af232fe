"""A naive, tutorial-style Transformer (Vaswani et al., 2017): the speed baseline for `python -m benchmarks`.

Not used by the package. Written the way tutorials write it (in the spirit of "The Annotated
Transformer"), with nothing fused or cached:

- multi-head attention with separate Q, K, V (and output) `nn.Linear`s; attention as
  matmul -> masked_fill(mask == 0, -1e9) -> softmax -> dropout -> matmul;
- post-LN sub-layers, LayerNorm(x + Dropout(Sublayer(x))) (paper 3.1, 5.4);
- ReLU feed-forward without inner dropout (paper 3.3);
- sinusoidal positions (paper 3.5) and embeddings scaled by sqrt(d_model) (paper 3.4), then dropout;
- one embedding matrix shared by source, target and the (bias-free) output projection (paper 3.4);
- `naive_greedy_decode` re-runs the whole decoder over the full prefix at every step (no KV cache).

Sizes come from any object with the attribute names of `ScratchTransformerConfig` (vocab_size,
d_model, num_heads, encoder_layers, decoder_layers, d_ff, dropout, attention_dropout,
max_position_embeddings, pad_token_id, layer_norm_eps), so the parameter count equals that of
`ScratchTransformerForConditionalGeneration` with `share_encoder_decoder_embeddings=True`.

Shapes: b batch, s source length, t target length, d d_model, v vocabulary.
Masks are boolean/0-1 tensors, 1 (True) = may attend: source (b, 1, 1, s), target (b, 1, t, t).
"""

import copy
import math

import torch
import torch.nn.functional as F
from torch import nn


def attention(query, key, value, mask=None, dropout=None):
    """softmax(Q K^T / sqrt(d_k)) V with masked positions set to -1e9 before the softmax.

    query (b, h, t, k), key/value (b, h, s, k), mask broadcastable to (b, h, t, s) with 0 = blocked.
    """
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h, d_model, dropout=0.0):
        super().__init__()
        assert d_model % h == 0
        self.d_k = d_model // h
        self.h = h
        self.q_linear = nn.Linear(d_model, d_model)
        self.k_linear = nn.Linear(d_model, d_model)
        self.v_linear = nn.Linear(d_model, d_model)
        self.out_linear = nn.Linear(d_model, d_model)
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        b = query.size(0)
        q = self.q_linear(query).view(b, -1, self.h, self.d_k).transpose(1, 2)
        k = self.k_linear(key).view(b, -1, self.h, self.d_k).transpose(1, 2)
        v = self.v_linear(value).view(b, -1, self.h, self.d_k).transpose(1, 2)
        x, _ = attention(q, k, v, mask=mask, dropout=self.dropout)
        x = x.transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k)
        return self.out_linear(x)


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w_1 = nn.Linear(d_model, d_ff)
        self.w_2 = nn.Linear(d_ff, d_model)

    def forward(self, x):
        return self.w_2(F.relu(self.w_1(x)))


class SublayerConnection(nn.Module):
    """Post-LN residual: LayerNorm(x + Dropout(sublayer(x)))."""

    def __init__(self, size, dropout, eps=1e-5):
        super().__init__()
        self.norm = nn.LayerNorm(size, eps=eps)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    def __init__(self, d_model, self_attn, feed_forward, dropout, eps):
        super().__init__()
        self.self_attn = self_attn
        self.feed_forward = feed_forward
        self.sublayer = nn.ModuleList([SublayerConnection(d_model, dropout, eps) for _ in range(2)])

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    def __init__(self, d_model, self_attn, src_attn, feed_forward, dropout, eps):
        super().__init__()
        self.self_attn = self_attn
        self.src_attn = src_attn
        self.feed_forward = feed_forward
        self.sublayer = nn.ModuleList([SublayerConnection(d_model, dropout, eps) for _ in range(3)])

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.sublayer[0](x, lambda x: self.self_attn(x, x, x, tgt_mask))
        x = self.sublayer[1](x, lambda x: self.src_attn(x, memory, memory, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class PositionalEncoding(nn.Module):
    """Adds the fixed sinusoids of paper 3.5 to scaled embeddings, then dropout."""

    def __init__(self, d_model, dropout, max_len):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len).unsqueeze(1).float()
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * -(math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)[:, : d_model // 2]
        self.register_buffer("pe", pe.unsqueeze(0), persistent=False)

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)])


class Embeddings(nn.Module):
    def __init__(self, embedding: nn.Embedding, d_model):
        super().__init__()
        self.lut = embedding
        self.d_model = d_model

    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model)


def subsequent_mask(size, device=None):
    """(1, size, size) boolean: True where query i may see key j (j <= i)."""
    return torch.tril(torch.ones(1, size, size, dtype=torch.bool, device=device))


class NaiveTransformer(nn.Module):
    """Encoder-decoder with a shared source/target embedding tied to the output projection."""

    def __init__(
        self,
        vocab_size,
        d_model=512,
        num_heads=8,
        encoder_layers=6,
        decoder_layers=6,
        d_ff=2048,
        dropout=0.1,
        attention_dropout=0.0,
        max_position_embeddings=1024,
        pad_token_id=0,
        layer_norm_eps=1e-5,
    ):
        super().__init__()
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.pad_token_id = pad_token_id
        attn = MultiHeadedAttention(num_heads, d_model, attention_dropout)
        ff = PositionwiseFeedForward(d_model, d_ff)
        c = copy.deepcopy
        self.encoder_layers = nn.ModuleList(
            [EncoderLayer(d_model, c(attn), c(ff), dropout, layer_norm_eps) for _ in range(encoder_layers)]
        )
        self.decoder_layers = nn.ModuleList(
            [DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout, layer_norm_eps) for _ in range(decoder_layers)]
        )
        self.shared = nn.Embedding(vocab_size, d_model, padding_idx=pad_token_id)
        self.src_embed = Embeddings(self.shared, d_model)
        self.tgt_embed = Embeddings(self.shared, d_model)
        self.src_pos = PositionalEncoding(d_model, dropout, max_position_embeddings)
        self.tgt_pos = PositionalEncoding(d_model, dropout, max_position_embeddings)
        self.generator = nn.Linear(d_model, vocab_size, bias=False)
        self.generator.weight = self.shared.weight  # tied (paper 3.4)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    @classmethod
    def from_config(cls, config):
        """Build from a `ScratchTransformerConfig` (or anything with the same attribute names)."""
        return cls(
            vocab_size=config.vocab_size,
            d_model=config.d_model,
            num_heads=config.num_heads,
            encoder_layers=config.encoder_layers,
            decoder_layers=config.decoder_layers,
            d_ff=config.d_ff,
            dropout=config.dropout,
            attention_dropout=getattr(config, "attention_dropout", 0.0),
            max_position_embeddings=config.max_position_embeddings,
            pad_token_id=config.pad_token_id if config.pad_token_id is not None else 0,
            layer_norm_eps=getattr(config, "layer_norm_eps", 1e-5),
        )

    def encode(self, src, src_mask):
        """src (b, s) ids, src_mask (b, 1, 1, s) -> memory (b, s, d)."""
        x = self.src_pos(self.src_embed(src))
        for layer in self.encoder_layers:
            x = layer(x, src_mask)
        return x

    def decode(self, memory, src_mask, tgt, tgt_mask):
        """tgt (b, t) ids, tgt_mask (b or 1, t, t) -> hidden states (b, t, d)."""
        x = self.tgt_pos(self.tgt_embed(tgt))
        if tgt_mask.dim() == 3:
            tgt_mask = tgt_mask.unsqueeze(1)  # (b, t, t) -> (b, 1, t, t)
        for layer in self.decoder_layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return x

    def forward(self, src, tgt, src_mask, tgt_mask):
        """Teacher forcing: (b, s), (b, t) ids -> logits (b, t, v)."""
        return self.generator(self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask))


def make_masks(src, tgt, pad_token_id):
    """Source padding mask (b, 1, 1, s) and target pad-and-future mask (b, t, t); True = may attend."""
    src_mask = (src != pad_token_id)[:, None, None, :]
    tgt_mask = (tgt != pad_token_id).unsqueeze(-2) & subsequent_mask(tgt.size(-1), tgt.device)
    return src_mask, tgt_mask


@torch.no_grad()
def naive_greedy_decode(model, src, src_mask, max_new_tokens, start_id):
    """Greedy decoding with no cache: exactly `max_new_tokens` steps, each re-running the decoder over
    the whole prefix (no stopping at EOS).

    Args:
        model: a `NaiveTransformer`.
        src: (b, s) source ids.
        src_mask: source mask broadcastable to (b, 1, 1, s), 1/True = token; a (b, s) 0/1 attention mask
            is accepted too.
        max_new_tokens: number of tokens to generate.
        start_id: the decoder start token.
    Returns:
        (b, 1 + max_new_tokens) ids, starting with `start_id`.
    """
    if src_mask.dim() == 2:
        src_mask = src_mask[:, None, None, :]
    memory = model.encode(src, src_mask)
    ys = torch.full((src.size(0), 1), start_id, dtype=src.dtype, device=src.device)
    for _ in range(max_new_tokens):
        out = model.decode(memory, src_mask, ys, subsequent_mask(ys.size(1), src.device))
        logits = model.generator(out[:, -1])
        next_word = logits.argmax(dim=-1, keepdim=True)
        ys = torch.cat([ys, next_word.to(ys.dtype)], dim=1)
    return ys


__all__ = ["NaiveTransformer", "naive_greedy_decode", "make_masks", "subsequent_mask", "attention"]
