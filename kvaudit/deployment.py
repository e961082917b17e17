"""The deployment being audited (model, TP, device, utilization) and the KV budget vLLM gives it.

vLLM's budget, on CUDA and on Ascend alike, is ``available = device memory × utilization − peak
non-KV memory``; the non-KV memory is the weights on one rank plus everything else the profile run
holds (activations, non-torch allocations such as communication buffers), the ``overhead`` here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kvaudit.errors import ConfigError, UsageError
from kvaudit.spec import DTYPE_BYTES, ModelSpec, load_model_spec, resolve_dtype
from kvaudit.units import GiB, fmt_bytes

DEFAULT_OVERHEAD_BYTES = 2 * GiB
"""Non-KV memory beside the weights (peak activations of vLLM's profile run plus non-torch
allocations). An allowance, not a measurement: public Qwen3-Next logs on Atlas A2 imply 1.6-2.4 GiB
(see README). Override with ``--overhead``."""


@dataclass(frozen=True)
class Device:
    """A device kind and the total memory its runtime reports."""

    name: str
    title: str
    memory_bytes: int
    source: str


DEVICES: dict[str, Device] = {
    "atlas-a2-64g": Device(
        "atlas-a2-64g", "Atlas 800 A2 (Ascend 910B, 64 GB HBM)", 65_452_113_920,
        "vllm-ascend worker log 'total memory: 65452113920'; torch_npu reports 60.96 GiB total capacity"),
    "atlas-a2-32g": Device(
        "atlas-a2-32g", "Atlas 300I A2 / 910B4 (32 GB HBM)", 31_662_800_896,
        "vllm-ascend worker log 'total memory: 31662800896' on a 32 GB card (29.49 GiB)"),
}


@dataclass(frozen=True)
class Preset:
    """A shipped model config with the deployment its tutorial uses."""

    name: str
    title: str
    config: str
    """Directory under ``fixtures/configs``."""
    tp: int
    max_model_len: int
    device: str
    description: str


PRESETS: dict[str, Preset] = {
    "qwen3-next": Preset(
        "qwen3-next", "Qwen3-Next-80B-A3B-Instruct", "qwen3-next-80b-a3b-instruct", tp=4,
        max_model_len=4096, device="atlas-a2-64g",
        description="hybrid GatedDeltaNet + full attention, as the vllm-ascend tutorial deploys it"),
    "llama-3.1-8b": Preset(
        "llama-3.1-8b", "Llama-3.1-8B", "llama-3.1-8b", tp=1, max_model_len=8192,
        device="atlas-a2-64g", description="dense control: full attention only"),
}


def fixtures_dir() -> Path:
    """The shipped configs: inside the wheel, or ``fixtures/configs`` in a source checkout."""
    here = Path(__file__).resolve().parent
    packaged = here / "_fixtures" / "configs"
    return packaged if packaged.is_dir() else here.parent / "fixtures" / "configs"


def get_preset(name: str) -> Preset:
    """Look a preset up by name; an unknown name is a usage error."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UsageError(f"unknown preset {name!r} (known: {', '.join(PRESETS)})") from None


def load_preset_spec(preset: Preset) -> ModelSpec:
    """The preset's ``ModelSpec``, read from its shipped ``config.json``."""
    return load_model_spec(fixtures_dir() / preset.config, name=preset.title)


