# Tests of the runtime's Llama-family decoder (schedc/runtime/model/decoder.py) in one process: its operators
# and the whole model's loss and gradients against a reference written here from straight torch ops
# (rotary positions as complex rotations, key/value heads repeated by hand, an explicit causal
# softmax), with one key/value head, two, and as many as heads; the HF parameter names; rotary
# positions offset by a sequence chunk's first position; the tensor-parallel cut (the ranks' parts sum
# to the whole); the bytes a stage saves against schedc/costmodel/activations.py; the facts read from a model
# TOML and those refused before launch. (Its pipelined runs against the one-process reference are in
# test_runtime_decoder_launch.py.)
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from schedc.costmodel.activations import Sizes, runtime_decoder, stage_bytes
from schedc.runtime.execution.chunks import SequenceChunks
from schedc.runtime.model.decoder import RMSNorm, rotary_table, swiglu
from schedc.runtime.execution.memory import SavedBytes
from schedc.runtime.model.gpt import ModelConfig, ModelError, Stage, build_model, lm_loss, model_problem
from schedc.runtime.execution.recompute import apply_recompute
from schedc.runtime.process.description import DEFAULT_MODEL
from schedc.runtime.model.tensor_parallel import PARTIAL, Split, TensorGroup, parameter_splits
from test_runtime import plans  # noqa: F401 (fixture)
from test_tensor_parallel import world_of_one  # noqa: F401 (fixture)

LLAMA = dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=96, seq=16, vocab=256, mb_size=2, mlp="swiglu",
             norm="rmsnorm", positions="rope", bias="none", family="llama", norm_eps=1e-5, rope_theta=10000.0)


LLAMA_FACTS = runtime_decoder("swiglu", "rmsnorm", "rope")  # what LLAMA's layers keep (schedc/costmodel/activations.py)


def config(**changes) -> ModelConfig:
    return ModelConfig(**{**LLAMA, **changes})


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm().clamp_min(1e-12)).item()


# -- a reference from straight torch ops, reading the weights by their HF names ----------------------

