"""Extracting and running a runner's allocation method from source, on a tiny source tree."""

from __future__ import annotations

import tarfile
from types import SimpleNamespace

import pytest
import torch

from kvaudit.errors import StrategyFailed
from kvaudit.strategies.runner_code import SourceTree, extract_allocator

RUNNER = '''
import torch
from fakepkg.utils import half
from fakepkg.missing_module import never_used
from vllm.v1.kv_cache_interface import MambaSpec

ALIGN = 2


class Runner:
    def _allocate_kv_cache_tensors(self, kv_cache_config: "KVCacheConfig") -> dict:
        raw = {}
        for t in kv_cache_config.kv_cache_tensors:
            buf = self._new(half(t.size * 2))
            for name in t.shared_by:
                raw[name] = buf
        return raw

    def _new(self, n):
        return torch.zeros(n, dtype=torch.int8, device=self.device)

    def unrelated(self):
        import torch_npu  # never compiled: not called by the allocation
'''
UTILS = '''
def half(n):
    return _floor_div(n, 2)


def _floor_div(a, b):
    return a // b
'''
OLD_STYLE = '''
import torch


class Runner:
    def initialize_kv_cache_tensors(self, kv_cache_config):
        kv_cache_raw_tensors = {}
        for kv_cache_tensor in kv_cache_config.kv_cache_tensors:
            for name in kv_cache_tensor.shared_by:
                kv_cache_raw_tensors[name] = torch.zeros(kv_cache_tensor.size, dtype=torch.int8,
                                                         device=self.device)
        assert set(kv_cache_raw_tensors) == {"a", "b"}, "Some layers are not correctly initialized"
        kv_caches = self.reshape(kv_cache_raw_tensors)  # the reshape step must not run
        return kv_caches
'''


def _tree(tmp_path, runner: str, utils: str = UTILS, as_tarball: bool = False) -> SourceTree:
    pkg = tmp_path / "src" / "fakepkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "runner.py").write_text(runner)
    (pkg / "utils.py").write_text(utils)
    if not as_tarball:
        return SourceTree("fakepkg 1.0", root=tmp_path / "src")
    tarball = tmp_path / "fakepkg-1.0.tar.gz"
    with tarfile.open(tarball, "w:gz") as tf:
        tf.add(tmp_path / "src", arcname="fakepkg-1.0")
    return SourceTree("fakepkg 1.0", tarball=tarball)


def _config():
    return SimpleNamespace(kv_cache_tensors=[SimpleNamespace(size=64, shared_by=["a", "b"])])


@pytest.mark.parametrize("as_tarball", [False, True])
def test_method_helpers_and_tree_functions_run_unchanged(tmp_path, as_tarball):
    code = extract_allocator(_tree(tmp_path, RUNNER, as_tarball=as_tarball), "fakepkg.runner", "Runner")
    assert code.method == "Runner._allocate_kv_cache_tensors"
    assert set(code.functions) == {"_allocate_kv_cache_tensors", "_new"}
    assert code.helpers == ("fakepkg.utils._floor_div", "fakepkg.utils.half")
    raw = code.call(_config(), {"device": torch.device("meta")})
    assert raw["a"] is raw["b"] and raw["a"].numel() == 64


def test_an_attribute_the_stand_in_lacks_is_named(tmp_path):
    code = extract_allocator(_tree(tmp_path, RUNNER), "fakepkg.runner", "Runner")
    with pytest.raises(StrategyFailed, match=r"fakepkg 1.0's Runner._allocate_kv_cache_tensors reads self.device"):
        code.call(_config(), {})


def test_nested_attributes_are_named_with_their_path(tmp_path):
    src = RUNNER.replace("device=self.device", "device=self.config.device")
    code = extract_allocator(_tree(tmp_path, src), "fakepkg.runner", "Runner")
    with pytest.raises(StrategyFailed, match=r"reads self.config.device"):
        code.call(_config(), {"config": {"dtype": None}})


def test_a_missing_name_fails_only_when_used(tmp_path):
    src = RUNNER.replace("buf = self._new(", "never_used()\n            buf = self._new(")
    code = extract_allocator(_tree(tmp_path, src), "fakepkg.runner", "Runner")
    with pytest.raises(StrategyFailed, match="uses never_used .from fakepkg.missing_module"):
        code.call(_config(), {"device": torch.device("meta")})


def test_an_unknown_signature_is_refused(tmp_path):
    src = RUNNER.replace("(self, kv_cache_config: \"KVCacheConfig\")", "(self, kv_cache_config, num_blocks)")
    with pytest.raises(StrategyFailed, match=r"signature kvaudit does not know"):
        extract_allocator(_tree(tmp_path, src), "fakepkg.runner", "Runner")


