"""The plan as data: ``kvaudit plan --save`` writes vLLM's plans to JSON, ``kvaudit audit --plan`` reads them with torch alone.

A plan file holds, per pipeline stage, the deployment (with the model's ``config.json``), and per
platform rule the plan (groups with their specs, tensors and the layers that share each, ``num_blocks``,
block size, the vLLM that made it), its capacity as vLLM computed it, and per strategy the highest
safe utilization. vLLM's own ``KVCacheConfig`` is kept as data too (each dataclass by its vLLM class
name and init fields, dtypes and enums by name); it is rebuilt into vLLM's objects only for a strategy
that needs them (upstream ``allocate_kv_cache``, a plugin written against ``KVCacheConfig``) and only
where the same vLLM can be imported.

A plan file is data, whoever wrote it: reading one executes nothing. Its vLLM objects may name only the
classes a ``KVCacheConfig`` is made of (``_kv_cache_type``: the dataclasses of
``vllm/v1/kv_cache_interface.py`` that are a ``KVCacheSpec`` or hold one, and the enums of the three modules
those classes read), checked by name when the file is read (``check_objects``), before torch or vLLM is imported; a file naming any other
class (``vllm.config:ModelConfig``, which would import code from a folder with ``trust_remote_code``) is
refused. Every other entry is checked against the type and range kvaudit wrote it with.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import enum
import functools
import importlib
import json
import types
import typing
from pathlib import Path
from typing import Any

from kvaudit import __version__
from kvaudit.errors import ConfigError, NotAuditable, UsageError
from kvaudit.jsonfile import read_json
from kvaudit.model.deployment import Deployment
from kvaudit.model.spec import ModelSpec
from kvaudit.plan.capacity import Capacity
from kvaudit.results import GroupPlan, KVPlan, PlanStage, TensorPlan
from kvaudit.units import MAX_BYTES

FORMAT = "kvaudit-plan"
FORMAT_VERSION = 1


# --- vLLM's objects as data --------------------------------------------------------------------------

def encode(obj: Any) -> Any:
    """A vLLM dataclass (``KVCacheConfig`` and what it holds) as JSON-able data."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, enum.Enum):
        return {"enum": f"{type(obj).__module__}:{type(obj).__qualname__}", "name": obj.name}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"class": f"{type(obj).__module__}:{type(obj).__qualname__}",
                "fields": {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj) if f.init}}
    if type(obj).__module__ == "torch" and type(obj).__name__ == "dtype":
        return {"dtype": str(obj).removeprefix("torch.")}
    if isinstance(obj, tuple):
        return {"tuple": [encode(x) for x in obj]}
    if isinstance(obj, list):
        return [encode(x) for x in obj]
    if isinstance(obj, dict):
        return {"items": [[encode(k), encode(v)] for k, v in obj.items()]}
    raise TypeError(f"cannot save a {type(obj).__module__}.{type(obj).__qualname__} in a plan file")


KV_CACHE_INTERFACE = "vllm.v1.kv_cache_interface"
KV_CACHE_CONTAINERS = ("KVCacheConfig", "KVCacheTensor", "KVCacheGroupSpec")
"""The classes of ``vllm/v1/kv_cache_interface.py`` that hold the specs: the plan, its tensors, its groups."""
KV_CACHE_ENUM_MODULES = (KV_CACHE_INTERFACE, "vllm.v1.kv_cache_layout", "vllm.v1.attention.backends.registry")
"""Where the enums a plan holds live: the KV-cache layout, ``MambaSpec.mamba_type``'s backend enum, the
interface's own (``KVQuantMode``, ...)."""
MAX_DEPTH = 32
"""Nesting of vLLM's objects in a plan file (a ``KVCacheConfig`` is 5 deep); deeper is not one kvaudit wrote."""


def _named(path: Any, kind: str) -> tuple[str, str]:
    """``module:Name`` split, refused unless it can name one of ``_kv_cache_type``'s classes (no import: checked
    as the file is read)."""
    module, _, name = str(path).partition(":")
    allowed = (module == KV_CACHE_INTERFACE) if kind == "class" else module in KV_CACHE_ENUM_MODULES
    if not (isinstance(path, str) and allowed and name.isidentifier()):
        raise ValueError(f"{path!r} is not one of the vLLM KV-cache interface {kind}es a plan is made of "
                         f"({KV_CACHE_INTERFACE} dataclasses and the enums of {', '.join(KV_CACHE_ENUM_MODULES)})")
    return module, name


