"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), by hand, as a Hugging Face model.

Reads bottom-up, each piece under the heading of its paper section, before the pieces built from it:
    3.1    Model Architecture: the overview (figure 1) and where each part is defined
    3.4    Embeddings and Softmax  +  3.5 Positional Encoding   (the stacks' input)
    3.2    Attention: 3.2.1 scaled dot-product, 3.2.2 multi-head, 3.2.3 its three uses and their masks
    3.3    Position-wise Feed-Forward Networks
    3.1    Sublayer connection: residual, dropout (5.4) and LayerNorm, post-LN or pre-LN, written once
    3.1    Encoder and Decoder Stacks: the two layers and the two stacks
    HF     Hugging Face classes: init, loss, the bare model, the model with its LM head, generate()'s hooks
Attention goes through transformers' attention interface: eq. 1 written out below is the "eager" implementation,
sdpa / flex_attention / flash_attention_* come from ALL_ATTENTION_FUNCTIONS (config._attn_implementation), and the
masks are built once per stack by transformers' masking_utils in the form the implementation reads.
Speed code (`linear(layer, x)`: oneDNN for the projections at CPU inference; `dropout(layer, x)`: the dropout mask
drawn 4 values at a time in CPU training) is in kernels_scratch_transformer.py.

Notation in shape comments:
    b batch, s source length, t target length (new tokens this call), p cached target length,
    d d_model, h heads, k head dim (d / h), f d_ff, v vocabulary size, n any sequence length.
"""

import functools
import inspect
import math
import os
import shutil

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from transformers import GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

try:  # what transformers 4.54 has: the per-layer cache (Cache.layers), masking_utils, GradientCheckpointingLayer
    from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
    from transformers.masking_utils import create_causal_mask
    from transformers.modeling_layers import GradientCheckpointingLayer
    from transformers.utils.deprecation import deprecate_kwarg

    DynamicCache(config=None).layers
except (ImportError, AttributeError, TypeError):
    raise ImportError(f"scratch_transformer's model code needs transformers >= 4.54 (found {transformers.__version__}):"
                      " pip install -U 'transformers>=4.54'") from None

from .configuration_scratch_transformer import ScratchTransformerConfig
from .kernels_scratch_transformer import (  # the same results as layer(x), F.dropout, F.cross_entropy, faster on CPU
    check_labels,
    cross_entropy,
    dropout,
    dropout_values,
    linear,
)

# -------- The transformers this file meets: 5.x, and 4.x from 4.54
# This file travels with the weights and runs on whatever transformers the user has. Where 4.x lacks what 5 has,
# the fallback is chosen by looking for the feature, never by the version string; tests/test_remote_code.py loads
# a saved model with 4.57 (this package not importable) and checks that generate() gives 5's ids (so it does, run
# by hand, with 4.54.1, 4.55.4 and 4.56.2). Before 4.54 (no per-layer cache) it cannot work: the imports above
# then say so in one line.
try:
    from transformers import initialization as init  # 5: init functions that leave loaded weights alone
except ImportError:  # 4.x: torch's own (4.x itself skips the loaded weights)
    from torch.nn import init

# The cache's name, in generate()'s calls of forward and in the output classes: `cache` in 5, `past_key_values` in
# 4.x. forward takes `cache`; the other name is read as it too, with a deprecation warning only where it is not
# the installed transformers' own (4.x's generate() passes past_key_values at every step).
CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"
if CACHE_FIELD == "cache":
    reads_past_key_values = deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
else:

    def reads_past_key_values(forward):
        @functools.wraps(forward)
        def wrapper(*args, **kwargs):
            if "past_key_values" in kwargs:
                kwargs["cache"] = kwargs.pop("past_key_values")
            return forward(*args, **kwargs)

        return wrapper


def cache_field(cache: Cache | None) -> dict:
    """{name: cache} for an output class, under the installed transformers' name for it (CACHE_FIELD)."""
    return {CACHE_FIELD: cache}


# 4.x's static cache writes new keys where cache_kwargs["cache_position"] says (at 0 without it); 5's cache layers
# count their own length.
if "cache_kwargs" in inspect.signature(DynamicCache.update).parameters:

    def update_cache(cache: Cache, key: torch.Tensor, value: torch.Tensor, layer_idx: int):
        """cache.update, with the new keys' positions: right after those the layer holds."""
        positions = torch.arange(key.size(2), device=key.device) + cache.get_seq_length(layer_idx)
        return cache.update(key, value, layer_idx, {"cache_position": positions})

else:

    def update_cache(cache: Cache, key: torch.Tensor, value: torch.Tensor, layer_idx: int):
        """cache.update: appends key, value (b, h, n, k) to layer layer_idx; returns all its keys and values."""
        return cache.update(key, value, layer_idx)


_CAUSAL_MASK_PARAMETERS = inspect.signature(create_causal_mask).parameters
if "cache" not in _CAUSAL_MASK_PARAMETERS:  # before 5.24: past_key_values=; 4.x: input_embeds=, cache_position=
    _create_causal_mask_past_key_values = create_causal_mask
    _EMBEDS_NAME = "inputs_embeds" if "inputs_embeds" in _CAUSAL_MASK_PARAMETERS else "input_embeds"

    def create_causal_mask(config, inputs_embeds, attention_mask, cache=None):
        """The installed create_causal_mask called with 5.24's arguments; where it asks for cache_position, the new
        tokens' positions follow the cache's."""
        kwargs = {_EMBEDS_NAME: inputs_embeds}
        if "cache_position" in _CAUSAL_MASK_PARAMETERS:
            past = cache.get_seq_length() if cache is not None else 0
            kwargs["cache_position"] = torch.arange(inputs_embeds.size(1), device=inputs_embeds.device) + past
        return _create_causal_mask_past_key_values(config=config, attention_mask=attention_mask,
                                                   past_key_values=cache, **kwargs)


try:
    from transformers.masking_utils import create_bidirectional_mask
except ImportError:  # 4.x: built from 4.x's mask interface, in the form 5 builds it
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    def create_bidirectional_mask(config, inputs_embeds, attention_mask, encoder_hidden_states=None):
        """Queries inputs_embeds (b, t, d) may attend every key but padding: attention_mask (b, s) 1 = token.
        None when nothing is padded (as 5's); a prepared 4-D mask is returned as it is."""
        if attention_mask is None or attention_mask.dim() == 4:
            return attention_mask
        attention_mask = attention_mask.to(device=inputs_embeds.device, dtype=torch.bool)
        if not torch.compiler.is_compiling() and bool(attention_mask.all()):
            return None
        return ALL_MASK_ATTENTION_FUNCTIONS[config._attn_implementation](
            batch_size=attention_mask.size(0), kv_length=attention_mask.size(1),
            cache_position=torch.arange(inputs_embeds.size(1), device=inputs_embeds.device),
            mask_function=lambda batch, head, query, key: key >= 0, attention_mask=attention_mask,
            allow_is_causal_skip=False, dtype=inputs_embeds.dtype, config=config,
        )

else:
    if "inputs_embeds" not in inspect.signature(create_bidirectional_mask).parameters:  # early 5.x: input_embeds
        _create_bidirectional_mask_input_embeds = create_bidirectional_mask

        def create_bidirectional_mask(config, inputs_embeds, attention_mask, encoder_hidden_states=None):
            return _create_bidirectional_mask_input_embeds(config=config, input_embeds=inputs_embeds,
                                                           attention_mask=attention_mask,
                                                           encoder_hidden_states=encoder_hidden_states)


# ======== 3.1 Model Architecture (overview) ========================================================
# An encoder maps source tokens (b, s) to representations (b, s, d); a decoder, given those and the target
# prefix (b, t), predicts the next target token at every position, one token at a time when generating.
# Both stacks are N identical layers of sublayers, each wrapped in a residual connection and LayerNorm.
# Built below: the input embedding (3.4, 3.5), attention (3.2), the feed-forward network (3.3), the
# sublayer connection, the layers and stacks (3.1), then the output projection and softmax (HF classes).


# ======== 3.4 Embeddings and Softmax, 3.5 Positional Encoding ======================================


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

    def forward(self, length: int, offset: int | torch.Tensor = 0) -> torch.Tensor:
        """Rows offset .. offset+length-1, shape (length, d); offset is an int, or a 0-d tensor (a static cache's
        length, so a compiled decoding step does not recompile per position). Raises ValueError past
        max_position_embeddings (not checked while compiling or exporting: reading a tensor offset is a sync)."""
        if not torch.compiler.is_compiling() and int(offset) + length > self.max_positions:
            raise ValueError(
                f"sequence of {int(offset) + length} positions exceeds max_position_embeddings={self.max_positions}"
            )
        if isinstance(offset, int):
            return self.table[offset : offset + length]
        return self.table[torch.arange(length, device=self.table.device) + offset]  # (n,) -> (n, d)


def check_token_ids(input_ids: torch.Tensor, vocab_size: int) -> None:
    """Raise ValueError for ids outside [0, vocab_size) (nn.Embedding would raise an IndexError on CPU and a device
    assert on CUDA).

    Not checked while torch.compile or torch.export traces the model: the check reads the ids' values, a
    data-dependent branch that breaks the graph (and a host sync at every call). The ids still meet it at the API
    boundary: generate() runs the encoder on the caller's ids uncompiled, and the decoder only sees ids it chose.
    """
    if torch.compiler.is_compiling() or not input_ids.numel():
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"token ids must be in [0, vocab_size={vocab_size}), got range [{low}, {high}] "
            "(labels use -100 only in `labels`)"
        )


