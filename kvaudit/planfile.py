"""The plan as data: ``kvaudit plan --save`` writes vLLM's plans to JSON, ``kvaudit audit --plan`` reads them with torch alone.

A plan file holds, per pipeline stage, the deployment (with the model's ``config.json``), and per
platform rule the plan (groups with their specs, tensors and the layers that share each, ``num_blocks``,
block size, the vLLM that made it), its capacity as vLLM computed it, and per strategy the highest
safe utilization. vLLM's own ``KVCacheConfig`` is kept as data too (each dataclass by its vLLM class
name and init fields, dtypes and enums by name); it is rebuilt into vLLM's objects only for a strategy
that needs them (upstream ``allocate_kv_cache``, a plugin written against ``KVCacheConfig``) and only
where the same vLLM can be imported. Nothing in a plan file is executed: classes are looked up only
under ``vllm.``, and must be dataclasses or enums.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import json
from pathlib import Path
from typing import Any

from kvaudit import __version__
from kvaudit.capacity import Capacity
from kvaudit.deployment import Deployment
from kvaudit.errors import ConfigError, NotAuditable, UsageError
from kvaudit.jsonfile import read_json
from kvaudit.results import GroupPlan, KVPlan, PlanStage, TensorPlan
from kvaudit.spec import ModelSpec

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


def _vllm_class(path: str) -> Any:
    module, _, qualname = path.partition(":")
    if module != "vllm" and not module.startswith("vllm."):
        raise ValueError(f"{path} is not one of vLLM's classes")
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def decode(data: Any) -> Any:
    """vLLM's objects back from ``encode``'s data (imports the vLLM modules named; vLLM's classes only)."""
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

        dtype = getattr(torch, str(data["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"unknown torch dtype {data['dtype']!r}")
        return dtype
    if "enum" in data:
        cls = _vllm_class(data["enum"])
        if not (isinstance(cls, type) and issubclass(cls, enum.Enum)):
            raise ValueError(f"{data['enum']} is not an enum")
        return cls[data["name"]]
    if "class" in data:
        cls = _vllm_class(data["class"])
        if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
            raise ValueError(f"{data['class']} is not a dataclass")
        return cls(**{k: decode(v) for k, v in data["fields"].items()})
    raise ValueError(f"unknown entry with keys {sorted(data)}")


def vllm_objects(plan: KVPlan, who: str) -> tuple[Any, Any]:
    """vLLM's ``KVCacheConfig`` of the plan and its resolved KV-cache layout: the live objects, or, for a
    plan read from a file, rebuilt with the vLLM here, which must be the vLLM that planned (else
    ``NotAuditable`` naming why: ``who`` would not be the planner's allocation)."""
    if plan.kv_cache_config is not None and plan.vllm_config is not None:
        return plan.kv_cache_config, _layout(plan.vllm_config)
    if plan.kv_cache_config is not None:  # rebuilt before (the strategy's prepare): not again
        return plan.kv_cache_config, decode(plan.saved_vllm.get("kv_cache_layout"))
    from kvaudit.plan import load_vllm, vllm_version

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
    except (ValueError, TypeError, KeyError, AttributeError, ImportError) as e:
        raise NotAuditable(f"{who}: vLLM {here} cannot rebuild this plan's KVCacheConfig: {e}") from None
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
    return {"model": _model_dict(d.model), **fields}


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
    """Write the plan file (UTF-8 JSON)."""
    p = Path(path).expanduser()
    try:
        p.write_text(json.dumps(to_dict(stages, vllm_version), indent=1) + "\n", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write the plan to {p}: {e.strerror or e}") from None
    return p


# --- load ----------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class SavedPlans:
    """A plan file as read: its stages and the vLLM that planned them."""

    path: Path
    vllm_version: str | None
    stages: tuple[PlanStage, ...]


def _model(d: dict) -> ModelSpec:
    return ModelSpec(name=d["name"], config_path=Path(d["config_path"]), model_type=d["model_type"],
                     architecture=d["architecture"], dtype=d["dtype"], num_hidden_layers=d["num_hidden_layers"],
                     max_position_embeddings=d["max_position_embeddings"], quantization=d["quantization"],
                     raw=d["config"], text=d["text_config"])


def _deployment(d: dict) -> Deployment:
    names = {f.name for f in dataclasses.fields(Deployment)}
    unknown = sorted(set(d) - names)
    if unknown:
        raise KeyError(unknown[0])
    return Deployment(**{**{k: v for k, v in d.items() if k != "model"}, "model": _model(d["model"])})


def _plan(d: dict) -> KVPlan:
    return KVPlan(
        vllm_version=d["vllm_version"], platform=d["platform"], block_size=d["block_size"],
        num_blocks=d["num_blocks"], kv_budget_bytes=d["kv_budget_bytes"], plan_format=d["plan_format"],
        planned_bytes=d["planned_bytes"], interleaved=d["interleaved"],
        groups=tuple(GroupPlan(index=g["index"], spec_type=g["spec"], block_size=g["block_size"],
                               page_size_bytes=g["page_size_bytes"], layer_names=tuple(g["layers"]))
                     for g in d["groups"]),
        tensors=tuple(TensorPlan(size=t["size_bytes"], shared_by=tuple(t["shared_by"])) for t in d["tensors"]),
        layer_specs=dict(d["layer_specs"]), saved_vllm=d.get("vllm_objects"), kv_budget_by=d.get("kv_budget_by", ""))


def _capacity(d: dict) -> Capacity:
    return Capacity(**{f.name: d[f.name] for f in dataclasses.fields(Capacity)})


def load(path: str | Path) -> SavedPlans:
    """Read a plan file; anything that is not one is a one-line ``ConfigError`` (exit 2)."""
    p = Path(path).expanduser()
    doc = read_json(path, "kvaudit plan file", "write one with: kvaudit plan --preset MODEL --save FILE")
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ConfigError(f"{p} is not a kvaudit plan file (write one with: kvaudit plan --preset MODEL "
                          f"--save {p.name})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise ConfigError(f"{p} is plan format {doc.get('format_version')!r}; this kvaudit reads format "
                          f"{FORMAT_VERSION} (save the plan again with this kvaudit)")
    try:
        stages = []
        for st in doc["stages"]:
            plans = {name: _plan(pd) for name, pd in st["plans"].items()}
            stages.append(PlanStage(
                deployment=_deployment(st["deployment"]), plans=plans,
                capacity={name: _capacity(pd["capacity"]) for name, pd in st["plans"].items()},
                strategies=dict(st["strategies"]), safe_utilization=dict(st["highest_safe_utilization"]),
                refused=dict(st["not_planned"])))
    except KeyError as e:
        raise ConfigError(f"{p}: plan file entry {e.args[0]!r} is missing or unknown (was it edited?)") from None
    except (TypeError, AttributeError, ValueError) as e:
        raise ConfigError(f"{p}: malformed plan file ({e})") from None
    if not stages:
        raise ConfigError(f"{p} holds no plan")
    return SavedPlans(path=p, vllm_version=doc.get("vllm_version"), stages=tuple(stages))


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
