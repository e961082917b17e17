"""Storage accounting: record the storages a strategy creates, in order, and attribute their bytes
to layers by the byte ranges the layers' views cover. Works on every device, ``meta`` included."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Iterable

os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")  # a broken torch_npu must not break torch

import torch  # noqa: E402
from torch.multiprocessing.reductions import StorageWeakRef  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_leaves  # noqa: E402


def storage_key(t: torch.Tensor) -> int:
    """Identity of a live tensor's storage (the StorageImpl address): equal for views and aliases.

    ``data_ptr()`` is 0 for every meta tensor, so it cannot tell storages apart there.
    """
    return t.untyped_storage()._cdata


@dataclass
class StorageEvent:
    """One storage the strategy created, in creation order."""

    key: int
    nbytes: int
    ref: Any = field(repr=False)

    @property
    def alive(self) -> bool:
        """Whether the storage still exists."""
        return not self.ref.expired()


class StorageRecorder(TorchDispatchMode):
    """A dispatch mode that notes every new non-empty storage any op returns, with its size, in
    order. Views and aliases come back with a storage already seen and are not counted again.
    """

    def __init__(self) -> None:
        super().__init__()
        self.events: list[StorageEvent] = []
        self._by_key: dict[int, StorageEvent] = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: D105
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._note(t)
        return out

    def _note(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        if st.nbytes() == 0:
            return
        key = st._cdata
        seen = self._by_key.get(key)
        if seen is not None and seen.alive:
            return
        ev = StorageEvent(key, st.nbytes(), StorageWeakRef(st))
        self._by_key[key] = ev
        self.events.append(ev)
        self.peak = max(self.peak, self.live_bytes())

    def live_bytes(self) -> int:
        """Bytes of the recorded storages that are still alive."""
        return sum(e.nbytes for e in self.events if e.alive)


def _tensors(value: Any) -> Iterable[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for v in value:
            yield from _tensors(v)


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """``[start, end)`` bytes of the storage that tensor ``t`` can address."""
    es = t.element_size()
    start = t.storage_offset() * es
    if t.numel() == 0:
        return start, start
    extent = sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1
    return start, start + extent * es


@dataclass(frozen=True)
class Attribution:
    """How the bytes of the storages behind a strategy's tensors fall on its layers."""

    layer_bytes: dict[str, Fraction]
    """Each storage byte split equally among the layers whose views cover it; bytes no view
    covers (alignment padding) split equally among the layers that use the storage."""
    layer_storages: dict[str, frozenset[int]]
    shares_with: dict[str, frozenset[str]]
    """Layers whose views overlap this layer's bytes."""
    storage_bytes: dict[int, int]
    storage_padding: dict[int, int]
    storage_layers: dict[int, tuple[str, ...]]

    @property
    def total_bytes(self) -> int:
        """Bytes of every storage a layer's tensors live in, each counted once."""
        return sum(self.storage_bytes.values())


def attribute(raw: dict[str, Any]) -> Attribution:
    """Attribute the storages behind ``raw`` (layer -> tensor or tuple of tensors) to layers."""
    spans: dict[int, list[tuple[int, int, str]]] = {}
    sizes: dict[int, int] = {}
    layer_storages: dict[str, set[int]] = {}
    for layer, value in raw.items():
        layer_storages.setdefault(layer, set())
        for t in _tensors(value):
            key = storage_key(t)
            sizes[key] = t.untyped_storage().nbytes()
            start, end = byte_span(t)
            spans.setdefault(key, []).append((start, end, layer))
            layer_storages[layer].add(key)
    layer_bytes: dict[str, Fraction] = {layer: Fraction(0) for layer in raw}
    shares: dict[str, set[str]] = {layer: set() for layer in raw}
    padding: dict[int, int] = {}
    storage_layers: dict[int, tuple[str, ...]] = {}
    for key, items in spans.items():
        users = tuple(dict.fromkeys(layer for _, _, layer in items))
        storage_layers[key] = users
        cuts = sorted({0, sizes[key]} | {p for s, e, _ in items for p in (s, e)})
        uncovered = 0
        for lo, hi in zip(cuts, cuts[1:]):
            if hi <= lo:
                continue
            covering = {layer for s, e, layer in items if s <= lo and hi <= e}
            if not covering:
                uncovered += hi - lo
                continue
            share = Fraction(hi - lo, len(covering))
            for layer in covering:
                layer_bytes[layer] += share
                shares[layer] |= covering - {layer}
        padding[key] = uncovered
        for layer in users:
            layer_bytes[layer] += Fraction(uncovered, len(users))
    return Attribution(
        layer_bytes=layer_bytes, layer_storages={k: frozenset(v) for k, v in layer_storages.items()},
        shares_with={k: frozenset(v) for k, v in shares.items()}, storage_bytes=sizes,
        storage_padding=padding, storage_layers=storage_layers)