class ScratchTransformerEmbedding(nn.Module):
    """Token embedding times sqrt(d_model) plus positional encoding, then dropout (paper 3.4, 3.5, 5.4).

    The embedding matrix is passed in: the stacks may share one (joint vocabulary), and the decoder's is
    tied to the output projection before the softmax (paper 3.4; see the HF classes).
    """

    def __init__(self, config: ScratchTransformerConfig, embed_tokens: nn.Embedding):
        super().__init__()
        self.embed_tokens = embed_tokens
        self.embed_positions = ScratchTransformerPositionalEncoding(config)
        self.scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None,
        offset: int | torch.Tensor = 0,
    ) -> torch.Tensor:
        """input_ids (b, n), or inputs_embeds (b, n, d) = embed_tokens(ids) before scaling, at positions offset..
        -> (b, n, d). Raises ValueError for ids outside [0, vocab size) (the table's size: it follows
        resize_token_embeddings) and past max_position_embeddings."""
        if inputs_embeds is None:
            check_token_ids(input_ids, self.embed_tokens.num_embeddings)
            inputs_embeds = self.embed_tokens(input_ids)  # (b, n) -> (b, n, d)
        positions = self.embed_positions(inputs_embeds.size(1), offset).to(inputs_embeds.dtype)  # (n, d)
        return dropout(self.dropout, inputs_embeds * self.scale + positions)


# ======== 3.2 Attention ============================================================================

# -------- 3.2.1 Scaled Dot-Product Attention


