"""scratch_transformer: the Transformer of "Attention Is All You Need", by hand, as a Hugging Face model.

Importing the package registers the model with AutoConfig, AutoModel and AutoModelForSeq2SeqLM,
and marks the classes so that `save_pretrained` copies the code beside the weights (auto_map),
which lets `from_pretrained(..., trust_remote_code=True)` load a checkpoint without this package.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_scratch_transformer import ScratchTransformerConfig
from .modeling_scratch_transformer import (
    ScratchTransformerForConditionalGeneration,
    ScratchTransformerModel,
    ScratchTransformerPreTrainedModel,
)
from .pipeline_scratch_transformer import TranslationPipeline

AutoConfig.register(ScratchTransformerConfig.model_type, ScratchTransformerConfig, exist_ok=True)
AutoModel.register(ScratchTransformerConfig, ScratchTransformerModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(ScratchTransformerConfig, ScratchTransformerForConditionalGeneration, exist_ok=True)

ScratchTransformerConfig.register_for_auto_class()
ScratchTransformerModel.register_for_auto_class("AutoModel")
ScratchTransformerForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

PIPELINE_REGISTRY.register_pipeline(
    "scratch-translation", pipeline_class=TranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)

__version__ = "0.1.0"

__all__ = [
    "ScratchTransformerConfig",
    "ScratchTransformerPreTrainedModel",
    "ScratchTransformerModel",
    "ScratchTransformerForConditionalGeneration",
    "TranslationPipeline",
]