def _kv_cache_type(path: str, kind: str) -> Any:
    """The vLLM class ``path`` names, if it is one a ``KVCacheConfig`` is made of: a dataclass defined in
    ``vllm.v1.kv_cache_interface`` that is a ``KVCacheSpec`` or one of ``KV_CACHE_CONTAINERS``, or an enum
    defined in one of ``KV_CACHE_ENUM_MODULES``. Anything else is a ``ValueError``: no other constructor runs."""
    module, name = _named(path, kind)
    mod = importlib.import_module(module)
    obj = vars(mod).get(name)
    if not isinstance(obj, type) or obj.__module__ != module:
        raise ValueError(f"{path} is not a class defined in {module}")
    if kind == "enum":
        if not issubclass(obj, enum.Enum):
            raise ValueError(f"{path} is not an enum")
        return obj
    spec = vars(mod).get("KVCacheSpec")
    if not dataclasses.is_dataclass(obj) or not (name in KV_CACHE_CONTAINERS or (spec and issubclass(obj, spec))):
        raise ValueError(f"{path} is not a KVCacheSpec, nor one of {', '.join(KV_CACHE_CONTAINERS)}")
    return obj


def check_objects(data: Any, depth: int = 0) -> None:
    """Refuse (``ValueError``) data that ``decode`` would not rebuild into KV-cache interface objects alone:
    every ``class`` and ``enum`` it names must be one of them (by name: nothing is imported), at most
    ``MAX_DEPTH`` deep."""
    if depth > MAX_DEPTH:
        raise ValueError(f"vLLM objects nested deeper than {MAX_DEPTH}")
    if isinstance(data, list):
        for x in data:
            check_objects(x, depth + 1)
        return
    if not isinstance(data, dict):
        if data is not None and not isinstance(data, (bool, int, float, str)):
            raise ValueError(f"unknown value {type(data).__name__}")
        return
    if "tuple" in data and isinstance(data["tuple"], list):
        check_objects(data["tuple"], depth + 1)
    elif "items" in data and isinstance(data["items"], list):
        for pair in data["items"]:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise ValueError("an items entry is not a [key, value] pair")
            check_objects(pair, depth + 1)
    elif "dtype" in data and isinstance(data["dtype"], str):
        pass
    elif "enum" in data and isinstance(data.get("name"), str):
        _named(data["enum"], "enum")
    elif "class" in data and isinstance(data.get("fields"), dict):
        _named(data["class"], "class")
        for value in data["fields"].values():
            check_objects(value, depth + 1)
    else:
        raise ValueError(f"unknown entry with keys {sorted(data)[:8]}")


def decode(data: Any) -> Any:
    """vLLM's objects back from ``encode``'s data: only the KV-cache interface types (``_kv_cache_type``); the
    data must have passed ``check_objects``."""
    if isinstance(data, list):
        return [decode(x) for x in data]
    if not isinstance(data, dict):
        return data
    if "tuple" in data:
        return tuple(decode(x) for x in data["tuple"])
    if "items" in data:
        return {decode(k): decode(v) for k, v in data["items"]}
    if "dtype" in data:
        import torch

        dtype = getattr(torch, data["dtype"], None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {data['dtype']!r}")
        return dtype
    if "enum" in data:
        return _kv_cache_type(data["enum"], "enum")[data["name"]]
    cls = _kv_cache_type(data["class"], "class")
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data["fields"]) - names)
    if unknown:
        raise ValueError(f"{data['class']} has no field {unknown[0]!r}")
    return cls(**{k: decode(v) for k, v in data["fields"].items()})