def eager_attention_forward(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0, **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention written out: softmax(Q K^T / sqrt(d_k) + mask) V (paper eq. 1).

    The "eager" implementation, with the signature of transformers' attention interface, so it stands beside
    the others of `ALL_ATTENTION_FUNCTIONS` (sdpa, flex_attention, flash_attention_2/3).

    Args:
        module: the calling ScratchTransformerAttention (its `is_causal` is read).
        query: (b, h, t, k); key, value: (b, h, s, k).
        attention_mask: None, or broadcastable to (b, h, t, s) in either form masking_utils builds: additive float
            (0 where allowed, the dtype's minimum where masked: finite, so a fully masked row gives no NaN) or
            boolean (True where allowed). None with `module.is_causal` and t > 1: the causal triangle (t == s),
            as sdpa's is_causal (the form the masks built for sdpa take when nothing is padded).
        scaling: multiplies the scores; 1 / sqrt(k) by default (paper 3.2.1).
        dropout: dropout on the attention weights (0 at inference).
        **kwargs: what the other implementations read (is_causal overrides module.is_causal); ignored here.
    Returns:
        (output (b, t, h, k), weights (b, h, t, s)).
    """
    scaling = query.size(-1) ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-2, -1)) * scaling  # (b, h, t, s)
    if attention_mask is None and query.size(2) > 1 and kwargs.get("is_causal", getattr(module, "is_causal", False)):
        attention_mask = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()  # (t, s)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    if dropout > 0:
        weights = dropout_values(weights, dropout)
    output = torch.matmul(weights, value).transpose(1, 2)  # (b, h, t, k) -> (b, t, h, k)
    return output, weights


# -------- 3.2.2 Multi-Head Attention


class ScratchTransformerAttention(nn.Module):
    """Multi-head attention (paper 3.2.2): h parallel heads of width k = d/h, concatenated, projected.

    Serves as encoder self-attention, decoder (masked) self-attention and encoder-decoder
    attention (paper 3.2.3). With a cache, self-attention appends this step's keys/values and
    cross-attention computes the encoder's keys/values once per sequence. The scaled dot-product itself is
    `config._attn_implementation`'s: "eager" (eq. 1 above) or one of transformers' ALL_ATTENTION_FUNCTIONS.
    """

    def __init__(self, config: ScratchTransformerConfig, layer_idx: int | None = None, is_causal: bool = False):
        super().__init__()
        self.config = config
        self.num_heads = config.num_heads
        self.head_dim = config.d_model // config.num_heads
        self.scaling = self.head_dim**-0.5
        self.attention_dropout = config.attention_dropout
        self.layer_idx = layer_idx
        self.is_causal = is_causal  # read by sdpa / flash / eager when no mask is given
        self.q_proj = nn.Linear(config.d_model, config.d_model)  # W^Q of all heads side by side
        self.k_proj = nn.Linear(config.d_model, config.d_model)  # W^K
        self.v_proj = nn.Linear(config.d_model, config.d_model)  # W^V
        self.out_proj = nn.Linear(config.d_model, config.d_model)  # W^O

    def _split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        return x.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # (b, n, d) -> (b, h, n, k)

    def _attention_function(self, output_attentions: bool):
        implementation = self.config._attn_implementation or "eager"
        if implementation == "eager" or (output_attentions and implementation == "sdpa"):
            return eager_attention_forward  # sdpa's masks (None + is_causal, boolean) are forms eager reads
        if output_attentions:
            raise ValueError(
                f"output_attentions=True needs attn_implementation 'eager' or 'sdpa', not {implementation!r} (its "
                "kernel returns no weights): call model.set_attn_implementation('eager') first"
            )
        return ALL_ATTENTION_FUNCTIONS[implementation]

    def forward(
        self, hidden_states: torch.Tensor, key_value_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None, cache: EncoderDecoderCache | None = None,
        output_attentions: bool = False, **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """
        Args:
            hidden_states: queries' source, (b, t, d).
            key_value_states: encoder output (b, s, d) for cross-attention; None for self-attention.
            attention_mask: the stack's mask in the form masking_utils built for the implementation (a 4-D
                additive or boolean tensor, a flex BlockMask, a 2-D padding mask for flash, or None).
            cache: the decoder's EncoderDecoderCache, or None (encoder, or no caching).
            output_attentions: also return the weights (sdpa then runs as eager; others raise ValueError).
            **kwargs: passed to the attention function (e.g. flash attention's cu_seqlens).
        Returns:
            (output (b, t, d), weights (b, h, t, keys) or None).
        """
        b, t, _ = hidden_states.shape
        is_cross = key_value_states is not None
        query = self._split_heads(linear(self.q_proj, hidden_states))  # (b, h, t, k)

        if is_cross and cache is not None and cache.is_updated.get(self.layer_idx):
            # encoder keys/values were computed at the first step; reuse them
            layer_cache = cache.cross_attention_cache.layers[self.layer_idx]
            key, value = layer_cache.keys, layer_cache.values  # (b, h, s, k)
        else:
            source = key_value_states if is_cross else hidden_states
            key = self._split_heads(linear(self.k_proj, source))  # (b, h, s or t, k)
            value = self._split_heads(linear(self.v_proj, source))
            if cache is not None:
                sub_cache = cache.cross_attention_cache if is_cross else cache.self_attention_cache
                key, value = update_cache(sub_cache, key, value, self.layer_idx)  # (b, h, p + t, k); static: max len
                if is_cross:
                    cache.is_updated[self.layer_idx] = True

        attend = self._attention_function(output_attentions)
        dropout_p = self.attention_dropout if self.training else 0.0
        output, weights = attend(self, query, key, value, attention_mask, scaling=self.scaling, dropout=dropout_p,
                                 **kwargs)  # (b, t, h, k)
        output = output.reshape(b, t, -1)  # (b, t, h, k) -> (b, t, d)
        return linear(self.out_proj, output), weights


# -------- 3.2.3 Applications of Attention in our Model: the masks
# Encoder self-attention and encoder-decoder attention mask source padding; decoder self-attention also masks
# the future (query i sees keys <= i). Each stack builds its masks once, with transformers' masking_utils, in the
# form its attention implementation reads (additive float for eager, boolean or None + is_causal for sdpa, a
# BlockMask for flex, the 2-D padding mask for flash); the layers pass them down ready-made.


def check_attention_mask(attention_mask: torch.Tensor | None, source_shape, source_name: str) -> None:
    """Raise ValueError unless the source padding mask is (b, s) like the source it pads; a prepared 4-D mask
    must end in the source length."""
    if attention_mask is None:
        return
    shape, (b, s) = tuple(attention_mask.shape), tuple(source_shape)
    if attention_mask.dim() == 4 and shape[-1] == s and shape[0] in (1, b):
        return
    if shape != (b, s):
        raise ValueError(
            f"attention_mask has shape {shape} but {source_name} is {(b, s)}: "
            "it must be (batch, source length), 1 for tokens and 0 for padding (the tokenizer's attention_mask)"
        )


def check_decoder_attention_mask(attention_mask: torch.Tensor | None, batch: int, length: int, past_length) -> None:
    """Raise ValueError unless the target padding mask is (b, p + t) or (b, t) (1 = token), or a prepared 4-D
    mask (b or 1, 1 or h, t, keys) as generate() passes with a static cache."""
    if attention_mask is None:
        return
    if attention_mask.dim() == 4 and attention_mask.size(0) in (1, batch) and attention_mask.size(2) == length:
        return
    if attention_mask.dim() == 2 and attention_mask.size(0) == batch and (
        attention_mask.size(1) == length or torch.compiler.is_compiling()
        or attention_mask.size(1) == int(past_length) + length
    ):
        return
    raise ValueError(
        f"decoder_attention_mask has shape {tuple(attention_mask.shape)}: it must be (batch, target length) = "
        f"({batch}, {length}) or cover the cache too (batch, {int(past_length) + length}), 1 for tokens and "
        "0 for padding, or a prepared 4-D mask (batch, 1, target length, keys)"
    )


# ======== 3.3 Position-wise Feed-Forward Networks ==================================================


class ScratchTransformerFeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alike (paper eq. 2)."""

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.activation = F.relu if config.activation_function == "relu" else F.gelu

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """(b, n, d) -> (b, n, f) -> (b, n, d)."""
        return linear(self.fc2, self.activation(linear(self.fc1, hidden_states)))


# ======== 3.1 Sublayer connection (with 5.4 Residual Dropout) ======================================


class ScratchTransformerLayer(GradientCheckpointingLayer):
    """What the encoder and decoder layers share: the sublayer connection around each of their sublayers.

    A GradientCheckpointingLayer: after `model.gradient_checkpointing_enable()` (or Trainer's
    gradient_checkpointing=True) a training forward keeps only each layer's input and recomputes the layer in
    backward (same values: the recompute replays the same dropout draws).
    """

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__()
        self.pre_layer_norm = config.pre_layer_norm
        self.dropout = nn.Dropout(config.dropout)

    def sublayer(self, hidden_states: torch.Tensor, layer_norm: nn.LayerNorm, sublayer: nn.Module, **kwargs):
        """LayerNorm(x + Dropout(Sublayer(x))) (paper 3.1, 5.4); pre-LN: x + Dropout(Sublayer(LayerNorm(x))).

        Args:
            hidden_states: x, (b, n, d).
            layer_norm: this sublayer's LayerNorm (the layer owns it, under its usual name).
            sublayer: attention or feed-forward, called with kwargs; returns (b, n, d) or ((b, n, d), weights).
        Returns:
            (the wrapped output (b, n, d), the sublayer's attention weights or None).
        """
        output = sublayer(layer_norm(hidden_states) if self.pre_layer_norm else hidden_states, **kwargs)
        output, weights = output if isinstance(output, tuple) else (output, None)
        hidden_states = hidden_states + dropout(self.dropout, output)
        return (hidden_states if self.pre_layer_norm else layer_norm(hidden_states)), weights


# ======== 3.1 Encoder and Decoder Stacks ===========================================================


class ScratchTransformerEncoderLayer(ScratchTransformerLayer):
    """Self-attention, then feed-forward, each in a sublayer connection (paper 3.1)."""

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__(config)
        self.self_attn = ScratchTransformerAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = ScratchTransformerFeedForward(config)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states, attention_mask=None, output_attentions=False, **kwargs):
        """hidden_states (b, s, d), attention_mask built by the encoder (e.g. (b, 1, s, s)) -> ((b, s, d), weights
        or None). kwargs go to the attention function."""
        hidden_states, weights = self.sublayer(hidden_states, self.self_attn_layer_norm, self.self_attn,
                                               attention_mask=attention_mask, output_attentions=output_attentions,
                                               **kwargs)
        hidden_states, _ = self.sublayer(hidden_states, self.final_layer_norm, self.ffn)
        return hidden_states, weights


class ScratchTransformerDecoderLayer(ScratchTransformerLayer):
    """Masked self-attention, encoder-decoder attention, feed-forward, each in a sublayer connection (paper 3.1)."""

    def __init__(self, config: ScratchTransformerConfig, layer_idx: int):
        super().__init__(config)
        self.self_attn = ScratchTransformerAttention(config, layer_idx=layer_idx, is_causal=True)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = ScratchTransformerAttention(config, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.ffn = ScratchTransformerFeedForward(config)
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states, encoder_hidden_states, self_attention_mask=None, cross_attention_mask=None,
                cache=None, output_attentions=False, **kwargs):
        """hidden_states (b, t, d), encoder_hidden_states (b, s, d), masks built by the decoder (e.g.
        (b, 1, t, p + t) and (b, 1, t, s); None: causal only, and no source padding) -> ((b, t, d), self-attention
        weights, cross-attention weights). kwargs go to the attention function."""
        hidden_states, self_weights = self.sublayer(
            hidden_states, self.self_attn_layer_norm, self.self_attn, attention_mask=self_attention_mask,
            cache=cache, output_attentions=output_attentions, **kwargs,
        )
        hidden_states, cross_weights = self.sublayer(
            hidden_states, self.encoder_attn_layer_norm, self.encoder_attn, key_value_states=encoder_hidden_states,
            attention_mask=cross_attention_mask, cache=cache, output_attentions=output_attentions, **kwargs,
        )
        hidden_states, _ = self.sublayer(hidden_states, self.final_layer_norm, self.ffn)
        return hidden_states, self_weights, cross_weights


class ScratchTransformerStack(nn.Module):
    """What both stacks share: the input embedding, N layers, and pre-LN's final LayerNorm (paper 3.1)."""

    def __init__(self, config: ScratchTransformerConfig, embed_tokens: nn.Embedding, layers: list[nn.Module]):
        super().__init__()
        self.config = config
        self.embed = ScratchTransformerEmbedding(config, embed_tokens)
        self.layers = nn.ModuleList(layers)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.pre_layer_norm else None

    @property
    def embed_tokens(self) -> nn.Embedding:
        return self.embed.embed_tokens

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embed.embed_tokens


def _ids_or_embeds(input_ids, inputs_embeds, ids_name: str, embeds_name: str) -> tuple[int, int]:
    """(b, n) of the one input given; ValueError when both or neither are given, or the shapes are not
    (b, n) ids / (b, n, d) vectors with b, n > 0 (generate() on a 1-D or empty tensor meets this error)."""
    if (input_ids is None) == (inputs_embeds is None):
        raise ValueError(f"give exactly one of {ids_name} (batch, length) or {embeds_name} (batch, length, d_model)")
    given, name, dims = (input_ids, ids_name, 2) if input_ids is not None else (inputs_embeds, embeds_name, 3)
    if given.dim() != dims:
        raise ValueError(f"{name} must have {dims} dimensions ({'batch, length' + ', d_model' * (dims == 3)}), "
                         f"got shape {tuple(given.shape)}")
    if given.size(0) == 0 or given.size(1) == 0:
        raise ValueError(f"{name} is empty (shape {tuple(given.shape)}): give at least one sequence of at least "
                         "one token")
    return given.size(0), given.size(1)


class ScratchTransformerEncoder(ScratchTransformerStack):
    """N identical encoder layers over embedded source tokens (paper 3.1)."""

    def __init__(self, config: ScratchTransformerConfig, embed_tokens: nn.Embedding):
        layers = [ScratchTransformerEncoderLayer(config) for _ in range(config.encoder_layers)]
        super().__init__(config, embed_tokens, layers)

    def forward(
        self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None, output_attentions: bool = False,
        output_hidden_states: bool = False, return_dict: bool = True, **kwargs,
    ) -> BaseModelOutput | tuple:
        """
        Args:
            input_ids: source token ids (b, s); or
            inputs_embeds: (b, s, d), what embed_tokens(input_ids) gives (scaled by sqrt(d) and given positions
                here, as ids are).
            attention_mask: (b, s), 1 for tokens and 0 for padding; None = no padding; or a prepared 4-D mask.
            return_dict: False returns the output's fields as a tuple.
            **kwargs: passed down to the attention function.
        Returns:
            BaseModelOutput with last_hidden_state (b, s, d), optional hidden_states and attentions.
        Raises:
            ValueError: both or neither of input_ids / inputs_embeds, a wrong shape or no tokens, a mask not of the
                source's shape, ids out of range, a source longer than max_position_embeddings.
        """
        shape = _ids_or_embeds(input_ids, inputs_embeds, "input_ids", "inputs_embeds")
        check_attention_mask(attention_mask, shape, "input_ids" if input_ids is not None else "inputs_embeds")
        hidden_states = self.embed(input_ids, inputs_embeds)  # (b, s, d)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask)
        all_hidden, all_attentions = [], []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, weights = layer(hidden_states, mask, output_attentions, **kwargs)
            if output_attentions:
                all_attentions.append(weights)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        output = BaseModelOutput(
            last_hidden_state=hidden_states, hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_attentions) if output_attentions else None,
        )
        return output if return_dict is not False else output.to_tuple()


