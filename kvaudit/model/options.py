"""The deployment options under vLLM's flag names, declared once: the command line, policy files and the
pytest plugin all take them (``kvaudit.plan.planner.deploy`` turns them into a deployment)."""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from dataclasses import dataclass
from enum import Enum
from typing import Annotated, Any, Optional

from kvaudit.model.deployment import DEVICES
from kvaudit.model.memory import default_utilization_text

@dataclass(frozen=True)
class Opt:
    """One command-line option, declared once and shared by every command that takes it."""

    name: str
    """The attribute the command body reads (``a.util``)."""
    type: Any
    default: Any
    decls: tuple[str, ...]
    help: str
    panel: str = "Options"
    argument: bool = False
    """A positional argument rather than an option."""

    def parameter(self) -> inspect.Parameter:
        """The typed parameter typer builds the option from."""
        import typer

        info = (typer.Argument(help=self.help, show_default=False, metavar=self.name.upper()) if self.argument else
                typer.Option(*self.decls, help=self.help, rich_help_panel=self.panel, metavar=self.metavar(),
                             show_default=self.default not in (None, False, [])))
        return inspect.Parameter(self.name, inspect.Parameter.KEYWORD_ONLY, default=self.default,
                                 annotation=Annotated[self.type, info])

    def metavar(self) -> str | None:
        """The value the option takes, as help screens show it: ``INT``, ``FLOAT``, ``TEXT``, an enum's choices
        (``table|json``); ``None`` for a flag (it takes none)."""
        t = self.type
        if typing.get_origin(t) in (typing.Union, types.UnionType):
            t = next(a for a in typing.get_args(t) if a is not type(None))
        t = typing.get_args(t)[0] if typing.get_origin(t) is list else t
        if t is bool:
            return None
        if isinstance(t, type) and issubclass(t, Enum):
            return "|".join(m.value for m in t)
        return {int: "INT", float: "FLOAT"}.get(t, "TEXT")


MODEL, DEPLOY, AUDIT, OUTPUT = "Model", "Deployment (vLLM's flags)", "Audit", "Output"