def ref_rms(x, w, eps):
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def ref_rope(x, theta):
    """Rotary positions as Llama's rotate_half convention means them: feature i and i + d/2 of a head
    are the real and imaginary parts of a complex number turned by position x frequency i."""
    d, t = x.shape[-1], x.shape[-2]
    freq = theta ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2 / d)
    turn = torch.polar(torch.ones(t, d // 2, dtype=torch.float64), torch.arange(t, dtype=torch.float64)[:, None] * freq)
    z = torch.complex(x[..., :d // 2].double(), x[..., d // 2:].double()) * turn
    return torch.cat([z.real, z.imag], dim=-1).to(x.dtype)


def ref_attention(q, k, v):
    """Each of the kv heads serves heads / kv consecutive query heads; an explicit causal softmax."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    t = q.shape[2]
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def ref_model(w: dict, cfg: ModelConfig, ids: torch.Tensor) -> torch.Tensor:
    d = cfg.hidden // cfg.heads
    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        h = ref_rms(x, w[p + "input_layernorm.weight"], cfg.norm_eps)
        b, t, _ = h.shape
        q, k, v = ((h @ w[p + f"self_attn.{n}_proj.weight"].T).view(b, t, -1, d).transpose(1, 2) for n in "qkv")
        y = ref_attention(ref_rope(q, cfg.rope_theta), ref_rope(k, cfg.rope_theta), v)
        x = x + y.transpose(1, 2).reshape(b, t, -1) @ w[p + "self_attn.o_proj.weight"].T
        h = ref_rms(x, w[p + "post_attention_layernorm.weight"], cfg.norm_eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate * torch.sigmoid(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return ref_rms(x, w["model.norm.weight"], cfg.norm_eps) @ w["lm_head.weight"].T


def _model(cfg: ModelConfig) -> Stage:
    torch.manual_seed(0)
    model = Stage(build_model(cfg))
    with torch.no_grad():  # norms away from 1, so their gradients are checked at a general point
        for name, p in model.global_parameters():
            if name.endswith("layernorm.weight") or name == "model.norm.weight":
                p.uniform_(0.5, 1.5)
    return model


def _tokens(cfg: ModelConfig, length: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    window = torch.randint(0, cfg.vocab, (cfg.mb_size, (length or cfg.seq) + 1), generator=gen)
    return window[:, :-1], window[:, 1:]


def test_rmsnorm_and_swiglu_match_straight_ops():
    torch.manual_seed(0)
    x, w = torch.randn(2, 5, 8, requires_grad=True), torch.rand(8) + 0.5
    norm = RMSNorm(8, 1e-5)
    with torch.no_grad():
        norm.weight.copy_(w)
    grad = torch.randn(2, 5, 8)
    norm(x).backward(grad)
    x2, w2 = x.detach().requires_grad_(), w.clone().requires_grad_()
    want = ref_rms(x2, w2, 1e-5)
    want.backward(grad)
    assert torch.allclose(norm(x), want, atol=1e-6)
    assert _relative(x.grad, x2.grad) < 1e-6 and _relative(norm.weight.grad, w2.grad) < 1e-6
    g, u = torch.randn(3, 7, requires_grad=True), torch.randn(3, 7, requires_grad=True)
    swiglu(g, u).backward(grad[0, :3, :7])
    g2, u2 = g.detach().requires_grad_(), u.detach().requires_grad_()
    (g2 * torch.sigmoid(g2) * u2).backward(grad[0, :3, :7])
    assert _relative(g.grad, g2.grad) < 1e-6 and _relative(u.grad, u2.grad) < 1e-6


def test_rotary_table_is_rotate_halfs_convention():
    cos, sin = rotary_table(5, 4, 100.0)
    assert torch.allclose(cos[3], torch.tensor([3.0, 0.3, 3.0, 0.3]).cos())  # theta^(-2i/d): 1, 1/10
    assert torch.allclose(sin[3], torch.tensor([3.0, 0.3, 3.0, 0.3]).sin())


@pytest.mark.parametrize("kv_heads", [1, 2, 4], ids=["multi-query", "grouped", "multi-head"])
def test_the_decoder_matches_a_reference_from_straight_ops(kv_heads):
    """Loss and every gradient (HF names) within 1e-5 of the reference's, the layers at the reference's
    sizes: k_proj and v_proj of kv_heads x head size."""
    cfg = config(kv_heads=kv_heads)
    model = _model(cfg)
    tokens, targets = _tokens(cfg)
    loss = lm_loss(model(tokens), targets)
    loss.backward()
    weights = {name: p.detach().clone().requires_grad_() for name, p in model.global_parameters()}
    want = F.cross_entropy(ref_model(weights, cfg, tokens).flatten(0, 1), targets.flatten())
    want.backward()
    assert weights["model.layers.0.self_attn.k_proj.weight"].shape == (kv_heads * 16, 64)
    assert abs(loss.item() - want.item()) <= 1e-6 * want.item()
    for name, p in model.global_parameters():
        assert _relative(p.grad, weights[name].grad) <= 1e-5, name


def test_parameters_take_hugging_faces_names_and_biases_follow_the_facts():
    names = [name for name, _ in _model(config(layers=1)).global_parameters()]
    layer = [f"model.layers.0.{n}.weight" for n in ("input_layernorm", "self_attn.q_proj", "self_attn.k_proj",
             "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm", "mlp.gate_proj", "mlp.up_proj",
             "mlp.down_proj")]
    assert names == ["model.embed_tokens.weight", *layer, "model.norm.weight", "lm_head.weight"]
    qwen = [name for name, _ in _model(config(layers=1, bias="qkv")).global_parameters() if name.endswith("bias")]
    assert qwen == [f"model.layers.0.self_attn.{n}_proj.bias" for n in "qkv"]  # Qwen2: q, k, v biases alone
    assert len([n for n, _ in _model(config(layers=1, bias="all")).global_parameters() if n.endswith("bias")]) == 7


def test_rotary_positions_run_on_over_sequence_chunks():
    """The model run as 2 sequence chunks (runtime/execution/chunks.py: chunk 1's rotary positions from 8 on, its
    keys and values with chunk 0's) gives the whole sequence's loss and gradients."""
    cfg = config()
    whole, chunked = _model(cfg), _model(cfg)
    tokens, targets = _tokens(cfg)
    want = lm_loss(whole(tokens), targets)
    want.backward()
    chunks, outputs = SequenceChunks(2), []
    for j in range(2):
        with chunks.forward(0, j, 8):
            outputs.append(lm_loss(chunked(tokens[:, 8 * j:8 * j + 8]), targets[:, 8 * j:8 * j + 8]) / 2)
    for j in reversed(range(2)):
        torch.autograd.backward(*chunks.backward_roots(0, j, outputs[j], None))
    assert abs(sum(o.item() for o in outputs) - want.item()) <= 1e-6 * want.item()
    for (name, p), (_, ref) in zip(chunked.global_parameters(), whole.global_parameters()):
        assert _relative(p.grad, ref.grad) <= 1e-5, name


def test_the_tensor_parallel_cut_declares_hf_names_and_its_parts_sum_to_the_whole(world_of_one):  # noqa: F811
    """Each piece's declaration (q, k, v, gate, up, embed_tokens, lm_head by rows; o, down by columns;
    norms replicated, PARTIAL under sequence parallelism); with every collective an identity, rank r's
    attention (its 2 query heads and its key/value head) and MLP give partial sums: the two ranks' sum
    to the whole attention's and MLP's."""
    cfg = config(layers=1)
    pieces = build_model(cfg)
    rows = {f"self_attn.{n}_proj.weight": Split(0) for n in "qkv"} | {
        "self_attn.o_proj.weight": Split(1), "mlp.gate_proj.weight": Split(0), "mlp.up_proj.weight": Split(0),
        "mlp.down_proj.weight": Split(1), "embed_tokens.weight": Split(0), "lm_head.weight": Split(0)}
    for sp in (False, True):
        for _, piece in pieces:
            got = parameter_splits(piece.tensor_parallel(TensorGroup(2, 0, None, sp)))
            assert got == {n: rows.get(n, PARTIAL if sp else None) for n, _ in piece.named_parameters()}
    x = torch.randn(2, 16, 64)
    for whole in (pieces[1][1].self_attn, pieces[1][1].mlp):
        with torch.no_grad():
            parts = [whole.tensor_parallel(TensorGroup(2, r, world_of_one))(x) for r in range(2)]
            assert torch.allclose(parts[0] + parts[1], whole(x), atol=1e-5)
    assert pieces[-1][1].tensor_parallel(TensorGroup(2, 0, world_of_one)).vocab_parallel


@pytest.mark.parametrize("mode", ["none", "selective", "full"])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_a_stage_saves_the_activation_tables_bytes(kv_heads, mode):
    """The saved-tensor meter over one forward of each of two stages equals schedc/costmodel/activations.py's
    decoder rows to the byte (the pipelined runs' meter: test_runtime_decoder_launch.py)."""
    cfg = config(kv_heads=kv_heads)
    sizes = Sizes(16, 2, 64, 4, 96, 256, kv_heads)
    for s, first, last, saved in stages_saved_bytes(cfg, mode):
        assert saved == stage_bytes(sizes, LLAMA_FACTS, 1, first, last, recompute=mode), s


def stages_saved_bytes(cfg, mode: str):
    """(stage, first, last, the bytes the saved-tensor meter counts over one forward) of each of two
    stages of the model cfg describes (its first two pieces, then the rest), under recompute `mode`."""
    pieces = build_model(cfg)
    tokens, targets = (t.contiguous() for t in _tokens(cfg))  # a step's batch: two storages
    for s, (run, first, last) in enumerate([(pieces[:2], True, False), (pieces[2:], False, True)]):
        stage = Stage(run)
        apply_recompute(stage, mode, first, last)
        meter = SavedBytes.of({s: stage})
        x = tokens if first else torch.randn(2, 16, 64, requires_grad=True)
        meter.new_step(type("Batch", (), {"tokens": tokens, "targets": targets}))
        with meter.recording((s, 0)):
            y = stage(x)
            if last:
                y = lm_loss(y, targets)  # kept alive, as the executor keeps its state
        yield s, first, last, meter.per_state[(s, 0)]


@pytest.mark.parametrize("changes,message", [
    ({"kv_heads": 3}, "key/value heads 3 do not divide heads 4"),
    ({"hidden": 72, "heads": 8, "kv_heads": 4}, "rotary positions need an even head size, got 9"),
    ({"mlp": "relu"}, "mlp must be one of gelu, swiglu, got 'relu'"),
    ({"norm_eps": -1.0}, "norm_eps must be positive, got -1.0"),
    ({"positions": "learned", "max_positions": 8}, "seq 16 is beyond the model's 8 learned positions"),
])
def test_facts_that_cannot_be_built_are_named(changes, message):
    cfg = config(**changes)
    assert message in model_problem(cfg)
    with pytest.raises(ModelError, match=message.split(":")[0]):
        build_model(cfg)


def test_gpt_facts_build_the_gpt_and_other_facts_the_decoder():
    assert build_model(ModelConfig(**DEFAULT_MODEL))[0][0] == "embed"
    assert build_model(config(layers=1, mlp="gelu", norm="layernorm", positions="learned", bias="all",
                              kv_heads=4))[0][0] == "embed"  # every fact the GPT's: the GPT
    assert [n for n, _ in build_model(config(layers=1))] == ["model", "model.layers.0", ""]


TOML = """[model]
layers = 4
hidden = 64
heads = 4
kv_heads = 2
ffn = 96
vocab = 256
seq = 16
mb_size = 2
mlp = "swiglu"
norm = "rmsnorm"
norm_eps = 1e-5
positions = "rope"
rope_theta = 10000
tied_embeddings = false
bias = "none"
family = "llama"
"""


def test_a_model_toml_states_the_facts_and_tp_over_the_kv_heads_is_refused(plans, tmp_path):  # noqa: F811
    from click.testing import CliRunner
    from schedc.cli import main
    from schedc.runtime.process.options import parse_options
    path = tmp_path / "llama.toml"
    path.write_text(TOML)
    plan = str(plans("1f1b", p=2, m=4))
    cfg = parse_options([plan, "--model", str(path)]).model_config
    assert (cfg.kv_heads, cfg.ffn, cfg.mlp, cfg.norm, cfg.positions, cfg.bias) == (2, 96, "swiglu", "rmsnorm", "rope",
                                                                                 "none")
    result = CliRunner().invoke(main, ["run", plan, "--model", str(path), "--tp", "4", "--nproc", "8"])
    assert result.exit_code == 2 and "--tp 4 does not divide the model's key/value heads 2" in result.output
    assert "Traceback" not in result.output
    path.write_text(TOML.replace('"rmsnorm"', '"batchnorm"'))
    result = CliRunner().invoke(main, ["run", plan, "--model", str(path)])
    assert result.exit_code == 2 and "norm must be one of layernorm, rmsnorm, got 'batchnorm'" in result.output


TINY_LLAMA = "tests/data/hf/tiny-llama/config.json"


def test_a_hugging_face_config_is_the_runtimes_description(plans, tmp_path):  # noqa: F811
    """The tiny Llama's config.json read as the compiler reads it (its facts, --seq the run's); --tp 4
    over its 2 key/value heads, a config without --seq and one whose key/value heads do not divide the
    heads refused before launch, exit 2, the last two located in the file."""
    from click.testing import CliRunner
    from schedc.cli import main
    from schedc.runtime.process.options import parse_options
    plan = str(plans("1f1b", p=2, m=4))
    cfg = parse_options([plan, "--model", TINY_LLAMA, "--seq", "16"]).model_config
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab, cfg.seq) == (4, 64, 4, 2, 176, 256, 16)
    assert (cfg.mlp, cfg.norm, cfg.positions, cfg.bias, cfg.rope_theta, cfg.tied_embeddings, cfg.family) == (
        "swiglu", "rmsnorm", "rope", "none", 500000.0, False, "llama")
    bad = tmp_path / "config.json"
    bad.write_text(open(TINY_LLAMA).read().replace('"num_key_value_heads": 2', '"num_key_value_heads": 3'))
    for args, message in (
            (["--model", TINY_LLAMA, "--seq", "16", "--tp", "4", "--nproc", "8"],
             "error: --tp 4 does not divide the model's key/value heads 2"),
            (["--model", TINY_LLAMA], f"{TINY_LLAMA}:1:1: error: a config.json gives no sequence length for the run"),
            (["--model", str(bad), "--seq", "16"],
             f"{bad}:8:3: error: 'num_key_value_heads' (3) must divide 'num_attention_heads' (4)")):
        result = CliRunner().invoke(main, ["run", plan, *args])
        assert result.exit_code == 2 and message in result.output, result.output
        assert "Traceback" not in result.output and "error: error" not in result.output


@pytest.mark.parametrize("name,kv_heads,bias", [("llama3.1-8b", 8, "none"), ("qwen2.5-72b", 8, "qkv"),
                                                ("mistral-7b", 8, "none")])
def test_the_librarys_dense_models_are_decoders_to_the_runtime(plans, name, kv_heads, bias):  # noqa: F811
    from schedc.runtime.model.gpt import uses_gpt
    from schedc.runtime.process.options import parse_options
    cfg = parse_options([str(plans("1f1b", p=2, m=4)), "--model", name]).model_config
    assert not uses_gpt(cfg) and model_problem(cfg) is None
    assert (cfg.kv_heads, cfg.bias, cfg.mlp, cfg.norm, cfg.positions) == (kv_heads, bias, "swiglu", "rmsnorm", "rope")


def test_resizing_a_description_with_stated_widths_names_the_options_to_give(plans):  # noqa: F811
    """--hidden and --heads over Llama 3.1 70B (SwiGLU 28,672 = 3.5 x 8,192; 8 key/value heads for 64) would
    keep its MLP width and key/value heads: refused before launch, exit 2, naming --ffn and --kv-heads with
    the values that keep its ratios (hand arithmetic: 3.5 x 64 = 224; 8 x 8 / 64 = 1); given, they build
    that model. A GPT file's MLP (4 x hidden) and full heads follow the new sizes."""
    from click.testing import CliRunner
    from schedc.cli import main
    from schedc.runtime.process.options import parse_options
    plan = str(plans("1f1b", p=2, m=4))
    resized = [plan, "--model", "llama3.1-70b", "--layers", "4", "--hidden", "64", "--heads", "8", "--seq", "64"]
    for extra, message in (
            ([], "--hidden 64 resizes --model llama3.1-70b, whose ffn 28672 (the MLP's width, against its hidden 8192) "
                 "is stated, not derived from hidden: give --ffn with --hidden (--ffn 224 keeps its ratio to hidden)"),
            (["--ffn", "224"], "--heads 8 resizes --model llama3.1-70b, whose kv_heads 8 (its key/value heads, against "
                               "its heads 64) is stated, not derived from heads: give --kv-heads with --heads "
                               "(--kv-heads 1 keeps its ratio to heads)"),
            (["--ffn", "224", "--kv-heads", "0"], "--kv-heads must be positive, got 0"),
            (["--ffn", "224", "--kv-heads", "3"], "key/value heads 3 do not divide heads 8")):
        result = CliRunner().invoke(main, ["run", *resized, *extra])
        assert result.exit_code == 2 and f"error: {message}" in result.output, result.output
        assert "Traceback" not in result.output
    cfg = parse_options([*resized, "--ffn", "224", "--kv-heads", "2", "--vocab", "256"]).model_config
    assert (cfg.layers, cfg.hidden, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.seq, cfg.vocab, cfg.family) == (
        4, 64, 8, 2, 224, 64, 256, "llama") and model_problem(cfg) is None
    result = CliRunner().invoke(main, ["run", plan, "--model", TINY_LLAMA, "--seq", "16", "--hidden", "128"])
    assert result.exit_code == 2 and "give --ffn with --hidden (--ffn 352 keeps its ratio" in result.output
    gpt = parse_options([plan, "--model", "gpt-1.7b", "--hidden", "64", "--heads", "8"]).model_config
    assert (gpt.hidden, gpt.heads, gpt.kv_heads, gpt.ffn) == (64, 8, 8, 256)


def test_a_library_llama_on_cpu_ranks_is_warned_of_with_its_own_count_and_the_options_that_shrink_it(plans):  # noqa: F811
    """Llama 3.1 70B's count as its facts give it (70.6e9, Meta's model card), not a GPT's 12 h^2 a layer
    (66.6e9); the warning names the size options with --ffn and --kv-heads."""
    from schedc.runtime.process.launch import size_warning
    from schedc.runtime.process.options import parse_options
    warning = size_warning(parse_options([str(plans("1f1b", p=2, m=4)), "--model", "llama3.1-70b", "--device", "cpu"]))
    assert warning.startswith("warning: the model has about 7.06e+10 parameters (layers 80, hidden 8192")
    assert "with --ffn and --kv-heads where it states them, give a small model of its facts" in warning


def test_a_library_llama_too_large_for_this_machine_is_refused_naming_the_options_that_shrink_it(plans):  # noqa: F811
    """Llama 3.1 70B at its own size on two CPU ranks: 70.6e9 parameters x 16 bytes alone are about 1 TiB."""
    from schedc.runtime.process.launch import LaunchError, check_launch
    with pytest.raises(LaunchError, match=r"one step would need about .* GiB .*; --model llama3\.1-70b: --layers, "
                                          r"--hidden, --heads, --seq and --vocab, with --ffn and --kv-heads"):
        check_launch(str(plans("1f1b", p=2, m=4)), 2, ["--model", "llama3.1-70b", "--device", "cpu"], [])
