"""Weight quantization of a span's blocks with bitsandbytes: int8 or nf4 (4-bit NormalFloat).

Only the `nn.Linear` modules inside a block are replaced. Norms, MoE routers and fused expert
tensors (plain parameters, not `nn.Linear`, in transformers 5), embeddings and the head stay
in the compute dtype. `block_bytes` prices a block as `quantize_layer` stores it, from a layer
built on `meta`. Knows nothing of checkpoints, servers or the swarm.
"""

from __future__ import annotations

import importlib.util
import logging
from types import ModuleType

import torch

from drift.wire.errors import BadRequest

QUANT_TYPES = ("none", "int8", "nf4")
INSTALL_HINT = "pip install 'drift-swarm[quant]'  (bitsandbytes>=0.50)"
INT8_THRESHOLD = 6.0  # LLM.int8 outlier threshold (transformers' default llm_int8_threshold)
NF4_BLOCK = 64  # weights per absmax in nf4 (bitsandbytes' default blocksize)
NF4_BLOCK2 = 256  # absmax values per second-level scale (double quantization)
# Weights quantized at a time on the CPU: bitsandbytes' CPU nf4 quantizer holds ~16 bytes of
# float32 temporaries per weight, 0.4 GB for one 25M-weight MLP projection of a 3B model.
QUANT_CHUNK = 1 << 20
# Linear layers that route tokens to experts stay in the compute dtype (transformers 5 makes
# most routers their own module class already; these names catch the plain-Linear ones).
ROUTER_NAMES = frozenset({"gate", "router", "shared_expert_gate"})

log = logging.getLogger(__name__)


def parse_quant(name: str, device: torch.device) -> str:
    """none | int8 | nf4, or auto: nf4 on CUDA when bitsandbytes is installed, else none.

    BadRequest names the choices.
    """
    key = str(name).strip().lower()
    if key == "auto":
        if device.type != "cuda":
            return "none"
        if importlib.util.find_spec("bitsandbytes") is None:
            log.warning("--quant_type auto: bitsandbytes is not installed, so the weights stay "
                        "unquantized; for nf4 (~1/7 of float32's weight memory): %s", INSTALL_HINT)  # fmt: skip
            return "none"
        return "nf4"
    if key not in QUANT_TYPES:
        raise BadRequest(f"unknown quantization {name!r}; use auto, {', '.join(QUANT_TYPES)}")
    return key


