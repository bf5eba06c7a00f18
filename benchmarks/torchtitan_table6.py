"""torchtitan's 4D rows predicted: Table 6 of pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md
(@31a17bfdb70bab6f62a13d21816a5339b911d6e3): Llama 3.1 405B on 512 H100s, TP 8, PP 8 (1F1B), FSDP x CP = 8
without resharding after the forward (torchtitan's choice with PP), local batch 8, full activation
checkpointing, torch.compile + Float8 + AsyncTP, sequence 32k to 256k. Measured tokens/s per GPU and
memory next to schedc's prediction, with the error. Nothing is fitted to a row: the cluster is the
library's dgx-h100-80gb (their GPUs are 96 GB HBM2e at 500 W, which no figure here adjusts).

    python benchmarks/torchtitan_table6.py [--plain]

--plain leaves out Float8 and AsyncTP (--fp8, --tp-comm-overlap). The layer split is the even one with
the remainder first (126 layers: 16 x 6, 15 x 2), as torchtitan's split leaves it unstated; sequence
parallelism is on (torchtitan's TP shards the norms' activations along the sequence).
"""
from __future__ import annotations

import argparse

from schedc.driver.cluster import compile_on_cluster
from schedc.layout import ClusterRequest, Layout

# (cp, FSDP, sequence, measured tokens/s/GPU, measured GiB), the table's rows as published
ROWS = ((1, 8, 32768, 76, 75.3), (2, 4, 65536, 47, 75.9), (4, 2, 131072, 31, 77.1), (8, 1, 262144, 16, 84.9))
LOCAL_BATCH, GPUS, TP, PP = 8, 512, 8, 8


def predict(cp: int, fsdp: int, seq: int, plain: bool) -> tuple[float, float, dict]:
    """(tokens/s per GPU, GiB per GPU, the breakdown) of one row."""
    layout = Layout(tp=TP, dp=fsdp, cp=cp, microbatch_size=1, global_batch=LOCAL_BATCH * fsdp, recompute="full",
                    sequence_parallel=True, zero=3, reshard_after_forward=False,
                    stage_layers=(16,) * 6 + (15,) * 2, fp8=not plain, tp_comm_overlap=not plain)
    on = compile_on_cluster("1f1b", {"p": str(PP)}, ClusterRequest("llama3.1-405b", "dgx-h100-80gb", layout, seq=seq),
                            lower=False)
    p = on.prediction
    tokens = p.global_batch * seq / (p.iteration_s * GPUS)
    return tokens, p.memory_bytes / 2**30, p.breakdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--plain", action="store_true", help="without Float8 and AsyncTP")
    args = parser.parse_args()
    print(f"{'FSDP x CP':>9} {'seq':>7} {'tok/s/GPU':>9} {'predicted':>9} {'error':>6} {'GiB':>5} {'predicted':>9} "
          f"{'error':>6}  context-parallel comm s, bubble s")
    for cp, fsdp, seq, tokens, gib in ROWS:
        got, memory, parts = predict(cp, fsdp, seq, args.plain)
        print(f"{fsdp:>4} x {cp:<2} {seq:>7} {tokens:>9} {got:>9.1f} {got / tokens - 1:>+6.0%} {gib:>5} {memory:>9.1f} "
              f"{memory / gib - 1:>+6.0%}  {parts.get('context_parallel_comm_s', 0.0):.2f}, {parts['bubble_s']:.2f}")


if __name__ == "__main__":
    main()