class ScratchTransformerDecoder(ScratchTransformerStack):
    """N identical decoder layers; self-attention masked so position i sees only positions <= i (paper 3.1)."""

    def __init__(self, config: ScratchTransformerConfig, embed_tokens: nn.Embedding):
        layers = [ScratchTransformerDecoderLayer(config, layer_idx=i) for i in range(config.decoder_layers)]
        super().__init__(config, embed_tokens, layers)

    @reads_past_key_values  # the v4 name, as in transformers' models
    def forward(
        self, input_ids: torch.LongTensor | None = None, encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None, encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None, inputs_embeds: torch.Tensor | None = None, use_cache: bool = False,
        output_attentions: bool = False, output_hidden_states: bool = False, return_dict: bool = True, **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions | tuple:
        """
        Args:
            input_ids: target ids (b, t): the whole prefix, or only new tokens when `cache` holds the rest; or
            inputs_embeds: (b, t, d), embed_tokens(input_ids).
            encoder_hidden_states: (b, s, d).
            attention_mask: target padding (b, p + t) or (b, t), 1 = token; None = no target padding; or a
                prepared 4-D mask (generate() builds one for a static cache).
            encoder_attention_mask: source padding (b, s).
            cache: EncoderDecoderCache (dynamic or static) from an earlier step, or None; created when use_cache.
            **kwargs: passed down to the attention function.
        Returns:
            BaseModelOutputWithPastAndCrossAttentions with last_hidden_state (b, t, d) and cache.
        """
        b, t = _ids_or_embeds(input_ids, inputs_embeds, "decoder_input_ids", "decoder_inputs_embeds")
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0  # an int; a 0-d tensor for a static cache
        check_decoder_attention_mask(attention_mask, b, t, past_length)
        if attention_mask is not None and attention_mask.dim() == 2 and isinstance(past_length, int) and past_length \
                and attention_mask.size(1) == t:  # only the new tokens' mask was given: the cached ones are tokens
            attention_mask = F.pad(attention_mask, (past_length, 0), value=1)  # (b, t) -> (b, p + t)
        hidden_states = self.embed(input_ids, inputs_embeds, offset=past_length)  # (b, t, d)
        self_mask = create_causal_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask,
            cache=cache.self_attention_cache if cache is not None else None,
        )
        cross_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )

        all_hidden, all_self, all_cross = [], [], []
        for layer in self.layers:
            if output_hidden_states:
                all_hidden.append(hidden_states)
            hidden_states, self_weights, cross_weights = layer(
                hidden_states, encoder_hidden_states, self_mask, cross_mask, cache=cache,
                output_attentions=output_attentions, **kwargs,
            )
            if output_attentions:
                all_self.append(self_weights)
                all_cross.append(cross_weights)
        if self.layer_norm is not None:
            hidden_states = self.layer_norm(hidden_states)
        if output_hidden_states:
            all_hidden.append(hidden_states)
        output = BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states, **cache_field(cache if use_cache else None),
            hidden_states=tuple(all_hidden) if output_hidden_states else None,
            attentions=tuple(all_self) if output_attentions else None,
            cross_attentions=tuple(all_cross) if output_attentions else None,
        )
        return output if return_dict is not False else output.to_tuple()


