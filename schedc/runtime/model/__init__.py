"""The runtime's model: the GPT pieces and their partition (gpt; its public names are re-exported
here, so schedc.runtime.model.ModelConfig keeps working), tensor parallelism, the data, K-FAC,
the distributed optimizer, the pipelined and the reference runs."""
from __future__ import annotations

from .gpt import (
    Block, Embed, FACTS, Head, ModelConfig, ModelError, ParallelBlock, ParallelEmbed, ParallelHead, Stage,
    attention_core, boundary_shapes, build_gpt, build_model, build_pieces, fact_problem, gpt_problem, lm_loss,
    load_builder, model_problem, parallel_run, partition, partition_problem, sequence_parallel_gaps,
    sequence_parallel_refusal, tp_problem, uses_gpt)

__all__ = ["Block", "Embed", "FACTS", "Head", "ModelConfig", "ModelError", "ParallelBlock", "ParallelEmbed",
           "ParallelHead", "Stage", "attention_core", "boundary_shapes", "build_gpt", "build_model",
           "build_pieces", "fact_problem", "gpt_problem", "lm_loss", "load_builder", "model_problem",
           "parallel_run", "partition", "partition_problem", "sequence_parallel_gaps",
           "sequence_parallel_refusal", "tp_problem", "uses_gpt"]