def vllm_objects(plan: KVPlan, who: str) -> tuple[Any, Any]:
    """vLLM's ``KVCacheConfig`` of the plan and its resolved KV-cache layout: the live objects, or, for a
    plan read from a file, rebuilt with the vLLM here, which must be the vLLM that planned (else
    ``NotAuditable`` naming why: ``who`` would not be the planner's allocation)."""
    if plan.kv_cache_config is not None and plan.vllm_config is not None:
        return plan.kv_cache_config, _layout(plan.vllm_config)
    if plan.kv_cache_config is not None:  # rebuilt before (the strategy's prepare): not again
        return plan.kv_cache_config, decode(plan.saved_vllm.get("kv_cache_layout"))
    from kvaudit.plan.planner import load_vllm, vllm_version

    here = vllm_version()
    if here is None:
        raise NotAuditable(f"{who} is vLLM's own code and vLLM is not installed here; the saved plan "
                           f"(vLLM {plan.vllm_version}) is audited by the strategies that need only torch")
    if here != plan.vllm_version:
        raise NotAuditable(f"{who} would be vLLM {here}'s code, but vLLM {plan.vllm_version} made this plan; "
                           "audit it where that vLLM is installed")
    if plan.saved_vllm is None:
        raise NotAuditable(f"{who} needs vLLM's KVCacheConfig, which this plan file does not hold")
    load_vllm()
    try:
        cfg = decode(plan.saved_vllm["kv_cache_config"])
        layout = decode(plan.saved_vllm.get("kv_cache_layout"))
    except (ValueError, TypeError, KeyError, AttributeError, ImportError, ArithmeticError, AssertionError) as e:
        raise NotAuditable(f"{who}: vLLM {here} cannot rebuild this plan's KVCacheConfig: {e}") from None
    if not type(cfg).__name__ == "KVCacheConfig" or getattr(cfg, "num_blocks", None) != plan.num_blocks:
        raise NotAuditable(f"{who}: the plan file's KVCacheConfig is not the plan it saved beside it (was it edited?)")
    object.__setattr__(plan, "kv_cache_config", cfg)
    return cfg, layout


# --- save ----------------------------------------------------------------------------------------------

def _model_dict(m: ModelSpec) -> dict:
    return {"name": m.name, "config_path": str(m.config_path), "model_type": m.model_type,
            "architecture": m.architecture, "dtype": m.dtype, "num_hidden_layers": m.num_hidden_layers,
            "max_position_embeddings": m.max_position_embeddings, "quantization": m.quantization,
            "config": dict(m.raw), "text_config": dict(m.text)}


def _deployment_dict(d: Deployment) -> dict:
    fields = {f.name: getattr(d, f.name) for f in dataclasses.fields(d) if f.name != "model"}
    return {"model": _model_dict(d.model), **fields, "overhead_terms": [t.to_dict() for t in d.overhead_terms]}


def _layout(vllm_config: Any) -> Any:
    """The KV-cache layout vLLM resolved for the plan (0.29+; ``None`` for older vLLM)."""
    get = getattr(getattr(vllm_config, "cache_config", None), "get_resolved_kv_cache_layout", None)
    return get() if get is not None else None


def _plan_dict(plan: KVPlan) -> dict:
    out = {**plan.to_dict(), "layer_specs": dict(plan.layer_specs)}
    if plan.kv_cache_config is not None:
        out["vllm_objects"] = {"kv_cache_config": encode(plan.kv_cache_config),
                               "kv_cache_layout": encode(_layout(plan.vllm_config))}
    elif plan.saved_vllm is not None:
        out["vllm_objects"] = plan.saved_vllm
    return out


def to_dict(stages: list[PlanStage], vllm_version: str | None) -> dict:
    """The plan file's content."""
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "kvaudit_version": __version__,
        "vllm_version": vllm_version,
        "stages": [{"deployment": _deployment_dict(st.deployment),
                    "plans": {name: {**_plan_dict(plan), "capacity": st.capacity[name].to_dict()}
                              for name, plan in st.plans.items()},
                    "strategies": dict(st.strategies), "highest_safe_utilization": dict(st.safe_utilization),
                    "not_planned": dict(st.refused)} for st in stages]}


def save(stages: list[PlanStage], vllm_version: str | None, path: str | Path) -> Path:
    """Write the plan file (UTF-8 JSON), atomically: a failed write leaves any earlier file whole."""
    from kvaudit import outfile

    p = Path(path).expanduser()
    try:
        outfile.write(p, json.dumps(to_dict(stages, vllm_version), indent=1) + "\n")
    except OSError as e:
        raise UsageError(f"cannot write the plan to {p}: {e.strerror or e} (a file already there is unchanged)") from None
    return p


# --- load ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SavedPlans:
    """A plan file as read: its stages and the vLLM that planned them."""

    path: Path
    vllm_version: str | None
    stages: tuple[PlanStage, ...]


