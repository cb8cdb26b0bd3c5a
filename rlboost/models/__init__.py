"""Decoder architectures (Llama / Qwen2 / Qwen3) with HF parameter names and checkpoint IO,
shared by the trainer and the embedded rollout engine."""

from rlboost.models.byte_tokenizer import ByteTokenizer
from rlboost.models.checkpoint import (
                                       build_tiny_checkpoint,
                                       checkpoint_files,
                                       empty_model,
                                       load_pretrained,
                                       save_pretrained,
                                       tiny_config,
)
from rlboost.models.config import ModelConfig
from rlboost.models.decoder import DecoderLM

__all__ = ["ByteTokenizer", "DecoderLM", "ModelConfig", "build_tiny_checkpoint", "checkpoint_files",
           "empty_model", "load_pretrained", "save_pretrained", "tiny_config"]
