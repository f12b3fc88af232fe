"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

The defaults are the paper's base model (Table 3, row "base"): d_model 512, 8 heads,
6 encoder + 6 decoder layers, d_ff 2048, dropout 0.1, sinusoidal positions, post-LN,
ReLU, embeddings scaled by sqrt(d_model), target embedding tied to the output projection.
"""

try:
    from transformers import PreTrainedConfig
except ImportError:  # transformers 4.x spells it PretrainedConfig
    from transformers import PretrainedConfig as PreTrainedConfig

# transformers 5 makes every config class a dataclass: the annotated fields below are set before `__post_init__`.
# transformers 4.x has no `__post_init__`: a config sets its fields in `__init__` (defined below for it alone).
_FIELDS_ARE_DATACLASS_FIELDS = hasattr(PreTrainedConfig, "__post_init__")

_ACTIVATIONS = ("relu", "gelu")


class ScratchTransformerConfig(PreTrainedConfig):
    r"""Hyperparameters of a [`ScratchTransformerModel`]; the single source of truth for sizes.

    Args:
        vocab_size (`int`): tokens in the vocabulary (one joint vocabulary for source and target).
        d_model (`int`): width of every sub-layer output and embedding (paper 3.1). HF name: `hidden_size`.
        num_heads (`int`): attention heads h; d_model must divide by it (paper 3.2.2). HF name: `num_attention_heads`.
        encoder_layers / decoder_layers (`int`): N, the depth of each stack (paper 3.1).
            HF name of `decoder_layers`: `num_hidden_layers` (the KV cache is sized from it).
        d_ff (`int`): inner width of the position-wise feed-forward network (paper 3.3). HF name: `intermediate_size`.
        dropout (`float`): residual and embedding dropout P_drop (paper 5.4), in [0, 1).
        attention_dropout (`float`): dropout on attention weights, in [0, 1) (not in the paper; 0 by default).
        activation_function (`str`): "relu" (paper 3.3) or "gelu".
        pre_layer_norm (`bool`): False = the paper's post-LN, LayerNorm(x + Sublayer(x)) (paper 3.1);
            True = pre-LN, x + Sublayer(LayerNorm(x)), with a final LayerNorm on each stack.
        max_position_embeddings (`int`): longest sequence the sinusoidal table covers (paper 3.5).
        scale_embedding (`bool`): multiply embeddings by sqrt(d_model) (paper 3.4).
        share_encoder_decoder_embeddings (`bool`): one embedding matrix for source and target
            (joint vocabulary, paper 3.4); the target embedding is always tied to the output
            projection when `tie_word_embeddings` is True.
        layer_norm_eps (`float`): LayerNorm epsilon.
        init_std (`float` or None): None = the paper's initialisation, Xavier-uniform linear layers (the
            reference implementation's choice) and N(0, d_model^-1/2) embeddings, whose scaled rows then have
            the positional encoding's unit amplitude (paper 3.4); a float s = N(0, s) for every linear and
            embedding weight, as BART and Marian initialise (their `init_std`, 0.02).
        pad_token_id / bos_token_id / eos_token_id / decoder_start_token_id (`int`): special ids.

    The HF names of `attribute_map` (hidden_size, num_attention_heads, num_hidden_layers, intermediate_size,
    encoder_attention_heads, ...) are accepted as arguments and checked like the paper names they stand for.

    Raises:
        ValueError: naming the field, for non-positive sizes, d_model not divisible by num_heads,
            an unknown activation, a dropout outside [0, 1), or a field given twice with different values
            (e.g. d_model=256 and hidden_size=512).
    """

    model_type = "scratch_transformer"
    keys_to_ignore_at_inference = ["cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "num_heads",
        "encoder_attention_heads": "num_heads",
        "decoder_attention_heads": "num_heads",
        "num_hidden_layers": "decoder_layers",
        "intermediate_size": "d_ff",
        "encoder_ffn_dim": "d_ff",
        "decoder_ffn_dim": "d_ff",
    }

    vocab_size: int = 10000
    d_model: int = 512
    num_heads: int = 8
    encoder_layers: int = 6
    decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_function: str = "relu"
    pre_layer_norm: bool = False
    max_position_embeddings: int = 1024
    scale_embedding: bool = True
    share_encoder_decoder_embeddings: bool = False
    layer_norm_eps: float = 1e-5
    init_std: float | None = None
    use_cache: bool = True
    is_encoder_decoder: bool = True
    tie_word_embeddings: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | None = 2
    decoder_start_token_id: int | None = 1

    def _check_fields(self, kwargs: dict) -> dict:
        """Check the fields (set on self) and the HF aliases among kwargs; returns the other kwargs, for the parent.
        Raises ValueError as the class docstring says."""
        # HF's generic names (hidden_size=..., from Python or a config.json) reach here as extra kwargs, which
        # the parent would set only after the checks below: set them on their fields first so they are checked.
        given = {}
        for alias in [key for key in kwargs if key in self.attribute_map]:
            field, value = self.attribute_map[alias], kwargs.pop(alias)
            if field in given and given[field][1] != value:
                raise ValueError(f"{given[field][0]}={given[field][1]!r} and {alias}={value!r} set the same field "
                                 f"{field}; give one of them")
            own = getattr(self, field)
            if own != getattr(type(self), field) and own != value:
                raise ValueError(f"{field}={own!r} and its HF name {alias}={value!r} disagree; give one of them")
            given[field] = (alias, value)
            setattr(self, field, value)

        def label(name):  # the name the caller used
            return f"{name} (given as {given[name][0]})" if name in given else name

        for name in ("vocab_size", "d_model", "num_heads", "encoder_layers", "decoder_layers", "d_ff",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{label(name)} must be a positive integer, got {value!r}")
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"{label('d_model')}={self.d_model} must be divisible by {label('num_heads')}={self.num_heads} "
                "(paper 3.2.2)"
            )
        if self.activation_function not in _ACTIVATIONS:
            raise ValueError(f"activation_function must be one of {_ACTIVATIONS}, got {self.activation_function!r}")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
                raise ValueError(f"{name} must be in [0, 1), got {value!r}")
        if self.init_std is not None and (isinstance(self.init_std, bool) or not isinstance(self.init_std, (int, float))
                                          or not self.init_std > 0):
            raise ValueError(f"init_std must be a positive number or None (the paper's init), got {self.init_std!r}")
        if not self.layer_norm_eps > 0:
            raise ValueError(f"layer_norm_eps must be positive, got {self.layer_norm_eps!r}")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"{name} must be in [0, vocab_size={self.vocab_size}), got {value!r}")
        return kwargs

    if _FIELDS_ARE_DATACLASS_FIELDS:

        def __post_init__(self, **kwargs):
            super().__post_init__(**self._check_fields(kwargs))

    else:

        def __init__(self, **kwargs):
            """transformers 4.x: each field from kwargs or its default above, checked, then the parent's __init__
            with the rest (pad_token_id, tie_word_embeddings, ... are set there, as 4.x expects)."""
            fields = ScratchTransformerConfig.__annotations__
            for name in fields:
                setattr(self, name, kwargs.pop(name, getattr(type(self), name)))
            kwargs = self._check_fields(kwargs)
            super().__init__(**{name: getattr(self, name) for name in fields}, **kwargs)


__all__ = ["ScratchTransformerConfig"]