# ======== Hugging Face classes (with 3.4's output projection, in the LM head model) ================


# The translation pipeline travels with saved checkpoints (config `custom_pipelines`) when it is beside this file.
_PIPELINE_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "pipeline_scratch_transformer.py")


def cross_entropy_loss(
    logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None,
    label_smoothing: float = 0.0,
) -> torch.Tensor:
    """Cross-entropy in nats per labelled token: logits (b, t, v), labels (b, t) with -100 = no loss.

    The sum over labelled tokens (F.cross_entropy's, ignore_index=-100; on CPU computed by chunks of rows,
    `kernels_scratch_transformer.cross_entropy`), divided by `num_items_in_batch` when
    given (Trainer: labelled tokens in the whole accumulated batch), else by this batch's labelled tokens;
    with no labelled token at all the loss is 0 with zero gradients, not NaN. Computed in float32 for
    bf16/fp16 logits. With `label_smoothing` eps (paper 5.4), the target is (1 - eps) on the label and eps
    spread evenly over all v ids: (1 - eps) * nll + eps * mean_v(-log p), the same loss as HF's LabelSmoother
    (Trainer's label_smoothing_factor), in one kernel instead of several passes over (b, t, v) tensors.
    Raises ValueError when labels do not have the logits' leading shape, hold ids outside [0, v) other than
    -100, or label_smoothing is outside [0, 1).
    """
    vocab_size = logits.size(-1)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"labels must have shape {tuple(logits.shape[:-1])} (the logits' without the vocabulary), "
            f"got {tuple(labels.shape)}"
        )
    # (b, t, v) -> (b * t, v); the kernel checks the ids and label_smoothing (ValueError)
    total = cross_entropy(logits.reshape(-1, vocab_size), labels.reshape(-1), label_smoothing)
    count = (labels != -100).sum() if num_items_in_batch is None else num_items_in_batch  # Trainer may pass 0: no label
    return total / (count.clamp(min=1) if isinstance(count, torch.Tensor) else max(count, 1))


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher forcing inputs: (b, t) labels -> (b, t) [start, y1, ..., y_{t-1}], with -100 replaced by pad."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1].clone()
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