@dataclass(frozen=True)
class Deployment:
    """One rank of a vLLM deployment and the KV budget that follows from it."""

    model: ModelSpec = field(repr=False)
    tp: int
    dtype: str
    max_model_len: int
    device: str
    device_memory_bytes: int
    gpu_memory_utilization: float
    weights_bytes: int
    """Weights on one rank: parameter count per rank × dtype size (or ``--weights``)."""
    weights_source: str
    overhead_bytes: int
    """Non-KV memory beside the weights (activations, non-torch)."""
    kv_cache_memory_bytes: int | None
    """``--kv-cache-memory``: the KV budget given directly, as vLLM's flag of that name."""
    kv_transfer: bool
    num_blocks_override: int | None

    @property
    def non_kv_bytes(self) -> int:
        """Memory the rank holds besides the KV cache."""
        return self.weights_bytes + self.overhead_bytes

    @property
    def kv_budget_bytes(self) -> int:
        """``available_memory`` handed to vLLM's planner."""
        if self.kv_cache_memory_bytes is not None:
            return self.kv_cache_memory_bytes
        return int(self.device_memory_bytes * self.gpu_memory_utilization) - self.non_kv_bytes

    def to_dict(self) -> dict:
        """JSON form; byte figures are ints."""
        return {
            "model": self.model.name, "config_path": str(self.model.config_path),
            "model_type": self.model.model_type, "tensor_parallel_size": self.tp, "dtype": self.dtype,
            "max_model_len": self.max_model_len, "device": self.device,
            "device_memory_bytes": self.device_memory_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "weights_bytes": self.weights_bytes, "weights_source": self.weights_source,
            "overhead_bytes": self.overhead_bytes, "non_kv_bytes": self.non_kv_bytes,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "kv_budget_bytes": self.kv_budget_bytes, "kv_transfer": self.kv_transfer,
            "num_blocks_override": self.num_blocks_override,
        }


def make_deployment(
    model: ModelSpec,
    *,
    tp: int,
    max_model_len: int,
    gpu_memory_utilization: float,
    device: str = "atlas-a2-64g",
    device_memory_bytes: int | None = None,
    dtype: str = "auto",
    weights_bytes: int | None = None,
    overhead_bytes: int = DEFAULT_OVERHEAD_BYTES,
    kv_cache_memory_bytes: int | None = None,
    kv_transfer: bool = False,
    num_blocks_override: int | None = None,
) -> Deployment:
    """Validate the deployment figures and compute the budget; impossible numbers are errors."""
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise UsageError(f"--util must be in (0, 1], got {gpu_memory_utilization}")
    model.check_tensor_parallel(tp)
    if max_model_len < 1:
        raise UsageError(f"--max-model-len must be at least 1, got {max_model_len}")
    if max_model_len > model.max_position_embeddings:
        raise UsageError(f"--max-model-len {max_model_len} exceeds the model's max_position_embeddings "
                         f"{model.max_position_embeddings}")
    if num_blocks_override is not None and num_blocks_override < 1:
        raise UsageError(f"--num-blocks must be at least 1, got {num_blocks_override}")
    if device not in DEVICES and device_memory_bytes is None:
        raise UsageError(f"unknown --device {device!r} (known: {', '.join(DEVICES)}); "
                         "or give --device-memory")
    for what, v in (("--device-memory", device_memory_bytes), ("--weights", weights_bytes),
                    ("--kv-cache-memory", kv_cache_memory_bytes)):
        if v is not None and v <= 0:
            raise UsageError(f"{what} must be positive, got {v}")
    if overhead_bytes < 0:
        raise UsageError(f"--overhead must not be negative, got {overhead_bytes}")
    dt = resolve_dtype(dtype, model)
    mem = device_memory_bytes if device_memory_bytes is not None else DEVICES[device].memory_bytes
    if weights_bytes is None:
        weights_bytes = model.weight_params_per_rank(tp) * DTYPE_BYTES[dt]
        source = f"{model.weight_params_per_rank(tp):,} parameters per rank × {DTYPE_BYTES[dt]} B ({dt}, TP {tp})"
    else:
        source = "--weights"
    d = Deployment(model=model, tp=tp, dtype=dt, max_model_len=max_model_len,
                   device=device if device_memory_bytes is None else "custom",
                   device_memory_bytes=mem, gpu_memory_utilization=gpu_memory_utilization,
                   weights_bytes=weights_bytes, weights_source=source, overhead_bytes=overhead_bytes,
                   kv_cache_memory_bytes=kv_cache_memory_bytes, kv_transfer=kv_transfer,
                   num_blocks_override=num_blocks_override)
    if d.kv_budget_bytes <= 0:
        need = d.non_kv_bytes / d.device_memory_bytes
        raise ConfigError(
            f"no memory left for the KV cache: weights {fmt_bytes(d.weights_bytes)} + overhead "
            f"{fmt_bytes(d.overhead_bytes)} exceed {gpu_memory_utilization} × "
            f"{fmt_bytes(mem)} = {fmt_bytes(int(mem * gpu_memory_utilization))}; "
            f"--util must exceed {need:.3f}, or raise --tp")
    return d