DEPLOYMENT_OPTIONS = (
    Opt("vllm_python", Optional[str], None, ("--vllm-python",),
        "Plan and audit with another environment's python and its vLLM (e.g. the one a vllm-ascend release "
        "pins); it needs torch, vLLM and rich.", DEPLOY),
    Opt("tp", Optional[int], None, ("--tp", "--tensor-parallel-size"), "Tensor-parallel size (the preset's, else 1).",
        DEPLOY),
    Opt("pp", int, 1, ("--pp", "--pipeline-parallel-size"),
        "Pipeline-parallel size: each stage is budgeted on its own; all take the smallest stage's num_blocks.",
        DEPLOY),
    Opt("dp", int, 1, ("--dp", "--data-parallel-size"),
        "Data-parallel size: each DP rank runs its own engine (its own KV cache); an MoE model's experts are split over "
        "DP × TP ranks, by width, or whole with --enable-expert-parallel.", DEPLOY),
    Opt("enable_expert_parallel", bool, False, ("--enable-expert-parallel",),
        "vLLM's --enable-expert-parallel: each of the DP × TP ranks holds whole experts (MoE models only).", DEPLOY),
    Opt("pp_rank", Optional[int], None, ("--pp-rank",), "Audit this pipeline stage only (default: every stage).",
        DEPLOY),
    Opt("max_model_len", Optional[int], None, ("--max-model-len",),
        "The preset's, else vLLM's default for the config (its own length check applies).", DEPLOY),
    Opt("dtype", str, "auto", ("--dtype",),
        "auto (vLLM's rule: float32 configs run in 16 bits), bfloat16, float16 or float32.", DEPLOY),
    Opt("kv_cache_dtype", str, "auto", ("--kv-cache-dtype",), "auto (the model dtype), fp8, fp8_e4m3, fp8_e5m2, ...",
        DEPLOY),
    Opt("quantization", Optional[str], None, ("--quantization", "-q"),
        "vLLM's --quantization (default: the config's quantization_config).", DEPLOY),
    Opt("block_size", Optional[int], None, ("--block-size",),
        "vLLM's --block-size (platform rules may raise it for hybrids).", DEPLOY),
    Opt("enable_prefix_caching", Optional[bool], None, ("--enable-prefix-caching/--no-enable-prefix-caching",),
        "vLLM's prefix caching switch (default: vLLM's).", DEPLOY),
    Opt("mamba_cache_mode", Optional[str], None, ("--mamba-cache-mode",),
        "none, align or all (default: vLLM's for the prefix-caching setting).", DEPLOY),
    Opt("max_num_seqs", Optional[int], None, ("--max-num-seqs",),
        "vLLM's --max-num-seqs (default: vLLM's for the usage context and device; Mamba state slots are checked "
        "against it).", DEPLOY),
    Opt("max_num_batched_tokens", Optional[int], None, ("--max-num-batched-tokens",),
        "vLLM's --max-num-batched-tokens (default: vLLM's for the usage context and device; a sliding-window group "
        "holds a window plus these tokens per request).", DEPLOY),
    Opt("max_cudagraph_capture_size", Optional[int], None, ("--max-cudagraph-capture-size",),
        "vLLM's --max-cudagraph-capture-size: the largest batch CUDA graphs are captured for (their memory).", DEPLOY),
    Opt("enforce_eager", bool, False, ("--enforce-eager",), "vLLM's --enforce-eager: no CUDA/ACL graphs.", DEPLOY),
    Opt("compilation_config", Optional[str], None, ("--compilation-config",),
        "JSON object as vLLM's --compilation-config: its cudagraph_mode (which CUDA graphs take memory: NONE, "
        "PIECEWISE, FULL, FULL_DECODE_ONLY, FULL_AND_PIECEWISE); other keys are refused.",
        DEPLOY),
    Opt("limit_mm_per_prompt", Optional[str], None, ("--limit-mm-per-prompt",),
        "JSON object as vLLM's --limit-mm-per-prompt (e.g. '{\"image\": 0, \"video\": 0}'): a modality at 0 is "
        "neither profiled nor, where vLLM's model skips it, built. Multimodal models only.", DEPLOY),
    Opt("skip_mm_profiling", bool, False, ("--skip-mm-profiling",),
        "vLLM's --skip-mm-profiling: the multimodal encoder is not profiled at start-up. Multimodal models only.",
        DEPLOY),
    Opt("language_model_only", bool, False, ("--language-model-only",),
        "vLLM's --language-model-only: every modality's limit is 0 (no encoder is built or profiled). Multimodal "
        "models only.", DEPLOY),
    Opt("usage_context", str, "serve", ("--usage-context",),
        "Whose defaults vLLM gives what is unset: serve (vllm serve) or llm (the LLM class).", DEPLOY),
    Opt("num_speculative_tokens", int, 0, ("--num-speculative-tokens",),
        "MTP draft tokens: the draft model's layers get KV cache too.", DEPLOY),
    Opt("hf_overrides", Optional[str], None, ("--hf-overrides",),
        "JSON object merged into the config, as vLLM's --hf-overrides.", DEPLOY),
    Opt("util", Optional[float], None, ("--util", "--gpu-memory-utilization"),
        f"gpu_memory_utilization, in (0, 1] (default: the emulated vLLM's, {default_utilization_text()}).",
        DEPLOY),
    Opt("device", Optional[str], None, ("--device",), "Device kind: its memory as torch reports it, its platform, and the "
        f"name and capability vLLM's defaults read ({len(DEVICES)} kinds, e.g. h100-80g, atlas-a2-64g; an unknown one "
        "lists them all).", DEPLOY),
    Opt("device_memory", Optional[str], None, ("--device-memory",),
        "Device memory, e.g. 80GiB: replaces the --device kind's (which it needs: the kind's rules still plan).",
        DEPLOY),
    Opt("weights", Optional[str], None, ("--weights",), "Weights per rank (default: computed from the config).",
        DEPLOY),
    Opt("overhead", Optional[str], None, ("--overhead",),
        "Non-KV memory per rank beside the weights, in place of kvaudit's model of vLLM's profile run "
        "(peak activation, non-torch, CUDA graphs).", DEPLOY),
    Opt("vllm_version", Optional[str], None, ("--vllm-version",),
        "The vLLM release whose budget formula and start-up lines to emulate (default: the installed vLLM; "
        "the installed vLLM still plans).", DEPLOY),
    Opt("kv_cache_memory", Optional[str], None, ("--kv-cache-memory",),
        "The KV budget itself, as vLLM's flag (skips the utilization formula).", DEPLOY),
    Opt("num_blocks", Optional[int], None, ("--num-blocks",),
        "Override num_blocks (vLLM's num_gpu_blocks_override): a scaled plan.", DEPLOY),
    Opt("kv_transfer", bool, False, ("--kv-transfer",),
        "A KV-transfer (P/D) deployment: vllm-ascend's 2 MiB-aligned buffers.", DEPLOY),
)

