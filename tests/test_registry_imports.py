"""Every model file vLLM's registry names for text generation (and the multimodal ones) imports under kvaudit's
lean install and set-up: a model file that cannot import here is a family kvaudit cannot plan, whatever its
config. A new gap (a package the lean requirements lack, a platform question with no stand-in) fails this test;
the gaps that stay are documented below with their reason."""

from __future__ import annotations

import importlib
import os
import time

import pytest

from conftest import VLLM_VERSION, each_vllm

pytestmark = [each_vllm, pytest.mark.skipif(VLLM_VERSION is None, reason="vLLM is not installed (a device host)")]

_TORCHAUDIO = ("torchaudio: vLLM's pin (2.11.0) is a CUDA wheel whose C extension does not load beside the CPU torch "
               "2.13, and transformers imports torchaudio eagerly wherever it is installed, so installing it breaks "
               "every import; these speech models (ASR, not text generation) stay out")

KNOWN_UNLOADABLE: dict[str, str] = {
    "cohere_asr": _TORCHAUDIO,
    "funasr": _TORCHAUDIO,
    "midashenglm": _TORCHAUDIO,
}
"""Registry modules (as the registry names them) that cannot import under kvaudit's set-up, and why."""

if VLLM_VERSION == "0.33.0":
    KNOWN_UNLOADABLE["vllm.models.dots3_note"] = (
        "Dots3Note's NVIDIA implementation imports vllm.vllm_flash_attn (CUDA extensions _vllm_fa2_C/_vllm_fa3_C) "
        "and fa_utils' CUDA-only compile_flash_attn_varlen_func_from_specs at its top; standing in for vLLM's "
        "FlashAttention package itself is beyond a platform answer")
if VLLM_VERSION == "0.23.0":
    _PIXTRAL = ("vLLM 0.23.0's pixtral.py imports PixtralRotaryEmbedding from transformers' modeling_pixtral, which "
                "transformers 5.24.0 (this lean install's pin; vLLM 0.23.0 sets no upper bound) no longer has")
    for _module in ("pixtral", "mistral3", "llava", "llava_next", "llava_next_video", "llava_onevision", "bee",
                    "granite4_vision", "lightonocr", "minimax_vl_01", "phi4siglip", "rvl", "tarsier"):
        KNOWN_UNLOADABLE[_module] = _PIXTRAL


def _registry_classes() -> dict[str, set[str]]:
    """{module as the registry names it: the classes it names there}."""
    from vllm.model_executor.models import registry

    out: dict[str, set[str]] = {}
    for table in (registry._TEXT_GENERATION_MODELS, getattr(registry, "_MULTIMODAL_MODELS", {})):
        for module, cls in table.values():
            out.setdefault(module, set()).add(cls)
    return out


def _module_name(module: str) -> str:
    from vllm.model_executor.models import registry

    resolve = getattr(registry, "_resolve_module_name", None)
    if resolve is not None:
        return resolve(module)
    return module if module.startswith("vllm.") else f"vllm.model_executor.models.{module}"


def unloadable() -> dict[str, str]:
    """{registry module: the first line of the exception} for each module (or class it names) that cannot load:
    imported, and each class looked up (packages such as ``vllm.models.kimi_k3`` load their classes lazily)."""
    os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
    from kvaudit.model import vllm_model
    from kvaudit.plan.planner import load_vllm

    load_vllm()
    failed: dict[str, str] = {}
    with vllm_model.stand_ins():
        for module, classes in sorted(_registry_classes().items()):
            try:
                loaded = importlib.import_module(_module_name(module))
                for cls in sorted(classes):
                    getattr(loaded, cls)
            except Exception as e:  # noqa: BLE001 - every failure is a finding
                failed[module] = f"{type(e).__name__}: " + ((str(e).strip().splitlines() or [""])[0][:240])
    return failed


def test_every_registry_model_file_loads_under_kvaudits_set_up():
    start = time.monotonic()
    failed = unloadable()
    took = time.monotonic() - start
    print(f"\nvLLM {VLLM_VERSION}: {len(_registry_classes())} registry modules, {len(failed)} cannot load "
          f"({took:.1f} s)")
    for module, error in failed.items():
        print(f"  {module}: {error}" + ("" if module in KNOWN_UNLOADABLE else "   <- NEW"))
    for module in sorted(set(KNOWN_UNLOADABLE) - set(failed)):
        print(f"  {module}: loads now; its KNOWN_UNLOADABLE entry can go")
    new = {m: e for m, e in failed.items() if m not in KNOWN_UNLOADABLE}
    assert not new, f"registry modules that cannot load under kvaudit's set-up: {new}"


def test_known_unloadable_names_registry_modules():
    """A stale name (a module the registry no longer lists) would hide nothing; keep the list honest."""
    assert set(KNOWN_UNLOADABLE) <= set(_registry_classes())