def test_no_allocation_method(tmp_path):
    with pytest.raises(StrategyFailed, match="neither _allocate_kv_cache_tensors nor initialize_kv_cache_tensors"):
        extract_allocator(_tree(tmp_path, "class Runner:\n    pass\n"), "fakepkg.runner", "Runner")
    with pytest.raises(StrategyFailed, match="defines no class Other"):
        extract_allocator(_tree(tmp_path / "x", RUNNER), "fakepkg.runner", "Other")


def test_old_releases_run_only_the_allocation_loop(tmp_path):
    code = extract_allocator(_tree(tmp_path, OLD_STYLE), "fakepkg.runner", "Runner")
    assert code.method == "Runner.initialize_kv_cache_tensors (its allocation loop)"
    raw = code.call(_config(), {"device": torch.device("meta")})  # self.reshape is never reached
    assert set(raw) == {"a", "b"} and raw["a"] is not raw["b"]


def test_extracted_code_keeps_its_source_lines_in_tracebacks(tmp_path):
    src = RUNNER.replace("return raw\n", "raise ValueError('boom')\n")
    code = extract_allocator(_tree(tmp_path, src), "fakepkg.runner", "Runner")
    with pytest.raises(ValueError) as e:
        code.call(_config(), {"device": torch.device("meta")})
    frame = e.traceback[-1]
    assert str(frame.path).startswith("fakepkg 1.0:fakepkg/runner.py") and frame.lineno + 1 == 17


PROFILED_RUNNER = '''
import torch
from fakepkg.utils import Capability, current_profile


class Runner:
    def _allocate_kv_cache_tensors(self, kv_cache_config):
        raw = {}
        for t in kv_cache_config.kv_cache_tensors:
            wide = current_profile().supports(Capability.WIDE)
            buf = torch.zeros(t.size * (2 if wide else 1), dtype=torch.int8, device=self.device)
            for name in t.shared_by:
                raw[name] = buf
        return raw
'''
PROFILES = '''
from dataclasses import dataclass
from enum import Enum, auto
from types import MappingProxyType


class Kind(Enum):
    SMALL = 0
    BIG = 1


class Capability(Enum):
    WIDE = auto()


@dataclass(frozen=True, slots=True)
class Profile:
    kind: Kind
    capabilities: frozenset[Capability]

    def supports(self, capability: Capability) -> bool:
        return capability in self.capabilities


def _kind_from_build_info() -> Kind:
    from fakepkg import _build_info

    return Kind[getattr(_build_info, "__kind__", "SMALL")]


_PROFILES = MappingProxyType({Kind.SMALL: Profile(Kind.SMALL, frozenset()),
                              Kind.BIG: Profile(Kind.BIG, frozenset({Capability.WIDE}))})
_CURRENT_PROFILE = _PROFILES[_kind_from_build_info()]


def current_profile() -> Profile:
    return _CURRENT_PROFILE
'''


@pytest.mark.parametrize("kind, size", [("SMALL", 64), ("BIG", 128)])
def test_a_module_level_value_is_computed_as_its_import_computes_it(tmp_path, kind, size):
    """vllm-ascend 0.27-0.28 read a module-level value computed at import (``device/hardware_profile.py``'s
    ``_CURRENT_HARDWARE_PROFILE``, a frozen dataclass picked by the device type in ``_build_info``): kvaudit
    computes it from the tree, with the known modules (what the build writes) served while it does."""
    code = extract_allocator(_tree(tmp_path, PROFILED_RUNNER, PROFILES), "fakepkg.runner", "Runner",
                             {"fakepkg._build_info": {"__kind__": kind}})
    assert {"fakepkg.utils._PROFILES", "fakepkg.utils._CURRENT_PROFILE", "fakepkg.utils.Profile"} <= set(code.helpers)
    raw = code.call(_config(), {"device": torch.device("meta")})
    assert raw["a"] is raw["b"] and raw["a"].numel() == size


def test_a_module_level_value_that_cannot_be_computed_is_named_when_used(tmp_path):
    """Without the module its build writes, the value stays a placeholder: the audit stops naming it."""
    code = extract_allocator(_tree(tmp_path, PROFILED_RUNNER, PROFILES), "fakepkg.runner", "Runner")
    with pytest.raises(StrategyFailed, match=r"uses _CURRENT_PROFILE \(from fakepkg.utils\)"):
        code.call(_config(), {"device": torch.device("meta")})


def test_a_module_level_value_rebound_at_run_time_is_not_computed(tmp_path):
    """A name a function rebinds (``global``) holds at run time what no import-time expression says."""
    utils = PROFILES + "\n\ndef reset():\n    global _CURRENT_PROFILE\n    _CURRENT_PROFILE = None\n"
    code = extract_allocator(_tree(tmp_path, PROFILED_RUNNER, utils), "fakepkg.runner", "Runner",
                             {"fakepkg._build_info": {"__kind__": "BIG"}})
    with pytest.raises(StrategyFailed, match=r"uses _CURRENT_PROFILE \(from fakepkg.utils\)"):
        code.call(_config(), {"device": torch.device("meta")})