DeploymentOptions = dataclasses.make_dataclass(
    "DeploymentOptions", [(o.name, o.type, dataclasses.field(default=o.default)) for o in DEPLOYMENT_OPTIONS],
    frozen=True, namespace={"__doc__": "The deployment options, typed as ``DEPLOYMENT_OPTIONS`` declares them (vLLM's "
                                       "flag names; each unset one at its default): what ``kvaudit.plan.planner.deploy`` "
                                       "takes from the command line, a policy file or a marker.",
                            "of": classmethod(lambda cls, values: _options_of(cls, values))})


def _options_of(cls: Any, values: Any) -> Any:
    """``DeploymentOptions.of(values)``: the record of a mapping or a namespace (the command line's) of option
    values; names that are not deployment options (a command's own, as ``--format``) are left out, and ``None``
    stands for unset where the option has a default."""
    if isinstance(values, cls):
        return values
    given = values if isinstance(values, dict) else vars(values)
    fields = {o.name: o.default for o in DEPLOYMENT_OPTIONS}
    return cls(**{k: v for k, v in given.items() if k in fields and not (v is None and fields[k] is not None)})


SIZE_OPTIONS = ("device_memory", "weights", "overhead", "kv_cache_memory")
"""Options given as a size: bytes, or text such as ``80GiB``."""


def value_type(name: str) -> Any:
    """The Python type(s) a deployment option's value may have in a policy or a marker: ``int``, ``float``,
    ``bool``, ``str``, ``(str, int)`` for a size, ``(str, dict)`` for ``hf_overrides`` (a table or JSON)."""
    if name in SIZE_OPTIONS:
        return (str, int)
    if name in ("hf_overrides", "limit_mm_per_prompt"):
        return (str, dict)
    t = next(o.type for o in DEPLOYMENT_OPTIONS if o.name == name)
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        t = next(a for a in typing.get_args(t) if a is not type(None))
    return typing.get_origin(t) or t


def deployment_option_names() -> tuple[str, ...]:
    """The options a policy entry or a marker may set (``vllm_python`` is the command line's alone)."""
    return tuple(o.name for o in DEPLOYMENT_OPTIONS if o.name != "vllm_python")


def accepts(value: Any, want: Any) -> bool:
    """Whether ``value`` (from a policy file or a pytest marker) is of the type(s) ``want`` (as ``value_type``
    gives them; ``list`` is a list of non-empty strings). A bool is not a number, whatever Python says."""
    if isinstance(want, tuple):
        return any(accepts(value, w) for w in want)
    if want is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if want is list:
        return isinstance(value, list) and all(isinstance(v, str) and v for v in value)
    return isinstance(value, want)
