"""The ``kvaudit`` command: parse options, call the core, render, map errors to exit codes.

Exit codes: 0 every audited strategy passed, 1 any failed, 2 bad input, 3 could not measure.
Neither torch nor vLLM is imported until a command needs them (``kvaudit --help`` stays fast).
"""

from __future__ import annotations

import argparse
import os
import sys
from enum import Enum
from typing import Any, NoReturn

from kvaudit import __version__
from kvaudit.deployment import DEFAULT_OVERHEAD_BYTES, DEVICES, PRESETS
from kvaudit.errors import EXIT_BAD_INPUT, KvauditError, MissingDependency, UsageError, missing_dependency
from kvaudit.results import DEFAULT_TOLERANCE

DESCRIPTION = ("Audit a KV-cache allocator against vLLM's own plan: expected vs allocated bytes per layer "
               "and group, with a verdict. Exit codes: 0 pass, 1 fail, 2 bad input, 3 could not measure.")


TABLE_WIDTH = 120
"""Table width when stdout is not a terminal and COLUMNS is unset."""


class Format(str, Enum):
    """Output formats."""

    table = "table"
    json = "json"


class Detail(str, Enum):
    """How much of each strategy's audit the table shows."""

    summary = "summary"
    groups = "groups"
    layers = "layers"