class _Bad(Exception):
    """An entry of a plan file that kvaudit did not write: where it is, and what is wrong with it."""


MAX_INT = 1 << 62
"""Any count or figure in a plan file (byte figures: ``units.MAX_BYTES``)."""


def _checked(value: Any, hint: Any, where: str) -> Any:
    """``value`` as read, if it is of the type ``hint`` (the annotation of kvaudit's own dataclass field that
    wrote it: int, float, str, bool, None, Path, ``X | None``, ``tuple[X, ...]``, ``dict``, ``Mapping``)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        return _checked(value, next(a for a in args if a is not type(None)), where)
    if hint is bool:
        ok = isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and -MAX_INT <= value <= MAX_INT
    elif hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
        value = float(value) if ok else value
    elif hint is str:
        ok = isinstance(value, str)
    elif hint is Path:
        ok = isinstance(value, str)
        value = Path(value) if ok else value
    elif origin is tuple:
        if not isinstance(value, list):
            raise _Bad(f"{where} is not a list")
        return tuple(_checked(v, args[0], f"{where}[{i}]") for i, v in enumerate(value))
    elif hint is list:
        ok = isinstance(value, list)
    elif hint in (dict, typing.Mapping) or origin in (dict, collections.abc.Mapping):
        if not isinstance(value, dict):
            raise _Bad(f"{where} is not an object")
        if args:
            return {_checked(k, args[0], f"{where} key"): _checked(v, args[1], f"{where}[{k!r}]")
                    for k, v in value.items()}
        return value
    else:  # pragma: no cover - a field type this reader does not know: kvaudit's bug, not the file's
        raise TypeError(f"planfile cannot check a {hint!r} field")
    if not ok:
        raise _Bad(f"{where} is {json.dumps(value)[:40]}, not {getattr(hint, '__name__', hint)}")
    return value


def _fields(cls: type, data: Any, where: str, keys: dict[str, str] | None = None, skip: tuple[str, ...] = (),
            extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """The init fields of kvaudit's dataclass ``cls`` from the object ``data`` (``keys``: field -> the key the
    file holds it under), each checked against the field's declared type; ``skip``: fields read apart;
    ``extra``: keys the file may hold besides (derived figures kvaudit writes for people)."""
    if not isinstance(data, dict):
        raise _Bad(f"{where} is not an object")
    keys = keys or {}
    hints = _hints(cls)
    fields = [f for f in dataclasses.fields(cls) if f.init and f.name not in skip]
    known = {keys.get(f.name, f.name) for f in fields} | set(skip) | set(extra)
    unknown = sorted(set(data) - known - {keys.get(s, s) for s in skip})
    if unknown:
        raise _Bad(f"{where} has an unknown entry {unknown[0]!r}")
    out = {}
    for f in fields:
        key = keys.get(f.name, f.name)
        if key in data:
            out[f.name] = _checked(data[key], hints[f.name], f"{where}.{key}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _Bad(f"{where} has no {key!r}")
    return out


@functools.lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    """The declared field types of one of kvaudit's dataclasses (resolved once: a plan holds thousands of rows)."""
    return typing.get_type_hints(cls)


def _at_least(where: str, value: int, least: int = 0, most: int = MAX_INT) -> None:
    if not least <= value <= most:
        raise _Bad(f"{where} is {value:,}, not in [{least:,}, {most:,}]")


def _model(d: Any, where: str) -> ModelSpec:
    from kvaudit.model.spec import check_config

    f = _fields(ModelSpec, d, where, keys={"raw": "config", "text": "text_config"})
    try:
        f["text"] = dict(check_config(f["raw"], f"{where}.config"))
    except ConfigError as e:
        raise _Bad(e.message) from None
    return ModelSpec(**f)