class ScratchTransformerPreTrainedModel(PreTrainedModel):
    """Weight init (Xavier linears, N(0, d^-1/2) embeddings, paper 3.4; or N(0, init_std) for all) and HF plumbing."""

    config_class = ScratchTransformerConfig
    config: ScratchTransformerConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True  # the layers are GradientCheckpointingLayers
    # attention through transformers' interface: "eager" is ours (eq. 1), the others come from ALL_ATTENTION_FUNCTIONS
    _supports_sdpa = True
    _supports_flex_attn = True
    _supports_flash_attn = True
    _supports_attention_backend = True
    _can_compile_fullgraph = True  # no data-dependent branch while compiling; static cache supported
    _no_split_modules = ["ScratchTransformerEncoderLayer", "ScratchTransformerDecoderLayer"]

    def _init_weights(self, module):
        # config.init_std None: the paper's init; a float s: N(0, s) for every weight matrix (BART/Marian's).
        std = self.config.init_std
        if isinstance(module, nn.Linear):
            if std is None:
                init.xavier_uniform_(module.weight)
            else:
                init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5 if std is None else std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, ScratchTransformerPositionalEncoding):
            table = sinusoidal_position_encoding(module.max_positions, self.config.d_model)
            if hasattr(init, "copy_"):
                init.copy_(module.table, table)
            else:  # transformers 4.x: torch.nn.init has no copy_
                with torch.no_grad():
                    module.table.copy_(table)

    if not hasattr(PreTrainedModel, "get_encoder"):  # transformers 4.x: generate() asks the model for its encoder

        def get_encoder(self) -> nn.Module:
            return self.base_model.encoder

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        # HF guesses this from the source text; our attention reads config._attn_implementation at
        # every call, so `model.set_attn_implementation(...)` always takes effect.
        return True

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        """HF's resize grows the input embedding (the encoder's, or the shared table) and the output projection;
        with separate tables the decoder's grows here too, to the same size. resize_token_embeddings then sets
        config.vocab_size and re-ties the output projection to the decoder's table (paper 3.4)."""
        before = self.config.vocab_size
        encoder_embed = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        if encoder_embed.num_embeddings < before:
            import warnings

            warnings.warn(f"the vocabulary shrank from {before} to {encoder_embed.num_embeddings} tokens: a tokenizer "
                          f"of more tokens no longer fits this model (ids from {encoder_embed.num_embeddings} on have "
                          "no embedding)", UserWarning, stacklevel=3)
        decoder = self.base_model.decoder
        if decoder.embed.embed_tokens is not encoder_embed:  # separate vocabularies: grow the decoder's table too
            old = decoder.embed.embed_tokens
            new = self._get_resized_embeddings(old, encoder_embed.num_embeddings, mean_resizing=mean_resizing)
            new.requires_grad_(old.weight.requires_grad)
            decoder.embed.embed_tokens = new
        return encoder_embed

    def save_pretrained(self, save_directory, *args, **kwargs):
        """HF's save_pretrained; also lists every Auto class in `auto_map` and ships the translation pipeline
        (config `custom_pipelines`), so remote code serves all of them."""
        if self._auto_class is not None:
            auto_map = dict(getattr(self.config, "auto_map", None) or {})
            auto_map.setdefault("AutoModel", "modeling_scratch_transformer.ScratchTransformerModel")
            auto_map.setdefault("AutoModelForSeq2SeqLM",
                                "modeling_scratch_transformer.ScratchTransformerForConditionalGeneration")
            self.config.auto_map = auto_map
            if isinstance(self, GenerationMixin) and os.path.isfile(_PIPELINE_FILE):
                self.config.custom_pipelines = {"translation": {
                    "impl": "pipeline_scratch_transformer.TranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"],
                    "type": "text"}}
        result = super().save_pretrained(save_directory, *args, **kwargs)
        if getattr(self.config, "custom_pipelines", None) and os.path.isfile(_PIPELINE_FILE):
            shutil.copy(_PIPELINE_FILE, os.path.join(save_directory, os.path.basename(_PIPELINE_FILE)))
        _warn_if_tokenizer_larger(save_directory, self.config.vocab_size)
        return result


