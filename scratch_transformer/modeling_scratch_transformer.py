"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), by hand, as a HF model.

Reads in the paper's order: positional encoding (3.5), residual dropout (5.4), the linear
projections, scaled dot-product attention (3.2.1), multi-head attention (3.2.2), position-wise
feed-forward (3.3), encoder and decoder layers (3.1), the stacks with their masks, then the loss and
the Hugging Face classes.

Notation in shape comments:
    b batch, s source length, t target length (new tokens this call), p cached target length,
    d d_model, h heads, k head dim (d / h), f d_ff, v vocabulary size.
"""

import math
import os
import shutil

import torch
import torch.autograd.forward_ad as forward_ad
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers import initialization as init
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)

from .configuration_scratch_transformer import ScratchTransformerConfig

# --------------------------------------------------------------------------------------
# Positional encoding (paper 3.5)
# --------------------------------------------------------------------------------------


def sinusoidal_position_encoding(num_positions: int, d_model: int) -> torch.Tensor:
    """The fixed sinusoids of paper 3.5.

    PE(pos, 2i) = sin(pos / 10000^(2i/d_model)),  PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Args:
        num_positions: number of positions (rows).
        d_model: model width (columns); an odd width drops the last cosine column.
    Returns:
        float32 tensor of shape (num_positions, d_model).
    """
    position = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)  # (n, 1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(num_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)[:, : d_model // 2]
    return table


class ScratchTransformerPositionalEncoding(nn.Module):
    """Looks up rows of the sinusoid table; a non-persistent buffer, recomputed by `_init_weights`."""

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__()
        self.max_positions = config.max_position_embeddings
        self.register_buffer(
            "table", sinusoidal_position_encoding(config.max_position_embeddings, config.d_model), persistent=False
        )

    def forward(self, length: int, offset: int = 0) -> torch.Tensor:
        """Rows offset .. offset+length-1, shape (length, d). Raises ValueError past max_position_embeddings."""
        if offset + length > self.max_positions:
            raise ValueError(
                f"sequence of {offset + length} positions exceeds max_position_embeddings={self.max_positions}"
            )
        return self.table[offset : offset + length]


# --------------------------------------------------------------------------------------
# Dropout (paper 5.4: "Residual Dropout")
# --------------------------------------------------------------------------------------


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout: zero each element with probability p, scale the rest by 1 / (1 - p).

    Same result as `F.dropout` in distribution, at under half its cost on CPU (forward + backward on a
    (64, 24, 256) activation, one thread: 1.3 ms against 2.9 ms): the keep/drop decisions
    come from 16-bit slices of 64-bit random integers (one generator draw per 4 elements instead
    of one float per element), so p is honoured to within 2^-16. Seeded by torch's generator.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), 2**63 - 1)
    bits = bits.view(torch.int16)[:n].view(x.shape)  # uniform over [-2^15, 2^15)
    keep = bits >= round(p * 65536) - 32768
    scale = 1.0 / (1.0 - p)
    if x.dtype == torch.float32:
        # a 0 / scale mask gives the same values as the select below and a cheaper backward (one
        # product instead of a zero fill plus a select); in bf16/fp16 the mask would round the scale
        return x * keep.to(x.dtype).mul_(scale)
    return torch.where(keep, x * scale, 0.0)


class ScratchTransformerDropout(nn.Module):
    """Module wrapper of `dropout` (so `model.eval()` switches it off)."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


# --------------------------------------------------------------------------------------
# Linear projections (every W of the paper: W^Q, W^K, W^V, W^O, W_1, W_2, the output projection)
# --------------------------------------------------------------------------------------


def _onednn_linear_available() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._linear_pointwise.default is not None
    except (AttributeError, RuntimeError):
        return False


_ONEDNN_LINEAR = _onednn_linear_available()


def _plain_cpu_inference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """True when nothing needs nn.Linear's own op: no autograd (backward, forward-mode AD, torch.func
    transforms), no tracing/compiling/export (they should record aten.linear), no autocast, oneDNN enabled,
    fp32 CPU tensors and a packed bias (the oneDNN op reads the bias as contiguous)."""
    return (
        _ONEDNN_LINEAR
        and not torch.is_grad_enabled()
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and weight.dtype == torch.float32
        and (bias is None or (bias.dtype == torch.float32 and bias.is_contiguous()))
        and not torch.is_autocast_enabled("cpu")
        and torch.backends.mkldnn.enabled
        and forward_ad._current_level < 0
        and not torch._C._are_functorch_transforms_active()
        and not torch.jit.is_tracing()
        and not torch.compiler.is_compiling()
    )