def _deployment(d: Any, where: str) -> Deployment:
    from kvaudit.model.deployment import check_deployment

    from kvaudit.model.memory import TITLES, Term

    f = _fields(Deployment, d, where, skip=("model", "overhead_terms"))
    if not isinstance(d, dict) or "model" not in d:
        raise _Bad(f"{where} has no 'model'")
    terms = []
    for i, t in enumerate(_checked(d.get("overhead_terms", []), list, f"{where}.overhead_terms")):
        term = Term(**_fields(Term, t, f"{where}.overhead_terms[{i}]"))
        if term.key not in TITLES:
            raise _Bad(f"{where}.overhead_terms[{i}].key {term.key!r} is not a non-KV term ({', '.join(TITLES)})")
        _at_least(f"{where}.overhead_terms[{i}].bytes", term.bytes, 0, MAX_BYTES)
        terms.append(term)
    dep = Deployment(model=_model(d["model"], f"{where}.model"), **f, overhead_terms=tuple(terms))
    if dep.overhead_bytes != sum(t.bytes for t in terms if t.budgeted) and terms:
        raise _Bad(f"{where}.overhead_bytes is not the sum of its budgeted overhead_terms")
    try:
        check_deployment(dep)
    except UsageError as e:
        raise _Bad(f"{where}: {e.message}") from None
    return dep


def _plan(name: str, d: Any, where: str) -> KVPlan:
    from kvaudit.plan.planner import PLATFORMS

    groups = tuple(GroupPlan(**_fields(GroupPlan, g, f"{where}.groups[{i}]",
                                       keys={"spec_type": "spec", "layer_names": "layers"}))
                   for i, g in enumerate(_checked(d.get("groups") if isinstance(d, dict) else None, list, f"{where}.groups")))
    tensors = tuple(TensorPlan(**_fields(TensorPlan, t, f"{where}.tensors[{i}]", keys={"size": "size_bytes"},
                                         extra=("index",)))
                    for i, t in enumerate(_checked(d.get("tensors"), list, f"{where}.tensors")))
    f = _fields(KVPlan, d, where, skip=("groups", "tensors", "saved_vllm"), extra=("capacity", "vllm_objects"))
    plan = KVPlan(**f, groups=groups, tensors=tensors, saved_vllm=d.get("vllm_objects"))
    if plan.platform not in PLATFORMS:
        raise _Bad(f"{where}.platform {plan.platform!r} is not a platform rule ({', '.join(PLATFORMS)})")
    if plan.plan_format not in ("shared_by", "layers"):
        raise _Bad(f"{where}.plan_format {plan.plan_format!r} is neither shared_by nor layers")
    if plan.name != name:
        raise _Bad(f"{where} is saved as {name!r} but is the plan {plan.name!r}")
    _at_least(f"{where}.block_size", plan.block_size, 1, 1 << 30)
    _at_least(f"{where}.num_blocks", plan.num_blocks, 1, 1 << 40)
    for key in ("kv_budget_bytes", "planned_bytes"):
        _at_least(f"{where}.{key}", getattr(plan, key), 0, MAX_BYTES)
    if not groups or not tensors:
        raise _Bad(f"{where} has no {'groups' if not groups else 'tensors'}")
    in_groups: set[str] = set()
    for i, g in enumerate(groups):
        _at_least(f"{where}.groups[{i}].index", g.index, i, i)
        _at_least(f"{where}.groups[{i}].block_size", g.block_size, 1, 1 << 30)
        _at_least(f"{where}.groups[{i}].page_size_bytes", g.page_size_bytes, 1, MAX_BYTES)
        if not g.layer_names or in_groups & set(g.layer_names):
            raise _Bad(f"{where}.groups[{i}] has no layers, or a layer of another group")
        in_groups |= set(g.layer_names)
    in_tensors: set[str] = set()
    for i, t in enumerate(tensors):
        _at_least(f"{where}.tensors[{i}].size_bytes", t.size, 0, MAX_BYTES)
        if not t.shared_by or not set(t.shared_by) <= in_groups:
            raise _Bad(f"{where}.tensors[{i}] is shared by no layer, or by a layer of no group")
        in_tensors |= set(t.shared_by)
    if in_groups - in_tensors:
        raise _Bad(f"{where}: layer {sorted(in_groups - in_tensors)[0]!r} is in no tensor")
    if plan.saved_vllm is not None:
        if not (isinstance(plan.saved_vllm, dict) and "kv_cache_config" in plan.saved_vllm
                and set(plan.saved_vllm) <= {"kv_cache_config", "kv_cache_layout"}):
            raise _Bad(f"{where}.vllm_objects is not kv_cache_config and kv_cache_layout")
        try:
            for value in plan.saved_vllm.values():
                check_objects(value)
        except ValueError as e:
            raise _Bad(f"{where}.vllm_objects: {e}") from None
    return plan