def _warn_if_tokenizer_larger(folder: str, vocab_size: int) -> None:
    """Warn when the tokenizer.json saved in `folder` has more tokens than the model's vocabulary (a model resized
    below its tokenizer): translating text with those tokens would index past the embedding table."""
    import json
    import warnings

    try:
        with open(os.path.join(folder, "tokenizer.json"), encoding="utf-8") as handle:
            state = json.load(handle)
        ids = list(state["model"]["vocab"].values()) + [token["id"] for token in state.get("added_tokens", [])]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return
    if ids and max(ids) >= vocab_size:
        warnings.warn(f"{folder}: its tokenizer.json has {max(ids) + 1} tokens but the model's vocabulary only "
                      f"{vocab_size}: ids from {vocab_size} on have no embedding (translate.py refuses it); resize "
                      "the model to the tokenizer or save the tokenizer it was trained with", UserWarning,
                      stacklevel=3)


class ScratchTransformerModel(ScratchTransformerPreTrainedModel):
    """The bare encoder-decoder: source ids + target prefix -> decoder hidden states (paper figure 1)."""

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__(config)
        if config.share_encoder_decoder_embeddings:
            self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
            encoder_embed, decoder_embed = self.shared, self.shared
            self._tied_weights_keys = {"encoder.embed.embed_tokens.weight": "shared.weight",
                                       "decoder.embed.embed_tokens.weight": "shared.weight"}
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

    @reads_past_key_values  # the v4 name, as in transformers' models
    def forward(
        self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None, cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None, decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None, output_attentions: bool | None = None,
        output_hidden_states: bool | None = None, return_dict: bool | None = None, **kwargs,
    ) -> Seq2SeqModelOutput | tuple:
        """
        Args:
            input_ids: source ids (b, s); not needed when `encoder_outputs` or `inputs_embeds` is given.
            attention_mask: source padding (b, s), 1 = token. Pass it whenever the batch is padded.
            decoder_input_ids: target prefix (b, t) (only new tokens when `cache` is given).
            decoder_attention_mask: target padding (b, t) or (b, p + t), optional; or a prepared 4-D mask.
            encoder_outputs: reuse an earlier encoder pass (generate runs the encoder once).
            cache: EncoderDecoderCache (dynamic or static) for incremental decoding.
            inputs_embeds / decoder_inputs_embeds: (b, s, d) / (b, t, d) in place of the ids: what
                `get_input_embeddings()(ids)` gives, before the sqrt(d) scaling and positions (applied here).
            return_dict: False (or config.return_dict False) returns the output's non-None fields as a tuple.
            **kwargs: passed down to the attention function (e.g. flash attention's arguments).
        Returns:
            Seq2SeqModelOutput: last_hidden_state (b, t, d), cache, encoder_last_hidden_state (b, s, d), ...
        Raises:
            ValueError: no decoder_input_ids (or embeds), no source, both ids and embeds, an attention_mask not of
                the source's shape (b, s), token ids out of range, or too long a sequence.
        """
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        if output_hidden_states is None:
            output_hidden_states = self.config.output_hidden_states
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        use_cache = use_cache if use_cache is not None else (self.config.use_cache and not self.training)
        if decoder_input_ids is None and decoder_inputs_embeds is None:
            raise ValueError(
                "decoder_input_ids or decoder_inputs_embeds (or labels, for the LM head model) must be given")
        if encoder_outputs is None:
            if input_ids is None and inputs_embeds is None:
                raise ValueError("one of input_ids, inputs_embeds or encoder_outputs must be given")
            encoder_outputs = self.encoder(input_ids, attention_mask, inputs_embeds=inputs_embeds,
                                           output_attentions=output_attentions,
                                           output_hidden_states=output_hidden_states, **kwargs)
        else:
            if not isinstance(encoder_outputs, BaseModelOutput):
                encoder_outputs = BaseModelOutput(*encoder_outputs)
            check_attention_mask(attention_mask, encoder_outputs.last_hidden_state.shape[:2],
                                 "encoder_outputs (batch, length)")

        decoder_outputs = self.decoder(
            decoder_input_ids, encoder_outputs.last_hidden_state, attention_mask=decoder_attention_mask,
            encoder_attention_mask=attention_mask, cache=cache, inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache, output_attentions=output_attentions, output_hidden_states=output_hidden_states,
            **kwargs,
        )
        output = Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state, **cache_field(getattr(decoder_outputs, CACHE_FIELD)),
            decoder_hidden_states=decoder_outputs.hidden_states, decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states, encoder_attentions=encoder_outputs.attentions,
        )
        return output if return_dict else output.to_tuple()


