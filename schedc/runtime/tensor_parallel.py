"""schedc.runtime.tensor_parallel: the import path the docs give; the module is schedc.runtime.model.tensor_parallel."""
from __future__ import annotations

from .model.tensor_parallel import (
    ColumnParallelLinear, Messages, PARTIAL, RowParallelLinear, SEQUENCE_DIM, Split, TensorGroup,
    VocabParallelEmbedding, all_gather, all_reduce, cut, declare, enter, gathered_gradients, global_splits, join,
    leave, parameter_splits, qualified, reduce_scatter, shard_parameter, sync_partial_gradients, vocab_parallel_loss)

__all__ = ["ColumnParallelLinear", "Messages", "PARTIAL", "RowParallelLinear", "SEQUENCE_DIM", "Split", "TensorGroup",
           "VocabParallelEmbedding", "all_gather", "all_reduce", "cut", "declare", "enter",
           "gathered_gradients", "global_splits", "join", "leave", "parameter_splits", "qualified",
           "reduce_scatter", "shard_parameter", "sync_partial_gradients", "vocab_parallel_loss"]