def _capacity(d: Any, where: str) -> Capacity:
    cap = Capacity(**_fields(Capacity, d, where, extra=("mamba_slots_short",)))
    for key in ("tokens", "max_model_len", "pool_tokens", "max_num_seqs", "kv_cache_memory_bytes"):
        _at_least(f"{where}.{key}", getattr(cap, key))
    return cap


def _stage(st: Any, where: str) -> PlanStage:
    if not isinstance(st, dict):
        raise _Bad(f"{where} is not an object")
    keys = ("deployment", "plans", "strategies", "highest_safe_utilization", "not_planned")
    unknown = sorted(set(st) - set(keys))
    if unknown:
        raise _Bad(f"{where} has an unknown entry {unknown[0]!r}")
    for key in keys:
        if key not in st:
            raise _Bad(f"{where} has no {key!r}")
    deployment = _deployment(st["deployment"], f"{where}.deployment")
    plans_data = _checked(st.get("plans"), dict, f"{where}.plans")
    plans = {name: _plan(name, pd, f"{where}.plans[{name!r}]") for name, pd in plans_data.items()}
    capacity = {name: _capacity(pd.get("capacity"), f"{where}.plans[{name!r}].capacity")
                for name, pd in plans_data.items()}
    strategies = _checked(st.get("strategies"), dict[str, str], f"{where}.strategies")
    for s, name in strategies.items():
        if name not in plans:
            raise _Bad(f"{where}.strategies[{s!r}] names no saved plan ({name!r})")
    safe = _checked(st.get("highest_safe_utilization"), dict[str, float | None], f"{where}.highest_safe_utilization")
    for s, u in safe.items():
        if u is not None and not 0.0 <= u <= 1.0:
            raise _Bad(f"{where}.highest_safe_utilization[{s!r}] is {u}, not in [0, 1]")
    return PlanStage(deployment=deployment, plans=plans,
                     capacity=capacity, strategies=strategies, safe_utilization=safe,
                     refused=_checked(st.get("not_planned"), dict[str, str], f"{where}.not_planned"))


def load(path: str | Path) -> SavedPlans:
    """Read a plan file: every entry checked, as data (nothing is imported or run); anything that is not a
    plan file kvaudit wrote is a one-line ``ConfigError`` (exit 2)."""
    p = Path(path).expanduser()
    doc = read_json(path, "kvaudit plan file", "write one with: kvaudit plan --preset MODEL --save FILE")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{p} is not a kvaudit plan file (write one with: kvaudit plan --preset MODEL "
                          f"--save {p.name})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"{p} is plan format {json.dumps(doc.get('format_version'))[:20]}; this kvaudit reads "
                          f"format {FORMAT_VERSION} (save the plan again with this kvaudit)")
    try:
        version = _checked(doc.get("vllm_version"), str | None, "vllm_version")
        stages = tuple(_stage(st, f"stages[{i}]") for i, st in enumerate(_checked(doc.get("stages"), list, "stages")))
        ranks = [st.deployment.pp_rank for st in stages]
        if len(set(ranks)) != len(ranks):
            raise _Bad(f"two stages of pipeline rank {sorted(ranks)}")
    except _Bad as e:
        raise ConfigError(f"{p}: not a plan file kvaudit wrote: {e} (was it edited? plan again with: kvaudit plan "
                          "... --save)") from None
    if not stages:
        raise ConfigError(f"{p} holds no plan")
    return SavedPlans(path=p, vllm_version=version, stages=stages)


def plan_for(stage: PlanStage, strategy: Any, path: Path) -> KVPlan:
    """The stage's plan for ``strategy`` (the one saved for it, else its platform rule's); a rule the file
    was not saved with is ``NotAuditable`` (that strategy is skipped with the reason)."""
    name = stage.strategies.get(strategy.name, strategy.platform)
    if name in stage.plans:
        return stage.plans[name]
    why = stage.refused.get(strategy.name)
    if why:
        raise NotAuditable(why)
    raise NotAuditable(f"{path.name} holds no plan under the {strategy.platform} block-size rule that "
                       f"{strategy.name} needs (saved: {', '.join(stage.plans)}); save it with "
                       f"kvaudit plan ... --strategy {strategy.name} --save")