class _Parser(argparse.ArgumentParser):
    """argparse that raises ``UsageError`` (one line, exit 2) instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:  # noqa: D102
        raise UsageError(message)


def _audit_options(p: argparse.ArgumentParser) -> None:
    _deployment_options(p)
    p.add_argument("--strategy", "-s", action="append", default=[],
                   help="vllm, ascend-0.11, ascend-0.12, ascend-0.16 (default: these four), installed, "
                        "vllm-ascend==VERSION, vllm-ascend=PATH (a source checkout), module:function, or a "
                        "kvaudit.strategies entry point; repeatable")
    p.add_argument("--meter", default="auto", help="auto (npu, then cuda, then meta), npu, cuda, cpu or meta")
    p.add_argument("--device-index", type=int, default=0, help="which npu/cuda device the meter uses")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                   help=f"relative tolerance on the planned bytes ({DEFAULT_TOLERANCE})")
    p.add_argument("--format", dest="fmt", choices=[f.value for f in Format], default="table",
                   help="table, or json (stdout holds only the JSON)")
    p.add_argument("--detail", choices=[d.value for d in Detail], default="layers",
                   help="table detail: summary, groups, layers (default)")


def _deployment_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vllm-python", metavar="PYTHON",
                   help="plan (and audit) with the vLLM of another environment: its python, with torch, vLLM "
                        "and rich installed (e.g. the vLLM a vllm-ascend release pins); kvaudit runs there")
    p.add_argument("--tp", "--tensor-parallel-size", dest="tp", type=int,
                   help="tensor-parallel size (the preset's, else 1)")
    p.add_argument("--pp", "--pipeline-parallel-size", dest="pp", type=int, default=1,
                   help="pipeline-parallel size: each stage is planned and budgeted on its own (default 1)")
    p.add_argument("--pp-rank", type=int, help="audit this pipeline stage only (default: every stage)")
    p.add_argument("--max-model-len", type=int,
                   help="the preset's, else vLLM's default for the config (its own length check applies)")
    p.add_argument("--dtype", default="auto", help="auto (vLLM's rule: float32 configs run in 16 bits), bfloat16, "
                                                   "float16 or float32")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the model dtype), fp8, fp8_e4m3, fp8_e5m2, ...")
    p.add_argument("--quantization", "-q", help="vLLM's --quantization (default: the config's quantization_config)")
    p.add_argument("--block-size", type=int, help="vLLM's --block-size (platform rules may raise it for hybrids)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's prefix caching switch (default: vLLM's)")
    p.add_argument("--mamba-cache-mode", help="none, align or all (default: vLLM's for the prefix-caching setting)")
    p.add_argument("--max-num-seqs", type=int, help="vLLM's --max-num-seqs (Mamba state slots are checked against it)")
    p.add_argument("--num-speculative-tokens", type=int, default=0,
                   help="MTP draft tokens: the draft model's layers get KV cache too (default 0)")
    p.add_argument("--hf-overrides", help="JSON object merged into the config, as vLLM's --hf-overrides")
    p.add_argument("--util", "--gpu-memory-utilization", dest="util", type=float, default=0.9,
                   help="gpu_memory_utilization, in (0, 1] (default 0.9, as vLLM)")
    p.add_argument("--device", help=f"device preset for the memory size ({', '.join(DEVICES)})")
    p.add_argument("--device-memory", help="device memory, e.g. 80GiB (overrides --device)")
    p.add_argument("--weights", help="weights per rank (default: computed from the config)")
    p.add_argument("--overhead", default=str(DEFAULT_OVERHEAD_BYTES),
                   help="other non-KV memory per rank: activations, non-torch (default 2GiB)")
    p.add_argument("--kv-cache-memory", help="the KV budget itself, as vLLM's flag (skips the utilization formula)")
    p.add_argument("--num-blocks", type=int, help="override num_blocks (vLLM's num_gpu_blocks_override): a scaled plan")
    p.add_argument("--kv-transfer", action="store_true",
                   help="a KV-transfer (P/D) deployment: vllm-ascend's 2 MiB-aligned buffers")


def build_parser() -> argparse.ArgumentParser:
    """The parser: ``audit``, one shortcut per preset, and ``meters``."""
    parser = _Parser(prog="kvaudit", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"kvaudit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    audit = sub.add_parser("audit", help="audit a config.json (--config) or a preset (--preset)",
                           description="Audit the KV-cache allocation of a model config under each strategy.")
    audit.add_argument("--config", help="a config.json, or a model directory holding one")
    audit.add_argument("--preset", help=f"a shipped model: {', '.join(PRESETS)}")
    audit.add_argument("--plan", metavar="PLAN.json",
                       help="audit a plan saved by 'kvaudit plan --save' instead of planning: needs only torch, not "
                            "vLLM (plan on one machine, measure on another)")
    _audit_options(audit)
    for name, preset in PRESETS.items():
        p = sub.add_parser(name, help=f"audit {preset.title} ({preset.description})",
                           description=f"Audit {preset.title}: TP {preset.tp}, max-model-len "
                                       f"{preset.max_model_len}, {preset.device}, unless options say otherwise.")
        _audit_options(p)
        p.set_defaults(preset=name, config=None)
    tri = sub.add_parser("triage", help="from a pasted OOM report to a root-cause report",
                         description="Read a pasted vLLM / vllm-ascend report (logs, traceback, smi tables, versions), "
                                     "reconstruct the deployment, audit the reported release's allocator and the fixed "
                                     "one, and write a report to paste into the issue.")
    tri.add_argument("report", help="the report: a file, or - for stdin")
    tri.add_argument("--config", help="the model's config.json, when no shipped preset matches the model")
    tri.add_argument("--title", help="the issue's title (versions and models are often only there); a first line "
                                     "that reads like one ([Bug]: ...) is taken as the title")
    tri.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE,
                     help=f"relative tolerance on the planned bytes, as for audit ({DEFAULT_TOLERANCE})")
    tri.add_argument("--format", dest="fmt", choices=["markdown", "json"], default="markdown",
                     help="markdown (default) or json")
    plan = sub.add_parser(
        "plan", help="plan only: capacity as vLLM logs it, Mamba slots, --kv-cache-memory, safe util",
        description="Plan with vLLM's own model and planner, allocate nothing: KV-cache tokens and concurrency "
                    "as vLLM computes and logs them, Mamba slots against max_num_seqs, the --kv-cache-memory "
                    "that reproduces the plan, and per strategy the highest gpu_memory_utilization that does "
                    "not run out of device memory.")
    plan.add_argument("--config", help="a config.json, or a model directory holding one")
    plan.add_argument("--preset", help=f"a shipped model: {', '.join(PRESETS)}")
    plan.add_argument("--save", metavar="PLAN.json",
                      help="also write the plans as data (deployment, groups, specs, tensors and their layers, "
                           "num_blocks, capacity, the vLLM that planned) for 'kvaudit audit --plan'")
    _audit_options(plan)
    hist = sub.add_parser(
        "history", help="audit every published vllm-ascend release's own code on one model: where it changed",
        description="Audit every published vllm-ascend release's own KV-cache allocation code (from its sdist, "
                    "fetched once into the cache) on one deployment, in one process, on the meta meter: one row "
                    "per release with its ratio, storages and verdict, and the release where the ratio changed "
                    "with the pull request behind it where known.")
    hist.add_argument("model", help=f"a shipped model ({', '.join(PRESETS)}) or a config.json path")
    hist.add_argument("--since", help="the first release to audit (default: every published one)")
    _deployment_options(hist)
    hist.add_argument("--format", dest="fmt", choices=[f.value for f in Format], default="table",
                      help="table, or json (stdout holds only the JSON)")
    models = sub.add_parser(
        "models", help="list the shipped presets with their layer mix (as vLLM's model code builds it)",
        description="List the presets: title, architecture, layer mix per kind, deployment, config.")
    models.add_argument("names", nargs="*", help="only these presets")
    sub.add_parser("meters", help="list every meter with its availability here or the reason it is not",
                   description="List every meter with its availability here, or the reason it is unavailable."
                   ).add_argument("--device-index", type=int, default=0, help="which npu/cuda device to probe")
    return parser


def audit_command(a: argparse.Namespace) -> int:
    """Run the audit the options describe, render it, and return the exit code."""
    if not 0.0 <= a.tolerance < 1.0:
        raise UsageError(f"--tolerance must be in [0, 1), got {a.tolerance}")
    if getattr(a, "plan", None):
        return _saved_plan_audit(a)
    from kvaudit import audit as core
    from kvaudit.capacity import for_report
    from kvaudit.meters import select_meter
    from kvaudit.plan import vllm_version
    from kvaudit.results import Report
    from kvaudit.resolve import resolve_strategy
    from kvaudit.strategies import STRATEGIES

    spec, p = _model(a)
    strategies = [resolve_strategy(s) for s in (a.strategy or list(STRATEGIES))]
    for s in strategies:
        if s.note:
            _note(f"kvaudit: {s.note}")
    meter = select_meter(a.meter, a.device_index)
    stages = [_deployment(a, spec, p, rank) for rank in _pp_ranks(a)]
    _note(f"kvaudit: planning with vLLM {vllm_version()} and auditing {len(strategies)} "
          f"strategies on the {meter.name} meter" + (f", {len(stages)} pipeline stages" if len(stages) > 1 else ""))
    reports = []
    for dep in stages:
        skipped: list[tuple[str, str]] = []
        audits = tuple(core.audit_all(dep, strategies, meter, a.tolerance, skipped))
        caps, safe = for_report(dep, list(audits), strategies)
        reports.append(Report(deployment=dep, audits=audits, meter=meter.name, meter_device=meter.describe(),
                              vllm_version=vllm_version(), skipped=tuple(skipped), capacity=caps,
                              safe_utilization=safe))
    _render(reports, Format(a.fmt), Detail(a.detail))
    return max(rep.exit_code for rep in reports)


def _saved_plan_audit(a: argparse.Namespace) -> int:
    """``audit --plan PLAN.json``: the saved plans, audited with torch alone (vLLM is not imported unless
    a strategy needs vLLM's own code and the vLLM that planned is installed)."""
    from kvaudit import planfile

    fixed = _deployment_options_given(a)
    if fixed:
        raise UsageError(f"{fixed} cannot change a saved plan ({a.plan} fixes the model and deployment); plan "
                         "again with: kvaudit plan ... --save PLAN.json")
    saved = planfile.load(a.plan)  # bad input is reported before anything needs torch

    from kvaudit import audit as core
    from kvaudit.meters import select_meter
    from kvaudit.results import Report
    from kvaudit.resolve import resolve_strategy
    from kvaudit.strategies import STRATEGIES

    strategies = [resolve_strategy(s) for s in (a.strategy or list(STRATEGIES))]
    for s in strategies:
        if s.note:
            _note(f"kvaudit: {s.note}")
    meter = select_meter(a.meter, a.device_index)
    stages = [st for st in saved.stages if a.pp_rank is None or st.deployment.pp_rank == a.pp_rank]
    if not stages:
        raise UsageError(f"--pp-rank {a.pp_rank}: {a.plan} holds stages "
                         f"{', '.join(str(st.deployment.pp_rank) for st in saved.stages)}")
    _note(f"kvaudit: auditing {len(strategies)} strategies on the {meter.name} meter against {saved.path.name} "
          f"(planned by vLLM {saved.vllm_version})")
    reports = []
    for st in stages:
        skipped: list[tuple[str, str]] = []
        audits = tuple(core.audit_all(st.deployment, strategies, meter, a.tolerance, skipped,
                                      plan_for=lambda s, st=st: planfile.plan_for(st, s, saved.path)))
        caps = {r.plan.platform: st.capacity[r.plan.platform] for r in audits}
        safe = {r.strategy: st.safe_utilization[r.strategy] for r in audits if r.strategy in st.safe_utilization}
        reports.append(Report(deployment=st.deployment, audits=audits, meter=meter.name,
                              meter_device=meter.describe(), vllm_version=saved.vllm_version,
                              skipped=tuple(skipped), capacity=caps, safe_utilization=safe))
    _render(reports, Format(a.fmt), Detail(a.detail))
    return max(rep.exit_code for rep in reports)


def _deployment_options_given(a: argparse.Namespace) -> str | None:
    """The first model or deployment option given with ``--plan`` (a saved plan fixes them all)."""
    probe = _Parser(add_help=False)
    _deployment_options(probe)
    for action in probe._actions:
        if action.dest in ("help", "vllm_python", "pp_rank"):
            continue
        if getattr(a, action.dest, action.default) != action.default:
            return action.option_strings[0]
    for flag, dest in (("--config", "config"), ("--preset", "preset")):
        if getattr(a, dest, None) is not None:
            return flag
    return None


def _model(a: argparse.Namespace) -> tuple[Any, Any]:
    """The model spec and preset the options name."""
    from kvaudit.deployment import get_preset, load_preset_spec
    from kvaudit.spec import load_model_spec

    if (a.config is None) == (a.preset is None):
        raise UsageError("give exactly one of --config PATH or --preset NAME (or run kvaudit PRESET)")
    p = get_preset(a.preset) if a.preset else None
    return (load_preset_spec(p) if p else load_model_spec(a.config)), p


def _pp_ranks(a: argparse.Namespace) -> list[int]:
    """The pipeline stages to plan: the one ``--pp-rank`` names, else every stage."""
    if a.pp_rank is not None:
        return [a.pp_rank]
    return list(range(max(1, a.pp or 1)))


def plan_command(a: argparse.Namespace) -> int:
    """Plan only: capacity as vLLM computes it, and per strategy the highest safe utilization."""
    from kvaudit import report
    from kvaudit.capacity import plan_stage
    from kvaudit.plan import vllm_version
    from kvaudit.resolve import resolve_strategy
    from kvaudit.strategies import STRATEGIES

    spec, p = _model(a)
    strategies = [resolve_strategy(s) for s in (a.strategy or list(STRATEGIES))]
    stages = [plan_stage(_deployment(a, spec, p, rank), strategies) for rank in _pp_ranks(a)]
    if a.save:
        from kvaudit.planfile import save

        path = save(stages, vllm_version(), a.save)
        _note(f"kvaudit: saved {sum(len(st.plans) for st in stages)} plans of {spec.name} by vLLM {vllm_version()} "
              f"to {path} (audit them anywhere torch runs: kvaudit audit --plan {path})")
    if Format(a.fmt) is Format.json:
        sys.stdout.write(report.plan_to_json(stages, vllm_version()) + "\n")
    else:
        console = _console()
        for renderable in report.render_plan(stages, vllm_version()):
            console.print(renderable)
            console.print()
    sys.stdout.flush()
    return 0


def _deployment(a: argparse.Namespace, spec: Any, p: Any, pp_rank: int = 0) -> Any:
    """The deployment the options describe, resolved by vLLM (``kvaudit.plan.make_deployment``)."""
    import json

    from kvaudit.plan import make_deployment
    from kvaudit.units import parse_size

    def size(value: str | None, what: str) -> int | None:
        return parse_size(value, what) if value is not None else None

    overrides = None
    if a.hf_overrides:
        try:
            overrides = json.loads(a.hf_overrides)
        except json.JSONDecodeError as e:
            raise UsageError(f"--hf-overrides is not valid JSON: {e.msg} (column {e.colno})") from None
        if not isinstance(overrides, dict):
            raise UsageError("--hf-overrides must be a JSON object, e.g. '{\"max_position_embeddings\": 65536}'")
    return make_deployment(
        spec, tp=a.tp if a.tp is not None else (p.tp if p else 1), gpu_memory_utilization=a.util,
        max_model_len=a.max_model_len or (p.max_model_len if p else None),
        device=a.device or (p.device if p else "atlas-a2-64g"),
        device_memory_bytes=size(a.device_memory, "--device-memory"), dtype=a.dtype,
        weights_bytes=size(a.weights, "--weights"),
        overhead_bytes=parse_size(a.overhead, "--overhead", allow_zero=True),
        kv_cache_memory_bytes=size(a.kv_cache_memory, "--kv-cache-memory"),
        kv_transfer=a.kv_transfer, num_blocks_override=a.num_blocks, pp=a.pp, pp_rank=pp_rank,
        kv_cache_dtype=a.kv_cache_dtype, quantization=a.quantization, block_size=a.block_size,
        enable_prefix_caching=a.enable_prefix_caching, mamba_cache_mode=a.mamba_cache_mode,
        max_num_seqs=a.max_num_seqs, num_speculative_tokens=a.num_speculative_tokens, hf_overrides=overrides)


def models_command(a: argparse.Namespace) -> int:
    """List the presets with the layer mix vLLM's own model code registers for each."""
    from kvaudit.deployment import load_preset_spec
    from kvaudit.plan import layer_mix, make_deployment

    rows = []
    for name, p in PRESETS.items():
        if a.names and name not in a.names:
            continue
        spec = load_preset_spec(p)
        d = make_deployment(spec, tp=p.tp, max_model_len=p.max_model_len, gpu_memory_utilization=0.9, device=p.device)
        rows.append((name, p.title, d.architecture, layer_mix(d), f"TP {p.tp}, {p.device}", p.config))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + f"  fixtures/configs/{r[5]}")
    return 0


