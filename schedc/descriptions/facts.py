"""A decoder model's architecture facts: what decides its cost, its memory and what the runtime builds.
One frozen value that every description (a schedc TOML file, a Hugging Face config.json) maps to, and the
cost model, the activation table and the runtime read.

    GPT (Megatron-LM 2021):  kv_heads = heads, mlp gelu (ffn = 4h), layernorm, learned positions,
                             tied embeddings, biases everywhere, the standard attention kernel
    Llama 3.1 70B:           64 heads over 8 kv_heads, swiglu (ffn 28,672), rmsnorm, rope, untied, no biases

Imports nothing of schedc (the runtime reads it); what is wrong with a description is a DescriptionError
carrying the key and its (line, col), which the compiler turns into a located diagnostic.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .moe import ROUTERS, attention_parameters, moe_consistency, moe_mlp_parameters, mtp_parameters

MLPS = ("gelu", "swiglu")               # gelu: two matrices h x f; swiglu: three (gate, up, down)
NORMS = ("layernorm", "rmsnorm")
POSITIONS = ("learned", "rope")         # learned: a table of max_positions rows; rope: rotary, no weights
BIASES = ("all", "qkv", "none")         # GPT: all; Llama, Mistral: none; Qwen2: the q, k, v projections only
ATTENTION_KERNELS = ("standard", "flash")
GELU_APPROXIMATIONS = ("none", "tanh")  # torch's F.gelu(approximate=...): the same FLOPs and bytes
FAMILIES = ("gpt", "gpt2", "llama", "mistral", "qwen2", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v3")
DTYPE_BYTES = {"bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2, "half": 2, "fp32": 4, "float32": 4,
               "float": 4}
MAX_SIZE = 2**40  # a model's sizes (layers, hidden, heads, ...): past any model, exact as floats


class DescriptionError(ValueError):
    """What is wrong with a description: the message, the key it is about (None: the whole file) and
    where that key stands in the text, (line, col), both 1-based ((1, 1) when unknown)."""

    def __init__(self, message: str, key: str | None = None, line: int = 1, col: int = 1):
        super().__init__(message)
        self.message, self.key, self.line, self.col = message, key, line, col


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """A decoder of `layers` blocks, hidden size `hidden`, `heads` query heads over `kv_heads` key/value
    heads (0 given: as many as heads), an MLP of form `mlp` and width `ffn` (swiglu: the intermediate
    size), over `seq` tokens and a vocabulary of `vocab`; the rest as the module says. The defaults are
    Megatron's 2021 GPT."""

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn: int
    dtype: str = "bf16"
    attention: str = "standard"  # "standard" materialises the s x s scores in HBM, "flash" keeps them on chip
    kv_heads: int = 0
    mlp: str = "gelu"
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    positions: str = "learned"
    rope_theta: float = 10000.0
    tied_embeddings: bool = True
    bias: str = "all"
    max_positions: int | None = None  # learned positions' table (None: seq rows); a longer seq is refused
    family: str = "gpt"
    head_size: int = 0       # a head's width where it is not hidden / heads (Qwen3: 128); 0: hidden / heads
    # a mixture of experts (moe.py; 0 experts: a dense model): routed experts, each token's top_k of them,
    # their SwiGLU width, shared experts (each shared_ffn wide, 0: moe_ffn), the leading dense layers (of
    # width ffn), the router and its groups, the capacity factor (0: dropless), the auxiliary loss's weight
    experts: int = 0
    top_k: int = 0
    moe_ffn: int = 0
    shared_experts: int = 0
    shared_ffn: int = 0
    first_k_dense: int = 0
    router: str = "softmax"
    n_group: int = 1
    topk_group: int = 1
    capacity_factor: float = 0.0
    aux_loss: float = 0.0
    # multi-head latent attention (DeepSeek-V2/V3) when kv_lora_rank > 0; q_lora_rank 0: Q not compressed
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0
    mtp: int = 0             # multi-token-prediction depth: that many extra blocks on the last stage
    # a sliding window (Mistral's sliding_window, Qwen2's with use_sliding_window): each query attends to
    # the last `window` positions, itself included (None: every earlier position)
    window: int | None = None
    # Llama 3.1's rope_scaling ("llama3"): (factor, low_freq_factor, high_freq_factor,
    # original_max_position_embeddings), a change of the rotary frequencies alone (None: unscaled)
    rope_scaling: tuple[float, float, float, int] | None = None
    # the MLP's GeLU where mlp is gelu: "none" exact (erf), "tanh" its tanh approximation (GPT-2's gelu_new)
    gelu_approximate: str = "none"

    def __post_init__(self):
        if not self.kv_heads:
            object.__setattr__(self, "kv_heads", self.heads)

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    @property
    def q_hidden(self) -> int:
        """The width of Q (and of the projection's input): heads x head_dim (= hidden unless head_size)."""
        return self.heads * self.head_dim if self.head_size else self.hidden

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def moe_layers(self) -> int:
        """The layers whose MLP is routed: all past the first_k_dense dense ones (none without experts)."""
        return self.layers - self.first_k_dense if self.moe else 0

    @property
    def shared_width(self) -> int:
        return self.shared_ffn or self.moe_ffn

    def layer_parameters(self, moe: bool, routed: int | None = None) -> int:
        """One layer's weights: the attention (moe.attention_parameters), a dense MLP of two (gelu) or three
        (swiglu) h x ffn matrices or an MoE layer's (with `routed` experts, all when None), the norms'
        weights (and a layer norm's biases) and the biases the model has."""
        h, f, kv = self.hidden, self.ffn, self.kv_hidden
        mlp = moe_mlp_parameters(self, routed) if moe else (3 if self.mlp == "swiglu" else 2) * h * f
        norm = 2 * h if self.norm == "layernorm" else h
        biases = {"all": h + 2 * kv + h + (2 * f if self.mlp == "swiglu" else f) + h,
                  "qkv": self.q_hidden + 2 * kv, "none": 0}[self.bias]
        return attention_parameters(self) + mlp + 2 * norm + biases

    @property
    def kv_hidden(self) -> int:
        """The width of K (and of V): kv_heads x head_dim (= hidden for multi-head attention)."""
        return self.kv_heads * self.head_dim

    @property
    def flash(self) -> bool:
        return self.attention == "flash"

    @property
    def width(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def position_rows(self) -> int:
        """Rows of the learned position table (0 with rotary positions)."""
        if self.positions != "learned":
            return 0
        return self.max_positions if self.max_positions is not None else self.seq


# The facts a TOML model file may state beside its sizes: key -> (type, the values it may take or None)
FACT_FIELDS: dict[str, tuple[type, tuple | None]] = {
    "kv_heads": (int, None), "mlp": (str, MLPS), "norm": (str, NORMS), "norm_eps": (float, None),
    "positions": (str, POSITIONS), "rope_theta": (float, None), "tied_embeddings": (bool, None),
    "bias": (str, BIASES), "max_positions": (int, None), "family": (str, FAMILIES), "window": (int, None),
    "gelu_approximate": (str, GELU_APPROXIMATIONS)}
# The facts of a mixture of experts, latent attention and a head width of its own (moe.py): the cost
# model's (a TOML model file may state them); the runtime does not build them yet
MOE_FACT_FIELDS: dict[str, tuple[type, tuple | None]] = {
    "head_size": (int, None), "experts": (int, None), "top_k": (int, None), "moe_ffn": (int, None),
    "shared_experts": (int, None), "shared_ffn": (int, None), "first_k_dense": (int, None),
    "router": (str, ROUTERS), "n_group": (int, None), "topk_group": (int, None), "capacity_factor": (float, None),
    "aux_loss": (float, None), "q_lora_rank": (int, None), "kv_lora_rank": (int, None),
    "qk_rope_head_dim": (int, None), "qk_nope_head_dim": (int, None), "v_head_dim": (int, None), "mtp": (int, None)}
FACT_NAMES = tuple(f.name for f in fields(ModelFacts))


def consistency(facts: ModelFacts, names: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """What the sizes say against each other, as (fact to blame, message): heads divide hidden, kv_heads
    divide heads, seq within a learned position table. `names`: the description's key for a fact, where
    it is not the fact's own name (a config.json's num_attention_heads)."""
    name = {**{f: f for f in FACT_NAMES}, **(names or {})}
    out = []
    if facts.hidden % facts.heads and not facts.head_size:
        out.append(("heads", f"'{name['heads']}' ({facts.heads}) must divide '{name['hidden']}' ({facts.hidden})"))
    if facts.kv_heads > facts.heads or facts.heads % facts.kv_heads:
        out.append(("kv_heads", f"'{name['kv_heads']}' ({facts.kv_heads}) must divide '{name['heads']}' "
                                f"({facts.heads}): each key/value head serves a group of query heads"))
    if facts.positions == "learned" and facts.max_positions is not None and facts.seq > facts.max_positions:
        out.append(("max_positions", f"sequence {facts.seq} (the model's seq or --seq) is longer than its "
                                     f"{facts.max_positions} learned positions ('{name['max_positions']}')"))
    return out + moe_consistency(facts, name)


def parameters(facts: ModelFacts) -> int:
    """The model's parameters (one replica, no parallelism): per layer its attention, MLP (dense, or an
    MoE layer's routed and shared experts and router), norms and biases (ModelFacts.layer_parameters);
    then the word embedding, the learned positions, the final norm and an untied output layer. The
    multi-token-prediction blocks are not counted (DeepSeek-V3's 671B is without its 14B MTP module).

        GPT (f = 4h, biases all, layernorm): 12h^2 + 13h per layer, as Narayanan et al. count it
    """
    return _total(facts, None)


def activated_parameters(facts: ModelFacts) -> int:
    """The parameters one token's forward touches: as `parameters` with top_k routed experts a layer
    (DeepSeek-V3: 37B of 671B; Mixtral 8x7B: 12.9B of 46.7B)."""
    return _total(facts, facts.top_k)


def _total(facts: ModelFacts, routed: int | None) -> int:
    dense = facts.layers - facts.moe_layers
    layers = dense * facts.layer_parameters(False) + facts.moe_layers * facts.layer_parameters(True, routed)
    norm = 2 * facts.hidden if facts.norm == "layernorm" else facts.hidden
    words = facts.vocab * facts.hidden
    ends = words * (1 if facts.tied_embeddings else 2) + facts.position_rows * facts.hidden + norm
    return layers + ends


def extra_parameters(facts: ModelFacts) -> int:
    """The multi-token-prediction blocks' own weights (moe.mtp_parameters), beside `parameters`."""
    return mtp_parameters(facts)


def attended_pairs(seq: int, window: int | None) -> int:
    """The (query, key) pairs causal attention computes over `seq` tokens, the query at position i
    (1-based) attending to min(window, i) keys: s(s+1)/2 without a window, w(w+1)/2 + (s - w)w with one.

    >>> attended_pairs(4, None), attended_pairs(4, 2), attended_pairs(4, 9)
    (10, 7, 10)
    """
    w = seq if window is None else min(window, seq)
    return w * (w + 1) // 2 + (seq - w) * w


def window_share(seq: int, window: int | None) -> float:
    """The share of full causal attention's pairs a sliding window leaves (1.0 where it covers the
    sequence): what the attention products of a kernel that skips the masked blocks cost."""
    if window is None or window >= seq:
        return 1.0
    return attended_pairs(seq, window) / attended_pairs(seq, None)