class ScratchTransformerLinear(nn.Linear):
    """y = x W^T + b: nn.Linear, with its parameters, init and state-dict names, and a faster inference kernel.

    Shapes: x (..., in_features) -> (..., out_features). At plain inference on CPU (autograd off, fp32,
    no autocast; see `_plain_cpu_inference`), products of at least `min_onednn_macs` multiply-adds
    (rows x in_features x out_features) run through oneDNN's linear kernel
    (`torch.ops.mkldnn._linear_pointwise`, the kernel torch.compile picks for CPU linears) instead of
    nn.Linear's MKL sgemm: for the 64-row inputs of decoding on 2 cores it is 1.3-1.6x faster (output
    projection 256 -> 8000: 2.6 -> 1.6 ms; 256 -> 1024: 263 -> 200 us; `benchmarks/micro_kernels.py`
    prints these, `scripts/benchmark.py` the end-to-end effect). Same values up to float rounding
    (summation order; about 1e-6 relative).
    Everything else (training, torch.func / forward AD, tracing and export, other dtypes and devices,
    builds without oneDNN, `torch.backends.mkldnn.flags(enabled=False)`) uses F.linear.
    torch.ao's `quantize_dynamic` matches exact types and leaves these layers in fp32: turn them into
    plain nn.Linear first (`module.__class__ = nn.Linear` for each; same attributes), then quantize.
    """

    # oneDNN has a fixed cost of up to ~11 us more per call than F.linear: they break even near 2^22
    # multiply-adds and oneDNN wins from 2^24 (benchmarks/micro_kernels.py, 2 threads: 4 x 32 x 64: 15
    # against 5 us; 64 x 256 x 256: 63 against 62 us; 64 x 256 x 1024: 200 against 263 us)
    min_onednn_macs = 2**23

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() * self.out_features >= self.min_onednn_macs and _plain_cpu_inference(x, self.weight, self.bias):
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


# --------------------------------------------------------------------------------------
# Attention (paper 3.2)
# --------------------------------------------------------------------------------------


def eager_attention(query, key, value, attention_mask=None, dropout_p: float = 0.0, is_causal: bool = False):
    """Scaled dot-product attention written out: softmax(Q K^T / sqrt(d_k) + mask) V (paper eq. 1).

    Args:
        query: (b, h, t, k); key, value: (b, h, s, k).
        attention_mask: additive float mask broadcastable to (b, h, t, s): 0 where allowed,
            the dtype's minimum where masked (finite, so a fully masked row gives no NaN).
        dropout_p: dropout on the attention weights (pass 0 at inference).
        is_causal: query i sees keys 0..i only (t == s, no cache), as in F.scaled_dot_product_attention.
    Returns:
        (output (b, h, t, k), weights (b, h, t, s)).
    """
    scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(query.size(-1))  # (b, h, t, s)
    if is_causal:
        t, s = scores.shape[-2:]
        future = torch.ones(t, s, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(future, torch.finfo(scores.dtype).min)
    if attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = dropout(weights, dropout_p, training=dropout_p > 0)
    return torch.matmul(weights, value), weights


def sdpa_attention(query, key, value, attention_mask=None, dropout_p: float = 0.0, is_causal: bool = False):
    """The same computation through PyTorch's fused `F.scaled_dot_product_attention` (no weights returned).

    With attention dropout in training the eager path is used (its dropout is the cheaper one above).
    """
    if dropout_p > 0:
        return eager_attention(query, key, value, attention_mask, dropout_p, is_causal)
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, is_causal=is_causal)
    return output, None


ATTENTION_FUNCTIONS = {"eager": eager_attention, "sdpa": sdpa_attention}