class ScratchTransformerForConditionalGeneration(ScratchTransformerPreTrainedModel, GenerationMixin):
    """Encoder-decoder plus the output projection to vocabulary logits, tied to the target embedding (paper 3.4)."""

    _tied_weights_keys = {"lm_head.weight": "model.decoder.embed.embed_tokens.weight"}
    # forward normalises the loss by Trainer's `num_items_in_batch` (labelled tokens in the whole
    # accumulated batch), so 8 pairs at once and 4 x 2 accumulated give the same loss and gradients.
    accepts_loss_kwargs = True

    def __init__(self, config: ScratchTransformerConfig):
        super().__init__(config)
        self.model = ScratchTransformerModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)  # tied: see _tied_weights_keys
        if config.share_encoder_decoder_embeddings:
            self._tied_weights_keys = {"lm_head.weight": "model.shared.weight"}
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.lm_head

    def set_output_embeddings(self, value: nn.Linear):
        self.lm_head = value

    def _tie_weights(self):
        """Called by transformers 4.x's tie_weights only (5 ties by _tied_weights_keys): 4.x has just tied the output
        projection to get_input_embeddings(), the encoder's table; the decoder's is the one to tie (paper 3.4)."""
        if self.config.tie_word_embeddings:
            self.lm_head.weight = self.model.decoder.embed.embed_tokens.weight

    @reads_past_key_values  # the v4 name, as in transformers' models
    def forward(
        self, input_ids: torch.LongTensor | None = None, attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None, decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: BaseModelOutput | tuple | None = None, cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None, decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None, use_cache: bool | None = None,
        output_attentions: bool | None = None, output_hidden_states: bool | None = None,
        return_dict: bool | None = None, logits_to_keep: int | torch.Tensor = 0,
        num_items_in_batch: int | torch.Tensor | None = None, label_smoothing: float = 0.0, **kwargs,
    ) -> Seq2SeqLMOutput | tuple:
        """
        Args:
            labels: target ids (b, t) with -100 where no loss is wanted; when decoder_input_ids (and
                decoder_inputs_embeds) are None they are shifted right behind `decoder_start_token_id` to make it
                (teacher forcing).
            logits_to_keep: 0 = logits at every target position; an int n > 0 = the last n positions only
                (generate() asks for 1); a 1-D tensor = those positions. Not with labels (the loss needs all).
            num_items_in_batch: labelled tokens in the whole (accumulated, all-process) batch, passed by
                Trainer; the loss is then sum / num_items_in_batch instead of the mean over this batch.
            label_smoothing: eps of paper 5.4 for the loss (0: plain cross-entropy); the main job's Trainer
                passes its label_smoothing_factor here rather than smoothing the logits itself.
            (other arguments as in ScratchTransformerModel.forward)
        Returns:
            Seq2SeqLMOutput: logits (b, t, v) (t: the kept positions), loss (cross-entropy over labels != -100,
            in nats per labelled token) when labels are given, cache, encoder_last_hidden_state, attentions when
            asked; a tuple of its non-None fields with return_dict=False (or config.return_dict False).
        Raises:
            ValueError: labels not 2-D integer ids (b, t) matching the logits, ids outside [0, v) other than -100
                (checked before they are shifted into decoder inputs), label_smoothing outside [0, 1), labels with
                logits_to_keep (and the ScratchTransformerModel.forward errors).
        """
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if labels is not None:  # checked before they are shifted into decoder inputs
            if labels.dim() != 2:
                raise ValueError(f"labels must be (batch, target length), got shape {tuple(labels.shape)}")
            if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
                raise ValueError(f"labels need the logits at every position: pass logits_to_keep=0, "
                                 f"not {logits_to_keep!r}")
            labels = check_labels(labels, self.config.vocab_size)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids, attention_mask=attention_mask, decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask, encoder_outputs=encoder_outputs, cache=cache,
            inputs_embeds=inputs_embeds, decoder_inputs_embeds=decoder_inputs_embeds, use_cache=use_cache,
            output_attentions=output_attentions, output_hidden_states=output_hidden_states, return_dict=True,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep:
            hidden_states = hidden_states[:, -logits_to_keep:]  # (b, t, d) -> (b, n, d)
        elif isinstance(logits_to_keep, torch.Tensor):
            hidden_states = hidden_states[:, logits_to_keep]  # (b, t, d) -> (b, n, d)
        logits = linear(self.lm_head, hidden_states)  # (b, t, d) -> (b, t, v); softmax is generate()'s
        loss = cross_entropy_loss(logits, labels, num_items_in_batch, label_smoothing) if labels is not None else None
        output = Seq2SeqLMOutput(
            loss=loss, logits=logits, **cache_field(getattr(outputs, CACHE_FIELD)),
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions, cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states, encoder_attentions=outputs.encoder_attentions,
        )
        return output if return_dict else output.to_tuple()

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