def triage_command(a: argparse.Namespace) -> int:
    """Triage a pasted report; the report goes to stdout, the verdict line to stderr."""
    from kvaudit.evidence import read_report
    from kvaudit.triage import triage

    if not 0.0 <= a.tolerance < 1.0:
        raise UsageError(f"--tolerance must be in [0, 1), got {a.tolerance}")
    t = triage(read_report(a.report), a.config, a.title, a.tolerance)
    sys.stdout.write(t.to_json() + "\n" if a.fmt == "json" else t.to_markdown())
    sys.stdout.flush()
    _note(f"kvaudit triage: {t.verdict}" + (f" ({t.factor:.2f}×)" if t.factor else ""))
    if t.not_audited:
        _note(f"kvaudit: the audit step did not run: {t.not_audited}")
        return MissingDependency.exit_code
    return 0


def history_command(a: argparse.Namespace) -> int:
    """Every published vllm-ascend release's own allocation code on one deployment; table or JSON."""
    import json

    from kvaudit.history import history, published
    from kvaudit.plan import vllm_version

    a.preset, a.config = (a.model, None) if a.model in PRESETS else (None, a.model)
    spec, p = _model(a)
    d = _deployment(a, spec, p)
    versions, source = published(a.since)
    if not versions:
        raise UsageError(f"no vllm-ascend release from {a.since} on in {source}")
    _note(f"kvaudit: auditing {len(versions)} vllm-ascend releases from {source} on the meta meter, planned by "
          f"vLLM {vllm_version()} (first fetch of each sdist takes a few seconds)")
    rows = history(d, versions, progress=(lambda v: _note(f"  {v}")) if sys.stderr.isatty() else None)
    if a.fmt == "json":
        doc = {"model": spec.name, "deployment": d.to_dict(), "planned_with_vllm": vllm_version(),
               "meter": "meta", "releases": [r.to_dict() for r in rows]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        print(f"{spec.name}: TP {d.tp}, util {d.gpu_memory_utilization}, planned by vLLM {vllm_version()}, meter meta "
              "(accounting, not a device measurement)")
        print(f"{'release':14} {'ratio':>7} {'storages':>9}  {'verdict':11} change")
        for r in rows:
            ratio = f"{r.ratio:.2f}×" if r.ratio is not None else "—"
            storages = f"{r.storages}" if r.storages is not None else "—"
            change = ("← changed" + (f": {r.pr}" if r.pr else "")) if r.changed else (r.reason or "")
            print(f"{r.version:14} {ratio:>7} {storages:>9}  {r.verdict:11} {change}")
    audited = [r for r in rows if r.ratio is not None]
    return 1 if any(r.verdict == "FAIL" for r in audited) and audited[-1].verdict == "FAIL" else (
        0 if audited else 3)


def meters_command(a: argparse.Namespace) -> int:
    """Print every meter with its availability or refusal reason."""
    from kvaudit.meters import meter_table

    for name, ok, text in meter_table(a.device_index):
        print(f"{name:5} {'available  ' if ok else 'unavailable'}  {text}")
    return 0


def _note(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _console() -> Any:
    from rich.console import Console

    width = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else TABLE_WIDTH
    return Console(highlight=False, soft_wrap=False, width=width)


def _render(reports: list[Any], fmt: Format, detail: Detail) -> None:
    """One report per pipeline stage: the JSON report (``{"stages": [...]}`` for several), or the tables."""
    from kvaudit import report

    if fmt is Format.json:
        sys.stdout.write((report.to_json(reports[0]) if len(reports) == 1 else report.stages_to_json(reports)) + "\n")
    else:
        console = _console()
        for rep in reports:
            for renderable in report.render_tables(rep, detail.value):
                console.print(renderable)
                console.print()
    sys.stdout.flush()
    for rep in reports:
        _note(report.summary_line(rep))


def _elsewhere(argv: list[str]) -> int | None:
    """``--vllm-python PYTHON``: run this very command with another environment's interpreter (its vLLM
    plans), kvaudit's own source on its path; its output and exit code are this command's."""
    import subprocess
    from pathlib import Path

    if "--vllm-python" not in argv and not any(a.startswith("--vllm-python=") for a in argv):
        return None
    rest, python, i = [], None, 0
    while i < len(argv):
        a = argv[i]
        if a == "--vllm-python":
            if i + 1 >= len(argv):
                raise UsageError("--vllm-python needs the path of a python executable")
            python, i = argv[i + 1], i + 2
            continue
        if a.startswith("--vllm-python="):
            python = a.partition("=")[2]
        else:
            rest.append(a)
        i += 1
    exe = Path(python or "").expanduser()
    if not exe.is_file() or not os.access(exe, os.X_OK):
        raise UsageError(f"--vllm-python {python}: not an executable python")
    if os.environ.get("KVAUDIT_IN_VLLM_PYTHON"):
        raise UsageError("--vllm-python given inside a --vllm-python run")
    source = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, KVAUDIT_IN_VLLM_PYTHON=str(exe),
               PYTHONPATH=os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")])))
    _note(f"kvaudit: running with {exe} (its vLLM plans)")
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run([str(exe), "-m", "kvaudit", *rest], env=env).returncode


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code; every error is one line on stderr."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    commands = {"audit", "meters", "models", "plan", "triage", "history", *PRESETS}
    try:
        code = _elsewhere(argv or [])
        if code is not None:
            return code
        if not argv:
            parser.print_help(sys.stderr)
            return EXIT_BAD_INPUT
        first = argv[0]
        if not first.startswith("-") and first not in commands:
            raise UsageError(f"unknown preset or command {first!r} (presets: {', '.join(PRESETS)}; "
                             f"commands: audit, plan, models, triage, history, meters)")
        args = parser.parse_args(argv)
        if args.command is None:
            raise UsageError("give a command: audit, meters, or a preset (" + ", ".join(PRESETS) + ")")
        run = {"meters": meters_command, "models": models_command, "plan": plan_command,
               "triage": triage_command, "history": history_command}.get(
            args.command, audit_command)
        return run(args)
    except KvauditError as e:
        print(f"kvaudit: error: {e.message}", file=sys.stderr)
        return e.exit_code
    except ModuleNotFoundError as e:  # a package this command needs (torch, vLLM, ...) is not installed
        missing = missing_dependency(e)
        print(f"kvaudit: error: {missing.message}", file=sys.stderr)
        return missing.exit_code
    except SystemExit as e:  # --help and --version exit through argparse
        return int(e.code or 0)
    except KeyboardInterrupt:
        print("kvaudit: interrupted", file=sys.stderr)
        return 130


def run() -> None:
    """Console-script entry point.

    Once vLLM is loaded the process holds its modules, a gloo group and the models built on ``meta``,
    whose teardown at interpreter exit takes seconds (about 5 s of a 14 s audit here) and does
    nothing kvaudit needs; so after the output is flushed and kvaudit's own temp files are removed,
    the process ends at once."""
    code = main()
    plan = sys.modules.get("kvaudit.plan")
    if plan is None:
        sys.exit(code)
    plan.remove_temp_dirs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