class ScratchTransformerAttention(nn.Module):
    """Multi-head attention (paper 3.2.2): h parallel heads of width k = d/h, concatenated, projected.

    Serves as encoder self-attention, decoder (masked) self-attention and encoder-decoder
    attention (paper 3.2.3). With a cache, self-attention appends this step's keys/values and
    cross-attention computes the encoder's keys/values once per sequence.
    """

    def __init__(self, config: ScratchTransformerConfig, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = config.num_heads
        self.head_dim = config.d_model // config.num_heads
        self.attention_dropout = config.attention_dropout
        self.layer_idx = layer_idx
        self.q_proj = ScratchTransformerLinear(config.d_model, config.d_model)
        self.k_proj = ScratchTransformerLinear(config.d_model, config.d_model)
        self.v_proj = ScratchTransformerLinear(config.d_model, config.d_model)
        self.out_proj = ScratchTransformerLinear(config.d_model, config.d_model)

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # (b, n, d) -> (b, h, n, k)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """
        Args:
            hidden_states: queries' source, (b, t, d).
            key_value_states: encoder output (b, s, d) for cross-attention; None for self-attention.
            attention_mask: additive mask broadcastable to (b, h, t, keys).
            is_causal: apply the causal mask implicitly (self-attention over a whole, unpadded prefix).
            cache: the decoder's EncoderDecoderCache, or None (encoder, or no caching).
            output_attentions: also return the weights (forces the eager path).
        Returns:
            (output (b, t, d), weights (b, h, t, keys) or None).
        """
        b, t, _ = hidden_states.shape
        is_cross = key_value_states is not None
        query = self._split_heads(self.q_proj(hidden_states))  # (b, h, t, k)

        if is_cross and cache is not None and cache.is_updated.get(self.layer_idx):
            # encoder keys/values were computed at the first step; reuse them
            layer_cache = cache.cross_attention_cache.layers[self.layer_idx]
            key, value = layer_cache.keys, layer_cache.values  # (b, h, s, k)
        else:
            source = key_value_states if is_cross else hidden_states
            key = self._split_heads(self.k_proj(source))  # (b, h, s or t, k)
            value = self._split_heads(self.v_proj(source))
            if cache is not None:
                sub_cache = cache.cross_attention_cache if is_cross else cache.self_attention_cache
                key, value = sub_cache.update(key, value, self.layer_idx)  # self: (b, h, p + t, k)
                if is_cross:
                    cache.is_updated[self.layer_idx] = True

        implementation = "eager" if output_attentions else (self.config._attn_implementation or "eager")
        attend = ATTENTION_FUNCTIONS.get(implementation, sdpa_attention)
        dropout_p = self.attention_dropout if self.training else 0.0
        output, weights = attend(query, key, value, attention_mask, dropout_p, is_causal)  # (b, h, t, k)
        output = output.transpose(1, 2).reshape(b, t, -1)  # (b, h, t, k) -> (b, t, d)
        return self.out_proj(output), weights


# --------------------------------------------------------------------------------------
# Position-wise feed-forward network (paper 3.3)
# --------------------------------------------------------------------------------------


class ScratchTransformerFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alike (paper eq. 2)."""

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__()
        self.fc1 = ScratchTransformerLinear(config.d_model, config.d_ff)
        self.fc2 = ScratchTransformerLinear(config.d_ff, config.d_model)
        self.activation = F.relu if config.activation_function == "relu" else F.gelu

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(b, n, d) -> (b, n, f) -> (b, n, d)."""
        return self.fc2(self.activation(self.fc1(hidden_states)))


# --------------------------------------------------------------------------------------
# Encoder and decoder layers (paper 3.1)
# --------------------------------------------------------------------------------------


class ScratchTransformerEncoderLayer(nn.Module):
    """Self-attention then feed-forward, each wrapped as LayerNorm(x + Dropout(Sublayer(x))) (paper 3.1, 5.4).

    With `pre_layer_norm` the wrapping is x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.self_attn = ScratchTransformerAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = ScratchTransformerFeedForward(config)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = ScratchTransformerDropout(config.dropout)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False):
        """hidden_states (b, s, d), attention_mask (b, 1, 1, s) additive -> ((b, s, d), weights or None)."""
        residual = hidden_states
        if self.pre_layer_norm:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states, weights = self.self_attn(
            hidden_states, attention_mask=attention_mask, output_attentions=output_attentions
        )
        hidden_states = residual + self.dropout(hidden_states)
        if not self.pre_layer_norm:
            hidden_states = self.self_attn_layer_norm(hidden_states)

        residual = hidden_states
        if self.pre_layer_norm:
            hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = residual + self.dropout(self.ffn(hidden_states))
        if not self.pre_layer_norm:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states, weights


