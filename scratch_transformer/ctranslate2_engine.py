"""CTranslate2 for trained models: conversion with its converter API, and a generate()-compatible runtime.

CTranslate2 (https://github.com/OpenNMT/CTranslate2) is an inference engine for Transformer models with
int8 kernels; this module hands it our models without a hand-written file format:

- `ScratchTransformerConverter`: a `ctranslate2.converters.Converter` that fills ctranslate2's own
  `TransformerSpec` (the encoder-decoder of the paper, post- or pre-LN) from our weights, so the engine's
  `Converter.convert` validates, quantizes (int8, int8_float32, float16, ...) and saves it.
- `export_ctranslate2`: converts a trained model folder or Hub id and copies the tokenizer and the
  generation config (beams, length penalty, no-repeat n-gram size, max length) beside it
  (`scripts/export_ctranslate2.py` is its command line).
- `CTranslate2Model`: loads a converted folder and answers `generate(input_ids, attention_mask, ...)` with
  token ids as our model does, so `inference.translate` (and `scripts/translate.py --engine ctranslate2`)
  run either engine the same way.

ctranslate2 is an optional dependency: `pip install "scratch_transformer[ctranslate2]"`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile

import torch

logger = logging.getLogger(__name__)

# generate() options: the ctranslate2 translate_batch option each maps to, with the value that means "off"
GENERATION_OPTIONS = {
    "num_beams": "beam_size",
    "length_penalty": "length_penalty",
    "no_repeat_ngram_size": "no_repeat_ngram_size",
    "repetition_penalty": "repetition_penalty",
    "top_k": "sampling_topk",
    "top_p": "sampling_topp",
    "temperature": "sampling_temperature",
}
# generation-config fields CTranslate2 has no equivalent of, with the value at which they do nothing
UNSUPPORTED_GENERATION = {
    "num_beam_groups": 1, "diversity_penalty": 0.0, "encoder_no_repeat_ngram_size": 0,
    "encoder_repetition_penalty": 1.0, "bad_words_ids": None, "force_words_ids": None,
    "forced_bos_token_id": None, "forced_eos_token_id": None, "suppress_tokens": None,
    "begin_suppress_tokens": None, "exponential_decay_length_penalty": None, "typical_p": 1.0,
    "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "min_p": None, "sequence_bias": None, "penalty_alpha": None,
    "num_return_sequences": 1,
}
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
ENGINE_FILE = "scratch_transformer_ctranslate2.json"  # what the export recorded: source, quantization, ids
# generate()'s default beam search (early_stopping False) goes on while a running beam could still win.
# CTranslate2 has no such rule: it stops once beam_size x patience hypotheses are finished (patience 1 is
# early_stopping=True). Patience 2 comes closest on the main job's model (test_2016_flickr, beam 4, 2026-12-02,
# docs/results.md): 97.4% of translations identical to generate()'s default and BLEU 40.56 against 40.52, where
# patience 1 gave 92.7% and 40.16.
DEFAULT_SEARCH_PATIENCE = 2.0


def _require_ctranslate2():
    try:
        import ctranslate2
    except ImportError:
        raise ImportError("CTranslate2 is not installed: pip install ctranslate2 "
                          '(or pip install "scratch_transformer[ctranslate2]")') from None
    return ctranslate2


def unsupported_generation_options(generation_config) -> dict:
    """Options of a generation config that CTranslate2 cannot apply: {name: value}, empty when it can."""
    found = {}
    for name, neutral in UNSUPPORTED_GENERATION.items():
        value = getattr(generation_config, name, neutral)
        if value is not None and value != neutral and value not in ([], {}):
            found[name] = value
    return found


def decoding_differences(generation_config) -> list[str]:
    """Where CTranslate2's search differs from generate() under this generation config (empty: none).

    With early_stopping=True, CTranslate2's beam search ends as generate()'s does, when num_beams hypotheses
    are finished; generate()'s default, False, goes on while a running beam could still win, which
    CTranslate2 approximates by waiting for DEFAULT_SEARCH_PATIENCE x num_beams finished hypotheses. It also
    renormalises the scores after blocking tokens (generate()'s renormalize_logits=True). With both set,
    the main job's model gave the same translation for 1013 of the 1014 validation sentences.
    """
    differences = []
    if (generation_config.num_beams or 1) > 1 and generation_config.early_stopping is not True:
        value = generation_config.early_stopping or False  # None: generate()'s default, False
        differences.append(f"early_stopping={value!r} (CTranslate2 approximates it with patience "
                           f"{DEFAULT_SEARCH_PATIENCE:g})")
    blocks = (generation_config.no_repeat_ngram_size or 0) > 0 or (generation_config.repetition_penalty or 1.0) != 1.0
    if blocks and not generation_config.renormalize_logits:
        differences.append("renormalize_logits=False with token blocking (CTranslate2 renormalises as True)")
    return differences


class ScratchTransformerConverter:
    """Fills ctranslate2's `TransformerSpec` from a `ScratchTransformerForConditionalGeneration`.

    The mapping (names of modeling_scratch_transformer.py -> ctranslate2's TransformerSpec):
    token embeddings (times sqrt(d_model) when `scale_embedding`, paper 3.4) and our sinusoid table as the
    position encodings (paper 3.5: CTranslate2's built-in table orders sin/cos differently, so the table is
    stored); per layer the q/k/v projections fused (self-attention: one (3d, d) matrix; encoder-decoder
    attention: q alone, k and v fused) and out_proj; the layer norms after (post-LN, the paper's) or before
    each sub-layer plus the stacks' final norms (pre-LN); fc1/fc2 with ReLU or GELU (paper 3.3); the output
    projection (tied to the target embedding, paper 3.4). Source and target share one vocabulary (the
    tokenizer's), padded with placeholder tokens if the model has more rows than the tokenizer has tokens.

    Args:
        model: a ScratchTransformerForConditionalGeneration (fp32 weights are read; any dtype is cast).
        tokenizer: its tokenizer (gives the vocabulary and the special tokens).
    Raises:
        ValueError: a model of another type, or a model whose vocabulary is smaller than the tokenizer's.
    """

    def __init__(self, model, tokenizer):
        if getattr(model.config, "model_type", None) != "scratch_transformer":
            raise ValueError(
                f"not a scratch_transformer model (model_type {getattr(model.config, 'model_type', None)!r}): "
                "for other Hugging Face models use ctranslate2's own ct2-transformers-converter")
        if model.config.vocab_size < len(tokenizer):
            raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocab_size is "
                             f"{model.config.vocab_size}")
        self.model, self.tokenizer = model, tokenizer

    def vocabulary(self) -> list[str]:
        """The tokens by id, padded to the model's vocab_size with unique placeholders."""
        by_id = sorted(self.tokenizer.get_vocab().items(), key=lambda item: item[1])
        tokens = [token for token, _ in by_id]
        if [index for _, index in by_id] != list(range(len(tokens))):
            raise ValueError("the tokenizer's ids are not 0..n-1 without gaps: CTranslate2 needs one token per id")
        tokens += [f"<ct2_unused_{i}>" for i in range(len(tokens), self.model.config.vocab_size)]
        return tokens

    def spec(self):
        """The filled `ctranslate2.specs.TransformerSpec` (not yet validated or quantized)."""
        _require_ctranslate2()
        from ctranslate2.specs import common_spec, transformer_spec

        config = self.model.config
        activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
        spec = transformer_spec.TransformerSpec.from_config(
            (config.encoder_layers, config.decoder_layers), config.num_heads,
            pre_norm=config.pre_layer_norm, activation=activation[config.activation_function])
        with torch.no_grad():
            base = self.model.get_encoder(), self.model.get_decoder()
            self._set_stack(spec.encoder, base[0], cross_attention=False)
            self._set_stack(spec.decoder, base[1], cross_attention=True)
            spec.decoder.projection.weight = self._tensor(self.model.get_output_embeddings().weight)
            bias = getattr(self.model.get_output_embeddings(), "bias", None)
            if bias is not None:
                spec.decoder.projection.bias = self._tensor(bias)
        tokens = self.vocabulary()
        spec.register_source_vocabulary(tokens)
        spec.register_target_vocabulary(tokens)
        special = self.tokenizer
        spec.config.unk_token = special.unk_token
        spec.config.bos_token = special.bos_token
        spec.config.eos_token = special.eos_token
        spec.config.decoder_start_token = tokens[config.decoder_start_token_id]
        spec.config.layer_norm_epsilon = config.layer_norm_eps
        return spec

    @staticmethod
    def _tensor(parameter: torch.Tensor):
        # a copy: ctranslate2 quantizes (and scales) the arrays it is given in place, and a float32 parameter's
        # .numpy() is the parameter's own memory (an int8 conversion once rewrote 10 of the model's weights)
        return parameter.detach().to(torch.float32, copy=True).contiguous().numpy()

    def _set_stack(self, spec, stack, cross_attention: bool):
        config = self.model.config
        spec.scale_embeddings = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
        embeddings.weight = self._tensor(stack.embed.embed_tokens.weight)
        spec.position_encodings.encodings = self._tensor(stack.embed.embed_positions.table)
        if getattr(stack, "layer_norm", None) is not None:  # pre-LN: the stack's final norm
            self._set_norm(spec.layer_norm, stack.layer_norm)
        for layer_spec, layer in zip(spec.layer, stack.layers):
            self._set_attention(layer_spec.self_attention, layer.self_attn, fuse_kv_with_q=True)
            self._set_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
            if cross_attention:
                self._set_attention(layer_spec.attention, layer.encoder_attn, fuse_kv_with_q=False)
                self._set_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
            self._set_linear(layer_spec.ffn.linear_0, layer.ffn.fc1)
            self._set_linear(layer_spec.ffn.linear_1, layer.ffn.fc2)
            self._set_norm(layer_spec.ffn.layer_norm, layer.final_layer_norm)

    def _set_attention(self, spec, attention, fuse_kv_with_q: bool):
        q, k, v = attention.q_proj, attention.k_proj, attention.v_proj
        groups = [[q, k, v]] if fuse_kv_with_q else [[q], [k, v]]  # ctranslate2: self (3d, d); cross q, (2d, d)
        for linear_spec, group in zip(spec.linear, groups):
            linear_spec.weight = self._tensor(torch.cat([layer.weight for layer in group]))
            linear_spec.bias = self._tensor(torch.cat([layer.bias for layer in group]))
        self._set_linear(spec.linear[-1], attention.out_proj)

    def _set_linear(self, spec, linear):
        spec.weight = self._tensor(linear.weight)
        if linear.bias is not None:
            spec.bias = self._tensor(linear.bias)

    def _set_norm(self, spec, norm):
        spec.gamma = self._tensor(norm.weight)
        spec.beta = self._tensor(norm.bias)

    def converter(self):
        """A `ctranslate2.converters.Converter` whose `convert(output_dir, quantization=...)` saves this model."""
        ctranslate2 = _require_ctranslate2()
        owner = self

        class _Converter(ctranslate2.converters.Converter):
            def _load(self):
                return owner.spec()

        return _Converter()


# what an export writes besides ENGINE_FILE (an export from before ENGINE_FILE listed its files holds only these)
EXPORT_FILES = ("model.bin", "config.json", "shared_vocabulary.json", "source_vocabulary.json",
                "target_vocabulary.json", "vocabulary.json", "vocabulary.txt", "generation_config.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                "chat_template.jinja")


def check_export_target(model_name_or_path: str, output_dir: str, force: bool = False) -> None:
    """Refuse, before anything is loaded, an output folder the export must not replace.

    Never replaced: the model folder being exported, or a folder holding it; a file; and, with `force`, an
    existing folder that is not an earlier export of this module (no ENGINE_FILE), or one holding files an
    export does not write (a user's notes). An empty folder is taken.

    Raises:
        ValueError: naming output_dir and what is there.
        FileExistsError: output_dir exists (an earlier export) and force is False.
    """
    target = os.path.realpath(os.path.expanduser(output_dir))
    source = os.path.expanduser(model_name_or_path)
    if os.path.isdir(source):
        source = os.path.realpath(source)
        if target == source or source.startswith(target.rstrip(os.sep) + os.sep):
            raise ValueError(f"output_dir {output_dir} {'is' if target == source else 'holds'} the model being "
                             f"exported ({model_name_or_path}): the export would replace it; choose another folder")
    from .paths import unwritable_reason

    if os.path.exists(target) and not os.path.isdir(target):
        raise ValueError(f"output_dir {output_dir} is a file, not a folder: choose another --output_dir")
    reason = unwritable_reason(os.path.dirname(target))  # the export is staged beside output_dir, then moved
    if reason:
        raise ValueError(f"output_dir {output_dir}: {reason}")
    if not os.path.exists(target):
        return
    if not os.path.isdir(target):
        raise ValueError(f"output_dir {output_dir} is a file, not a folder: choose another --output_dir")
    names = sorted(os.listdir(target))
    if not names:
        return
    if not force:
        raise FileExistsError(f"output_dir {output_dir} already exists (pass force=True / --force to replace it)")
    shown = ", ".join(names[:6]) + (f" and {len(names) - 6} more" if len(names) > 6 else "")
    if ENGINE_FILE not in names:
        raise ValueError(f"output_dir {output_dir} is not an earlier CTranslate2 export (no {ENGINE_FILE}; it holds "
                         f"{shown}): --force replaces only a folder this export wrote; choose another --output_dir")
    try:
        with open(os.path.join(target, ENGINE_FILE), encoding="utf-8") as handle:
            listed = json.load(handle).get("files")
    except (OSError, ValueError, AttributeError):
        listed = None
    known = set(listed) if isinstance(listed, list) else set(EXPORT_FILES)
    others = [name for name in names if name not in known and name != ENGINE_FILE]
    if others:
        raise ValueError(f"output_dir {output_dir} is an earlier export but also holds {', '.join(others[:6])}, "
                         "which the export did not write: --force would delete them; move them or choose another "
                         "--output_dir")


def generation_agreement(model, engine, tokenizer, sentences, batch_size: int = 32) -> dict:
    """How many of `sentences` the converted engine translates differently from the model's generate(), both
    with the saved generation config: {"sentences": n, "differ": k, "examples": [first differing source, ...]}."""
    from .inference import translate

    ours = translate(model, tokenizer, sentences, batch_size=batch_size)
    theirs = translate(engine, tokenizer, sentences, batch_size=batch_size)
    differing = [source for source, a, b in zip(sentences, ours, theirs) if a != b]
    return {"sentences": len(sentences), "differ": len(differing), "examples": differing[:3]}


def export_ctranslate2(model_name_or_path: str, output_dir: str, quantization: str | None = None,
                       force: bool = False, revision: str | None = None, trust_remote_code: bool = False,
                       check_sentences=None) -> str:
    """Convert a trained model to a CTranslate2 folder, with its tokenizer and generation defaults beside it.

    The folder holds CTranslate2's model.bin, config.json and shared_vocabulary.json, the tokenizer files,
    `generation_config.json` (the model's: beams, length penalty, no-repeat n-gram size, max length) and
    `scratch_transformer_ctranslate2.json` (source, quantization, special ids).

    Args:
        model_name_or_path: a trained model's folder or Hub id.
        output_dir: the folder to write (refused if it exists, unless `force`).
        quantization: the weights' type in the folder: one of QUANTIZATIONS (int8 for fast CPU inference;
            None keeps float32). The compute type can still be chosen when loading (`CTranslate2Model`).
        force: replace output_dir if it is an earlier export (`check_export_target`).
        check_sentences: source sentences to translate with generate() and with the conversion: how many
            differ is logged and recorded in ENGINE_FILE ("agreement"). None: not measured (a warning for a
            quantized export says how to measure it).
    Returns:
        output_dir.
    Raises:
        ValueError: an unknown quantization, a generation config with options CTranslate2 cannot apply
            (named), a model that is not a scratch_transformer or whose weights cannot be read, or an
            output_dir that must not be replaced (`check_export_target`).
        FileExistsError: output_dir exists and force is False.
        ImportError: ctranslate2 is not installed.
    """
    _require_ctranslate2()
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}")
    check_export_target(model_name_or_path, output_dir, force)
    from safetensors import SafetensorError
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig

    from . import modeling_scratch_transformer  # noqa: F401  (registers the model with the Auto classes)

    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, revision=revision)
    try:
        model = AutoModelForSeq2SeqLM.from_pretrained(model_name_or_path, revision=revision,
                                                      trust_remote_code=trust_remote_code)
    except SafetensorError as error:  # weights cut short or corrupt
        raise ValueError(f"{model_name_or_path}: its model.safetensors cannot be read ({error})") from None
    converter = ScratchTransformerConverter(model.eval(), tokenizer)  # refuses other models first
    try:
        generation = GenerationConfig.from_pretrained(model_name_or_path, revision=revision)
    except OSError:
        generation = model.generation_config
    unsupported = unsupported_generation_options(generation)
    if unsupported:
        names = ", ".join(f"{name}={value!r}" for name, value in unsupported.items())
        raise ValueError(f"{model_name_or_path}'s generation config sets options CTranslate2 cannot apply: {names} "
                         "(save the model with a generation config without them, then convert)")
    differences = decoding_differences(generation)
    if differences:
        logger.warning("%s: CTranslate2 decodes exactly as generate(early_stopping=True, renormalize_logits=True); "
                       "this model's generation config has %s: some translations may differ", model_name_or_path,
                       "; ".join(differences))
    with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(output_dir)) or None) as scratch:
        staged = os.path.join(scratch, "model")
        converter.converter().convert(staged, quantization=quantization)
        tokenizer.save_pretrained(staged)
        generation.save_pretrained(staged)
        config = model.config
        record = {
            "source": model_name_or_path, "revision": revision, "quantization": quantization or "float32",
            "pad_token_id": config.pad_token_id, "eos_token_id": config.eos_token_id,
            "decoder_start_token_id": config.decoder_start_token_id, "vocab_size": config.vocab_size,
            "max_position_embeddings": config.max_position_embeddings,
            "decoding_differences": differences, "files": sorted(os.listdir(staged)),
        }
        with open(os.path.join(staged, ENGINE_FILE), "w", encoding="utf-8") as handle:
            json.dump(record, handle, indent=2)
            handle.write("\n")
        weights = quantization or "float32"
        if check_sentences:
            engine = CTranslate2Model.from_pretrained(staged)
            record["agreement"] = generation_agreement(model, engine, tokenizer, list(check_sentences))
            del engine
            agreement = record["agreement"]
            logger.log(logging.WARNING if agreement["differ"] else logging.INFO,
                       "%s export: %d of %d sentences translate differently from generate() (beam %s)%s", weights,
                       agreement["differ"], agreement["sentences"], generation.num_beams or 1,
                       f", e.g. {agreement['examples'][0]!r}" if agreement["examples"] else "")
            with open(os.path.join(staged, ENGINE_FILE), "w", encoding="utf-8") as handle:
                json.dump(record, handle, indent=2)
                handle.write("\n")
        else:
            logger.log(logging.WARNING if quantization not in (None, "float32") else logging.INFO,
                       "%s export: agreement with generate() not measured (pass source sentences, one per line, "
                       "with --check_file to count how many translate differently)", weights)
        check_export_target(model_name_or_path, output_dir, force)  # nothing appeared there meanwhile
        if os.path.exists(output_dir):
            shutil.rmtree(output_dir)
        shutil.move(staged, output_dir)  # whole or not at all: an interrupted export leaves no half folder
    return output_dir


def _cores() -> int:
    """CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


class _Config:
    def __init__(self, record: dict):
        self.__dict__.update(record)


class CTranslate2Model:
    """A converted folder behind generate(): token ids in, token ids out, like our model's generate().

    `inference.translate(CTranslate2Model.from_pretrained(folder), tokenizer, sentences)` therefore
    translates with CTranslate2 exactly as it does with the PyTorch model (batching, truncation, order).

    Args (from_pretrained):
        folder: a folder written by `export_ctranslate2`.
        device: "cpu" or "cuda".
        compute_type: CTranslate2's compute type ("default" = the type the weights were saved in, or e.g.
            "int8", "int8_float32", "float32").
        inter_threads: workers translating parts of a batch in parallel; intra_threads: threads per worker
            (0 = all cores). Default on CPU: one worker of one thread per core, each batch split evenly among
            them (test_2016_flickr, beam 4, int8, 2 AMD EPYC cores, 2026-12-02: 299.5 sentences/s against
            125.5 for one worker of 2 threads; docs/results.md); elsewhere one worker.
    Raises:
        ValueError: a folder that export_ctranslate2 did not write; inter_threads < 1 or intra_threads < 0.
    """

    def __init__(self, translator, record: dict, generation_config, vocabulary: list[str], inter_threads: int = 1):
        self.translator = translator
        self.inter_threads = inter_threads
        self.config = _Config(record)
        self.generation_config = generation_config
        self.vocabulary = vocabulary
        self.token_ids = {token: index for index, token in enumerate(vocabulary)}
        self.device = torch.device("cpu")

    @classmethod
    def from_pretrained(cls, folder: str, device: str = "cpu", compute_type: str = "default",
                        inter_threads: int | None = None, intra_threads: int | None = None) -> CTranslate2Model:
        ctranslate2 = _require_ctranslate2()
        from transformers import GenerationConfig

        record_path = os.path.join(folder, ENGINE_FILE)
        if not os.path.isfile(record_path):
            raise ValueError(f"{folder}: not a converted model (no {ENGINE_FILE}); convert one with "
                             "scripts/export_ctranslate2.py --model <trained model> --output_dir <folder>")
        with open(record_path, encoding="utf-8") as handle:
            record = json.load(handle)
        with open(os.path.join(folder, "shared_vocabulary.json"), encoding="utf-8") as handle:
            vocabulary = json.load(handle)
        if inter_threads is None:
            inter_threads = _cores() if device == "cpu" else 1
        if intra_threads is None:
            intra_threads = 1 if device == "cpu" else 0
        if inter_threads < 1 or intra_threads < 0:
            raise ValueError(f"inter_threads must be >= 1 and intra_threads >= 0, got {inter_threads} and "
                             f"{intra_threads}")
        # The Translator sets the OpenMP thread count of the calling thread to intra_threads, which is torch's too:
        # torch would run on one thread after it. Its workers keep their own count; the caller gets torch's back.
        torch_threads = torch.get_num_threads()
        try:
            translator = ctranslate2.Translator(folder, device=device, compute_type=compute_type,
                                                inter_threads=inter_threads, intra_threads=intra_threads)
        finally:
            torch.set_num_threads(torch_threads)
        return cls(translator, record, GenerationConfig.from_pretrained(folder), vocabulary, inter_threads)

    def eval(self) -> CTranslate2Model:
        return self

    def translate_options(self, **generate_kwargs) -> dict:
        """generate() keyword arguments over the saved generation config -> translate_batch options.

        Raises:
            ValueError: naming any option CTranslate2 cannot apply (e.g. num_beam_groups, bad_words_ids).
        """
        generation = self.generation_config.to_dict()
        generation.update(generate_kwargs)
        generation.pop("transformers_version", None)
        # renormalize_logits: CTranslate2 renormalises as True; early_stopping sets the patience (decoding_differences)
        known = set(GENERATION_OPTIONS) | {"max_new_tokens", "max_length", "do_sample", "early_stopping",
                                           "renormalize_logits"}
        unsupported = [name for name in generate_kwargs if name not in known]
        unsupported += [name for name in UNSUPPORTED_GENERATION
                        if name in generate_kwargs and generate_kwargs[name] != UNSUPPORTED_GENERATION[name]]
        if unsupported:
            raise ValueError(f"CTranslate2 cannot apply generate option(s) {', '.join(sorted(set(unsupported)))}")
        def get(name, default):  # transformers 5 leaves unset fields None
            value = generation.get(name)
            return default if value is None else value

        beams = int(get("num_beams", 1))
        options = {"beam_size": beams,
                   "patience": 1.0 if beams == 1 or get("early_stopping", False) is True else DEFAULT_SEARCH_PATIENCE,
                   "length_penalty": float(get("length_penalty", 1.0)),
                   "no_repeat_ngram_size": int(get("no_repeat_ngram_size", 0)),
                   "repetition_penalty": float(get("repetition_penalty", 1.0)),
                   "max_input_length": 0,  # inference.translate truncates sources itself
                   "return_end_token": True}  # as generate(): </s> ends a finished translation
        # HF's max_length counts the decoder start token; CTranslate2's max_decoding_length does not
        if generation.get("max_new_tokens") is not None:
            options["max_decoding_length"] = int(generation["max_new_tokens"])
        else:
            options["max_decoding_length"] = int(get("max_length", 20)) - 1
        if get("do_sample", False):
            options.update(sampling_topk=int(get("top_k", 0)) or len(self.vocabulary),
                           sampling_topp=float(get("top_p", 1.0)),
                           sampling_temperature=float(get("temperature", 1.0)))
        return options

    def worker_batch_size(self, sentences: int) -> int:
        """Sentences per worker: a batch split evenly among the inter_threads workers (0: the whole batch)."""
        return 0 if self.inter_threads <= 1 else -(-sentences // self.inter_threads)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                 **generate_kwargs) -> torch.Tensor:
        """input_ids (b, n) right-padded, attention_mask (b, n) -> (b, 1 + m) ids: the decoder start token,
        the translation and (if it finished within the length limit) its end-of-sentence token, padded with
        pad_token_id, as our generate() returns them.

        Raises:
            ValueError: a generate() option CTranslate2 cannot apply (see translate_options).
        """
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        sources = [[self.vocabulary[i] for i in ids[mask.bool()].tolist()]
                   for ids, mask in zip(input_ids, attention_mask)]
        options = self.translate_options(**generate_kwargs)
        options["max_batch_size"] = self.worker_batch_size(len(sources))
        results = self.translator.translate_batch(sources, **options)
        config = self.config
        outputs = [[config.decoder_start_token_id] + [self.token_ids[t] for t in result.hypotheses[0]]
                   for result in results]
        width = max(len(ids) for ids in outputs)
        return torch.tensor([ids + [config.pad_token_id] * (width - len(ids)) for ids in outputs], dtype=torch.long)