def quant_backend() -> ModuleType:
    """bitsandbytes, imported; BadRequest with the install command when it is missing."""
    # bitsandbytes warns on every int8 matmul whose input is not float16 (it casts it), and
    # once on CPU without the optional `kernels` package (which would fetch code from the Hub
    # at run time; its own nf4 kernels are used instead). Neither is actionable: keep quiet.
    for name in ("bitsandbytes.autograd._functions", "bitsandbytes.backends.cpu.ops"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        import bitsandbytes
    except ImportError as exc:
        raise BadRequest(
            f"--quant_type int8/nf4 needs bitsandbytes, which is not installed: {INSTALL_HINT}"
        ) from exc
    return bitsandbytes


def warm_up(quant: str, dtype: torch.dtype, device: torch.device) -> None:
    """Quantize and run one small linear layer: bitsandbytes loads its kernels (~15 MiB) on
    first use, the same whatever the span, so a measurement after this sees only weights."""
    if quant == "none":
        return
    layer = quantize_layer(torch.nn.Sequential(torch.nn.Linear(64, 64)), quant, dtype, device)
    with torch.no_grad():
        layer(torch.zeros(1, 1, 64, dtype=dtype, device=device))


def quantize_layer(
    layer: torch.nn.Module, quant: str, dtype: torch.dtype, device: torch.device
) -> torch.nn.Module:
    """Replace every nn.Linear in `layer` (weights on the CPU) by its quantized twin on `device`.

    The rest of the layer (norms, routers, expert tensors) is moved to `device` unchanged.
    """
    if quant == "none":
        return layer.to(device)
    bnb = quant_backend()
    for parent in list(layer.modules()):
        for child_name, child in list(parent.named_children()):
            if _quantizable(child_name, child):
                assert isinstance(child, torch.nn.Linear)
                # quantized now (bitsandbytes quantizes on the move to a device), one linear at
                # a time: its `dtype` weight is freed before the next is quantized, so loading
                # peaks at one block in `dtype` plus one chunk's quantization (on the CPU)
                new = _quantized_linear(bnb, child, quant, dtype)
                if quant == "nf4" and device.type == "cpu":
                    quantize_nf4_in_chunks(bnb, new.get_parameter("weight"))
                setattr(parent, child_name, new.to(device))
                del child, new
    return layer.to(device)


def quantize_nf4_in_chunks(bnb: ModuleType, param: torch.nn.Parameter,
                           chunk: int = QUANT_CHUNK) -> None:  # fmt: skip
    """Quantize a not yet quantized Params4bit (double-quantized, as _quantized_linear makes
    it) in place, as its own move to a device would (Params4bit._quantize), `chunk` weights
    at a time: the same bytes (a block of NF4_BLOCK weights never straddles two chunks, and
    the second level runs over all the scales; tests/models/test_quant.py compares), with a
    temporary of one chunk, not of the whole weight."""
    assert param.compress_statistics and not param.bnb_quantized  # type: ignore[attr-defined]
    blocksize, kind = param.blocksize, param.quant_type  # type: ignore[attr-defined]
    storage = param.quant_storage  # type: ignore[attr-defined]
    flat = param.data.contiguous().reshape(-1)
    step = max(blocksize, chunk - chunk % blocksize)
    parts = [torch.ops.bitsandbytes.quantize_4bit.default(flat[i : i + step], blocksize, kind,
                                                          storage)  # fmt: skip
             for i in range(0, flat.numel(), step)]  # fmt: skip
    packed = torch.cat([p for p, _ in parts])
    absmax = torch.cat([a for _, a in parts])
    del parts
    offset = absmax.mean()
    qabsmax, state2 = bnb.functional.quantize_blockwise(absmax - offset, blocksize=NF4_BLOCK2)
    state = bnb.functional.QuantState(
        absmax=qabsmax, shape=param.data.shape, dtype=param.data.dtype, blocksize=blocksize,
        code=bnb.functional.get_4bit_type(kind, device=flat.device), quant_type=kind,
        offset=offset, state2=state2,
    )  # fmt: skip
    param.data = packed
    param.quant_state = state  # type: ignore[attr-defined]
    if param.module is not None:  # type: ignore[attr-defined]
        param.module.quant_state = state  # type: ignore[attr-defined]
    param.bnb_quantized = True  # type: ignore[attr-defined]


def _quantizable(name: str, module: torch.nn.Module) -> bool:
    """A plain linear layer (FalconLinear included) that is not an MoE router."""
    return isinstance(module, torch.nn.Linear) and name not in ROUTER_NAMES


def _quantized_linear(
    bnb: ModuleType, linear: torch.nn.Linear, quant: str, dtype: torch.dtype
) -> torch.nn.Module:
    has_bias = linear.bias is not None
    args = (linear.in_features, linear.out_features, has_bias)
    new: torch.nn.Module
    if quant == "int8":
        new = bnb.nn.Linear8bitLt(
            *args, has_fp16_weights=False, threshold=INT8_THRESHOLD, device="meta"
        )
        new.weight = bnb.nn.Int8Params(
            linear.weight.data, requires_grad=False, has_fp16_weights=False
        )
        if has_bias:
            new.bias = torch.nn.Parameter(linear.bias.data.to(dtype), requires_grad=False)
        return Int8Linear(new).requires_grad_(False)
    elif quant == "nf4":
        new = bnb.nn.Linear4bit(
            *args, compute_dtype=dtype, compress_statistics=True, quant_type="nf4", device="meta"
        )
        new.weight = bnb.nn.Params4bit(
            linear.weight.data, requires_grad=False, quant_type="nf4", blocksize=NF4_BLOCK,
            compress_statistics=True,
        )  # fmt: skip
        # On CPUs with AVX512-BF16, bitsandbytes would repack the weight at the first forward:
        # bf16 compute, scales expanded to float32 (+9% nf4 memory, after the load), and only
        # for dimensions divisible by 64 (others crash). It was 2.6x faster on SmolLM2 here
        # (scripts/bench_quant.py); DRIFT keeps the compact form whose cost block_bytes states
        # and drift up plans with, on every shape, computing in `dtype`.
        new.support_avx512bf16_for_cpu = False  # type: ignore[assignment]
    else:
        raise BadRequest(f"unknown quantization {quant!r}; use one of {', '.join(QUANT_TYPES)}")
    if has_bias:
        new.bias = torch.nn.Parameter(linear.bias.data.to(dtype), requires_grad=False)
    return new.requires_grad_(False)


class Int8Linear(torch.nn.Module):
    """bitsandbytes' int8 linear, run the way it runs best where the input is.

    On CUDA: its int8 matmul (LLM.int8: activations quantized too, outlier columns apart).
    On the CPU: its dequantize-then-matmul path (what bitsandbytes itself picks on the CPU
    for training), weight-only int8: faster there and closer to float32 (SmolLM2 blocks 0-9:
    output error 0.037 vs 0.112, scripts/bench_quant.py). Inputs of any rank run as [N, in] (its int8 matmul takes rank
    <= 3; DeepSeek's latent attention feeds kv_b_proj rank-4 inputs).
    """

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Linear8bitLt picks its path by `training` (set into its matmul state each call);
        # nothing else in it depends on the flag.
        self.inner.training = x.device.type in ("cpu", "xpu")
        out = self.inner(x.reshape(-1, x.shape[-1]))  # [N, out]
        return out.reshape(*x.shape[:-1], out.shape[-1])


def _linear_bytes(out_features: int, in_features: int, quant: str) -> int:
    """Bytes of one quantized weight matrix [out, in] with its scales (not the bias)."""
    n = out_features * in_features
    if quant == "int8":
        return n + 4 * out_features  # int8 weights + one float32 scale per output row (SCB)
    blocks = -(-n // NF4_BLOCK)
    # packed 4-bit weights + one uint8 absmax per block + a float32 scale per 256 absmax
    # + the two codebooks (16 and 256 float32 values) and the float32 offset
    return -(-n // 2) + blocks + 4 * -(-blocks // NF4_BLOCK2) + 4 * (16 + 256 + 1)


def block_bytes(layer: torch.nn.Module, dtype: torch.dtype, quant: str) -> int:
    """Bytes `layer` (built on meta) holds once loaded in `dtype` and quantized by `quant`."""
    if quant not in QUANT_TYPES:
        raise BadRequest(f"unknown quantization {quant!r}; use one of {', '.join(QUANT_TYPES)}")
    item = torch.empty((), dtype=dtype).element_size()
    total = 0
    quantized: set[int] = set()
    if quant != "none":
        for name, module in layer.named_modules():
            if _quantizable(name.rpartition(".")[2], module):
                assert isinstance(module, torch.nn.Linear)
                total += _linear_bytes(module.out_features, module.in_features, quant)
                quantized.add(id(module.weight))
    for t in [*layer.parameters(), *layer.buffers()]:
        if id(t) not in quantized:
            total += t.numel() * (item if t.is_floating_point() else t.element_size())
    return total


def storage_bytes(module: torch.nn.Module) -> int:
    """Bytes of every tensor `module` holds: parameters, buffers and quantization state."""
    seen: set[int] = set()
    total = 0

    def add(t: torch.Tensor | None) -> None:
        nonlocal total
        if t is None or t.is_meta or t.untyped_storage().data_ptr() in seen:
            return
        seen.add(t.untyped_storage().data_ptr())
        total += t.untyped_storage().nbytes()

    for sub in module.modules():
        for t in [*sub.parameters(recurse=False), *sub.buffers(recurse=False)]:
            add(t)
            add(getattr(t, "SCB", None))  # int8 scales before the first forward
            state = getattr(t, "quant_state", None)  # nf4: absmax, codebooks, nested scales
            if state is not None:
                for part in (state.absmax, state.code, getattr(state, "offset", None)):
                    add(part)
                state2 = getattr(state, "state2", None)
                if state2 is not None:
                    add(state2.absmax)
                    add(state2.code)
        matmul_state = getattr(sub, "state", None)  # int8 scales after the first forward
        add(getattr(matmul_state, "SCB", None))
    return total