class ScratchTransformerDecoderLayer(nn.Module):
    """Masked self-attention, encoder-decoder attention, feed-forward; each with residual + LayerNorm (paper 3.1)."""

    def __init__(self, config: ScratchTransformerConfig, layer_idx: int):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.self_attn = ScratchTransformerAttention(config, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = ScratchTransformerAttention(config, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = ScratchTransformerFeedForward(config)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = ScratchTransformerDropout(config.dropout)

    def forward(
        self,
        hidden_states,
        encoder_hidden_states,
        self_attention_mask=None,
        cross_attention_mask=None,
        cache=None,
        output_attentions=False,
        is_causal=False,
    ):
        """hidden_states (b, t, d), encoder_hidden_states (b, s, d), masks additive (b, 1, t, p + t) and
        (b, 1, 1, s) -> ((b, t, d), self-attention weights, cross-attention weights).
        is_causal: the self-attention mask is the plain causal triangle, applied by the kernel."""
        residual = hidden_states
        if self.pre_layer_norm:
            hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states, self_weights = self.self_attn(
            hidden_states, attention_mask=self_attention_mask, cache=cache, output_attentions=output_attentions,
            is_causal=is_causal,
        )
        hidden_states = residual + self.dropout(hidden_states)
        if not self.pre_layer_norm:
            hidden_states = self.self_attn_layer_norm(hidden_states)

        residual = hidden_states
        if self.pre_layer_norm:
            hidden_states = self.encoder_attn_layer_norm(hidden_states)
        hidden_states, cross_weights = self.encoder_attn(
            hidden_states,
            key_value_states=encoder_hidden_states,
            attention_mask=cross_attention_mask,
            cache=cache,
            output_attentions=output_attentions,
        )
        hidden_states = residual + self.dropout(hidden_states)
        if not self.pre_layer_norm:
            hidden_states = self.encoder_attn_layer_norm(hidden_states)

        residual = hidden_states
        if self.pre_layer_norm:
            hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = residual + self.dropout(self.ffn(hidden_states))
        if not self.pre_layer_norm:
            hidden_states = self.final_layer_norm(hidden_states)
        return hidden_states, self_weights, cross_weights


# --------------------------------------------------------------------------------------
# Masks (built once per stack, passed down ready-made)
# --------------------------------------------------------------------------------------


def padding_mask(attention_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(b, n) with 1 = token, 0 = padding -> additive (b, 1, 1, n): 0 or the dtype's minimum."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (batch, length), got {tuple(attention_mask.shape)}")
    blocked = attention_mask[:, None, None, :] == 0  # (b, n) -> (b, 1, 1, n)
    return torch.zeros(blocked.shape, dtype=dtype, device=attention_mask.device).masked_fill(
        blocked, torch.finfo(dtype).min
    )


def check_attention_mask(attention_mask: torch.Tensor | None, source_shape, source_name: str) -> None:
    """Raise ValueError unless the source padding mask is (b, s) like the source it pads."""
    if attention_mask is not None and tuple(attention_mask.shape) != tuple(source_shape):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but {source_name} is {tuple(source_shape)}: "
            "it must be (batch, source length), 1 for tokens and 0 for padding (the tokenizer's attention_mask)"
        )


def causal_mask(length: int, past_length: int, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive (1, 1, t, p + t) mask: query i (at position p + i) may see keys 0 .. p + i (paper 3.2.3)."""
    query_pos = torch.arange(past_length, past_length + length, device=device)[:, None]  # (t, 1)
    key_pos = torch.arange(past_length + length, device=device)[None, :]  # (1, p + t)
    future = key_pos > query_pos  # (t, p + t)
    mask = torch.zeros(future.shape, dtype=dtype, device=device).masked_fill(future, torch.finfo(dtype).min)
    return mask[None, None]  # (t, p + t) -> (1, 1, t, p + t)


# --------------------------------------------------------------------------------------
# Stacks (paper 3.1, 3.4)
# --------------------------------------------------------------------------------------


class ScratchTransformerEmbedding(nn.Module):
    """Token embedding times sqrt(d_model) plus positional encoding, then dropout (paper 3.4, 3.5, 5.4)."""

    def __init__(self, config: ScratchTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_positions = ScratchTransformerPositionalEncoding(config)
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.vocab_size = config.vocab_size
        self.dropout = ScratchTransformerDropout(config.dropout)

    def forward(self, input_ids: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """input_ids (b, n) -> (b, n, d). Raises ValueError for ids outside [0, vocab_size)."""
        if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= self.vocab_size):
            raise ValueError(
                f"token ids must be in [0, vocab_size={self.vocab_size}), got range "
                f"[{int(input_ids.min())}, {int(input_ids.max())}] (labels use -100 only in `labels`)"
            )
        embeddings = self.embed_tokens(input_ids) * self.scale  # (b, n) -> (b, n, d)
        return self.dropout(embeddings + self.embed_positions(input_ids.size(1), offset).to(embeddings.dtype))


class ScratchTransformerEncoder(nn.Module):
    """N identical encoder layers over embedded source tokens (paper 3.1)."""

    def __init__(self, config: ScratchTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed = ScratchTransformerEmbedding(config, embed_tokens)
        self.layers = nn.ModuleList([ScratchTransformerEncoderLayer(config) for _ in range(config.encoder_layers)])
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.pre_layer_norm else None

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.embed.embed_tokens

    def forward(
        self,
        input_ids: torch.LongTensor,
        attention_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
        return_dict: bool = True,
        **kwargs,
    ) -> BaseModelOutput:
        """
        Args:
            input_ids: source token ids (b, s).
            attention_mask: (b, s), 1 for tokens and 0 for padding; None = no padding.
        Returns:
            BaseModelOutput with last_hidden_state (b, s, d), optional hidden_states and attentions.
        """
        check_attention_mask(attention_mask, input_ids.shape, "input_ids")
        hidden_states = self.embed(input_ids)  # (b, s, d)
        mask = padding_mask(attention_mask, hidden_states.dtype) if attention_mask is not None else None
        all_hidden, all_attentions = [], []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, weights = layer(hidden_states, mask, output_attentions)
            if output_attentions:
                all_attentions.append(weights)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        return BaseModelOutput(
            last_hidden_state=hidden_states,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )


class ScratchTransformerDecoder(nn.Module):
    """N identical decoder layers; self-attention masked so position i sees only positions <= i (paper 3.1)."""

    def __init__(self, config: ScratchTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.config = config
        self.embed = ScratchTransformerEmbedding(config, embed_tokens)
        self.layers = nn.ModuleList(
            [ScratchTransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        )
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.pre_layer_norm else None

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.embed.embed_tokens

    def forward(
        self,
        input_ids: torch.LongTensor,
        encoder_hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool = False,
        output_attentions: bool = False,
        output_hidden_states: bool = False,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        """
        Args:
            input_ids: target ids (b, t): the whole prefix, or only new tokens when `cache` holds the rest.
            encoder_hidden_states: (b, s, d).
            attention_mask: target padding (b, p + t) or (b, t), 1 = token; None = no target padding.
            encoder_attention_mask: source padding (b, s).
            cache: EncoderDecoderCache from an earlier step, or None; created when use_cache.
        Returns:
            BaseModelOutputWithPastAndCrossAttentions with last_hidden_state (b, t, d) and cache.
        """
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        t = input_ids.size(1)
        hidden_states = self.embed(input_ids, offset=past_length)  # (b, t, d)
        dtype = hidden_states.dtype

        # Self-attention mask (paper 3.2.3). Without target padding, a whole prefix needs only the
        # causal triangle (the kernel applies it: is_causal) and one new token over the cache needs none.
        self_mask, is_causal = None, False
        if attention_mask is not None:
            if attention_mask.size(1) == t and past_length:  # only the new tokens' mask was given
                attention_mask = F.pad(attention_mask, (past_length, 0), value=1)
            self_mask = causal_mask(t, past_length, dtype, hidden_states.device) + padding_mask(attention_mask, dtype)
            self_mask = self_mask.clamp(min=torch.finfo(dtype).min)  # (b, 1, t, p + t)
        elif past_length == 0:
            is_causal = t > 1
        elif t > 1:
            self_mask = causal_mask(t, past_length, dtype, hidden_states.device)  # (1, 1, t, p + t)
        cross_mask = padding_mask(encoder_attention_mask, dtype) if encoder_attention_mask is not None else None

        all_hidden, all_self, all_cross = [], [], []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states, encoder_hidden_states, self_mask, cross_mask, cache, output_attentions, is_causal
            )
            if output_attentions:
                all_self.append(self_weights)
                all_cross.append(cross_weights)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            cache=cache if use_cache else None,
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_self) if output_attentions else None,
            cross_attentions=tuple(all_cross) if output_attentions else None,
        )


# --------------------------------------------------------------------------------------
# Hugging Face classes
# --------------------------------------------------------------------------------------


# The translation pipeline travels with saved checkpoints (config `custom_pipelines`) when it is beside this file.
_PIPELINE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_scratch_transformer.py")


class SoftmaxCrossEntropy(torch.autograd.Function):
    """Summed cross-entropy of logits against labels, with the gradient written out: softmax - one-hot.

    forward(logits (n, v) float, labels (n,) in [0, v) or -100, normaliser > 0) -> scalar
        sum over labelled rows of -log softmax(logits)[label], divided by normaliser.
    backward: d loss / d logits = (softmax(logits) - one_hot(label)) / normaliser on labelled rows,
        0 on rows labelled -100.

    Same values and gradients as `F.cross_entropy(..., reduction="sum") / normaliser` up to float
    rounding, at two thirds of its cost on CPU: the backward turns the saved
    log-probabilities into the gradient in place instead of filling a fresh (n, v) zero tensor for the
    one-hot and allocating another for the result (fwd + bwd on 1536 x 8000 logits, 2 threads: 43 ms
    against 62 ms, `benchmarks/micro_kernels.py`).
    Because the saved buffer becomes the gradient, it supports one first-order backward per forward,
    which is what training does. Raises RuntimeError for a second backward through the same graph
    (retain_graph) and for second-order gradients (create_graph): compute
    `F.cross_entropy(outputs.logits, labels)` yourself for those.
    """

    @staticmethod
    def forward(ctx, logits, labels, normaliser):
        log_probs = torch.log_softmax(logits, dim=-1)  # (n, v)
        labelled = labels != -100  # (n,)
        targets = labels.masked_fill(~labelled, 0)[:, None]  # (n, 1); -100 rows pick column 0, then get 0
        nll = -log_probs.gather(1, targets).squeeze(1)  # (n,)
        ctx.save_for_backward(log_probs, targets, labelled)
        ctx.normaliser = normaliser
        # where, not a product with the mask: an inf/NaN logit in an unlabelled row must not reach the sum
        return torch.where(labelled, nll, 0.0).sum() / normaliser

    @staticmethod
    def backward(ctx, grad_loss):
        if torch.is_grad_enabled():
            raise RuntimeError(
                "the model's loss does not support second-order gradients (create_graph=True); "
                "use F.cross_entropy on outputs.logits"
            )
        if getattr(ctx, "consumed", False):
            raise RuntimeError(
                "backward through the model's loss twice (retain_graph=True) is not supported: its backward "
                "reuses the saved log-probabilities in place; use F.cross_entropy on outputs.logits"
            )
        ctx.consumed = True
        log_probs, targets, labelled = ctx.saved_tensors
        row_scale = (grad_loss / ctx.normaliser * labelled.to(log_probs.dtype))[:, None]  # (n, 1)
        grad = log_probs.exp_().mul_(row_scale)  # softmax, scaled; reuses the saved buffer
        grad.scatter_add_(1, targets, -row_scale)  # minus the one-hot
        if not labelled.all():
            grad[~labelled] = 0.0  # exactly 0 even where a logit of an unlabelled row is inf or NaN
        return grad, None, None


def cross_entropy_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
) -> torch.Tensor:
    """Cross-entropy in nats per labelled token: logits (b, t, v), labels (b, t) with -100 = no loss.

    Normalised by `num_items_in_batch` when given (Trainer: labelled tokens in the whole accumulated
    batch), else by this batch's labelled tokens; with no labelled token at all the loss is 0 with zero
    gradients, not NaN. Computed in float32 for bf16/fp16 logits, in the logits' dtype otherwise.
    One backward per forward (see SoftmaxCrossEntropy).
    Raises ValueError when labels do not have the logits' leading shape, or hold ids outside [0, v)
    other than -100.
    """
    vocab_size = logits.size(-1)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels must have shape {tuple(logits.shape[:-1])} (the logits' without the vocabulary), "
            f"got {tuple(labels.shape)}"
        )
    flat_labels = labels.reshape(-1)  # (b, t) -> (b * t,)
    labelled = flat_labels != -100
    if labelled.any() and (flat_labels[labelled].min() < 0 or flat_labels[labelled].max() >= vocab_size):
        raise ValueError(
            f"labels must be in [0, vocab_size={vocab_size}) or -100, got range "
            f"[{int(flat_labels[labelled].min())}, {int(flat_labels[labelled].max())}]"
        )
    if num_items_in_batch is None:
        normaliser = labelled.sum().clamp(min=1)
    elif isinstance(num_items_in_batch, torch.Tensor):
        normaliser = num_items_in_batch.clamp(min=1)  # Trainer passes 0 when no micro-batch has a label
    else:
        normaliser = max(num_items_in_batch, 1)
    flat_logits = logits.reshape(-1, vocab_size)  # (b, t, v) -> (b * t, v)
    if flat_logits.dtype in (torch.float16, torch.bfloat16):
        flat_logits = flat_logits.float()
    return SoftmaxCrossEntropy.apply(flat_logits, flat_labels.long(), normaliser)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing inputs: (b, t) labels -> (b, t) [start, y1, ..., y_{t-1}], with -100 replaced by pad."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class ScratchTransformerPreTrainedModel(PreTrainedModel):
    """Weight init (Xavier linears, N(0, d^-1/2) embeddings, paper 3.4) and HF plumbing."""

    config_class = ScratchTransformerConfig
    config: ScratchTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = False
    _supports_sdpa = True
    _no_split_modules = ["ScratchTransformerEncoderLayer", "ScratchTransformerDecoderLayer"]

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            std = self.config.init_std or self.config.d_model**-0.5
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ScratchTransformerPositionalEncoding):
            init.copy_(module.table, sinusoidal_position_encoding(module.max_positions, self.config.d_model))

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        # HF guesses this from the source text; our attention reads config._attn_implementation at
        # every call, so `model.set_attn_implementation("eager" | "sdpa")` always takes effect.
        return True

    def save_pretrained(self, save_directory, *args, **kwargs):
        """HF's save_pretrained; also lists every Auto class in `auto_map` and ships the translation pipeline
        (config `custom_pipelines`), so remote code serves all of them."""
        if self._auto_class is not None:
            auto_map = dict(getattr(self.config, "auto_map", None) or {})
            auto_map.setdefault("AutoModel", "modeling_scratch_transformer.ScratchTransformerModel")
            auto_map.setdefault(
                "AutoModelForSeq2SeqLM", "modeling_scratch_transformer.ScratchTransformerForConditionalGeneration"
            )
            self.config.auto_map = auto_map
            if isinstance(self, GenerationMixin) and os.path.isfile(_PIPELINE_FILE):
                self.config.custom_pipelines = {"translation": {
                    "impl": "pipeline_scratch_transformer.TranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"],
                    "type": "text"}}
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if getattr(self.config, "custom_pipelines", None) and os.path.isfile(_PIPELINE_FILE):
            shutil.copy(_PIPELINE_FILE, os.path.join(save_directory, os.path.basename(_PIPELINE_FILE)))
        return result


class ScratchTransformerModel(ScratchTransformerPreTrainedModel):
    """The bare encoder-decoder: source ids + target prefix -> decoder hidden states (paper figure 1)."""

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            encoder_embed, decoder_embed = self.shared, self.shared
            self._tied_weights_keys = {
                "encoder.embed.embed_tokens.weight": "shared.weight",
                "decoder.embed.embed_tokens.weight": "shared.weight",
            }
        else:
            encoder_embed = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            decoder_embed = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = ScratchTransformerEncoder(config, encoder_embed)
        self.decoder = ScratchTransformerDecoder(config, decoder_embed)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding):
        self.encoder.embed.embed_tokens = value
        if self.config.share_encoder_decoder_embeddings:
            self.shared = value
            self.decoder.embed.embed_tokens = value

    def get_encoder(self, modality=None):
        return self.encoder

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        """
        Args:
            input_ids: source ids (b, s); not needed when `encoder_outputs` is given.
            attention_mask: source padding (b, s), 1 = token. Pass it whenever the batch is padded.
            decoder_input_ids: target prefix (b, t) (only new tokens when `cache` is given).
            decoder_attention_mask: target padding (b, t), optional.
            encoder_outputs: reuse an earlier encoder pass (generate runs the encoder once).
            cache: EncoderDecoderCache for incremental decoding.
        Returns:
            Seq2SeqModelOutput: last_hidden_state (b, t, d), cache, encoder_last_hidden_state (b, s, d), ...
        Raises:
            ValueError: no decoder_input_ids, no source, an attention_mask not of the source's shape (b, s),
                token ids out of range, or too long a sequence.
        """
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (
            output_hidden_states if output_hidden_states is not None else self.config.output_hidden_states
        )
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if decoder_input_ids is None:
            raise ValueError("decoder_input_ids (or labels, for the LM head model) must be given")
        if encoder_outputs is None:
            if input_ids is None:
                raise ValueError("either input_ids or encoder_outputs must be given")
            encoder_outputs = self.encoder(
                input_ids, attention_mask, output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
            )
        else:
            if not isinstance(encoder_outputs, BaseModelOutput):
                encoder_outputs = BaseModelOutput(*encoder_outputs)
            check_attention_mask(attention_mask, encoder_outputs.last_hidden_state.shape[:2],
                                 "encoder_outputs (batch, length)")

        decoder_outputs = self.decoder(
            decoder_input_ids,
            encoder_outputs.last_hidden_state,
            attention_mask=decoder_attention_mask,
            encoder_attention_mask=attention_mask,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class ScratchTransformerForConditionalGeneration(ScratchTransformerPreTrainedModel, GenerationMixin):
    """Encoder-decoder plus the output projection to vocabulary logits, tied to the target embedding (paper 3.4)."""

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed.embed_tokens.weight"}
    # forward normalises the loss by Trainer's `num_items_in_batch` (labelled tokens in the whole
    # accumulated batch), so 8 pairs at once and 4 x 2 accumulated give the same loss and gradients.
    accepts_loss_kwargs = True

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__(config)
        self.model = ScratchTransformerModel(config)
        self.lm_head = ScratchTransformerLinear(config.d_model, config.vocab_size, bias=False)
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
        self.post_init()

    def get_encoder(self, modality=None):
        return self.model.encoder

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear):
        self.lm_head = value

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None,
        cache: Cache | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        """
        Args:
            labels: target ids (b, t) with -100 where no loss is wanted; when decoder_input_ids is None
                they are shifted right behind `decoder_start_token_id` to make it (teacher forcing).
            num_items_in_batch: labelled tokens in the whole (accumulated, all-process) batch, passed by
                Trainer; the loss is then sum / num_items_in_batch instead of the mean over this batch.
                The loss (`cross_entropy_loss`) supports one first-order backward per forward; for
                retain_graph or create_graph use F.cross_entropy on the returned logits.
            (other arguments as in ScratchTransformerModel.forward)
        Returns:
            Seq2SeqLMOutput: logits (b, t, v), loss (cross-entropy over labels != -100, in nats per
            labelled token) when labels are given, cache, encoder_last_hidden_state, attentions when asked.
        Raises:
            ValueError: labels not of shape (b, t) matching the logits, or ids outside [0, v) other than -100
                (and the ScratchTransformerModel.forward errors).
        """
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (b, t, d) -> (b, t, v)

        loss = cross_entropy_loss(logits, labels, num_items_in_batch) if labels is not None else None
        return Seq2SeqLMOutput(
            loss=loss,
            logits=logits,
            cache=outputs.cache,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
        )

    def _validate_generation_mode(self, generation_mode, generation_config, generation_mode_kwargs):
        """generate()'s own argument check, plus the counts HF lets through (num_beams=0 ends in a
        ZeroDivisionError). Raises ValueError naming the argument."""
        for name in ("num_beams", "num_return_sequences"):
            value = getattr(generation_config, name, None)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        super()._validate_generation_mode(generation_mode, generation_config, generation_mode_kwargs)

    @staticmethod
    def _reorder_cache(cache: EncoderDecoderCache, beam_idx: torch.LongTensor) -> EncoderDecoderCache:
        """Beam search, after each step: keep the self-attention keys/values of the surviving beams.

        beam_idx (b * beams,) picks, for each new beam, the row it continues. Beam search only moves
        hypotheses among the beams of one source sentence, and those beams' cross-attention keys/values
        are identical (computed from the same encoder output), so only the self-attention cache
        (b * beams, h, p, k) is gathered. HF's default also gathers the cross-attention cache: the same
        rows, copied every step.
        """
        cache.self_attention_cache.reorder_cache(beam_idx)
        return cache

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Labels (b, t) -> decoder_input_ids (b, t); called by DataCollatorForSeq2Seq."""
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


__all__ = [
    "ScratchTransformerPreTrainedModel",
    "ScratchTransformerModel",
    "ScratchTransformerForConditionalGeneration",
]
