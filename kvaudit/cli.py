"""The ``kvaudit`` command on typer and rich: options, commands, rendering, errors mapped to exit codes.

Exit codes (``kvaudit.errors.EXIT_CODES``): 0 every audited strategy passed, 1 any failed, 2 bad input,
3 could not measure, 4 a bug in kvaudit (never a finding), 130 interrupted. Every error is one line on
stderr; ``--debug`` adds the traceback. A reader that closes stdout early (``| head``) does not change
the exit code. Neither torch nor vLLM is imported until a command needs them (``kvaudit --help`` stays fast).
Every option is declared once (``Opt``) and shared by the commands that take it; each command body
reads the parsed options as one namespace, so commands keep the same names as vLLM's flags.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from enum import Enum
from types import SimpleNamespace
from typing import Annotated, Any, Callable, Optional

import typer

from kvaudit import __version__
from kvaudit.deployment import PRESETS
from kvaudit.errors import (EXIT_BAD_INPUT, EXIT_BUG, EXIT_CODES, EXIT_INTERRUPTED, EXIT_NOT_MEASURED, ConfigError,
                            KvauditError, MissingDependency, UsageError, missing_dependency)
from kvaudit.options import AUDIT, DEPLOYMENT_OPTIONS, MODEL, OUTPUT, Opt
from kvaudit.results import DEFAULT_TOLERANCE

DESCRIPTION = ("Audit a KV-cache allocator against vLLM's own plan: expected vs allocated bytes per layer "
               "and group, with a verdict. Exit codes: "
               + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items()) + ".")


TABLE_WIDTH = 120
"""Table width when stdout is not a terminal and COLUMNS is unset."""


class Format(str, Enum):
    """Output formats."""

    table = "table"
    json = "json"


class TriageFormat(str, Enum):
    """Output formats of ``kvaudit triage``."""

    markdown = "markdown"
    json = "json"


class Detail(str, Enum):
    """How much of each strategy's audit the table shows."""

    summary = "summary"
    groups = "groups"
    layers = "layers"


STRATEGY = Opt("strategy", Optional[list[str]], None, ("--strategy", "-s"),
               "vllm, ascend-0.11, ascend-0.12, ascend-0.16 (default: these four), installed, vllm-ascend==VERSION, "
               "vllm-ascend=PATH (a source checkout), module:function, or a kvaudit.strategies entry point; "
               "repeatable.", AUDIT)
METER = Opt("meter", str, "auto", ("--meter",), "auto (npu, then cuda, then meta), npu, cuda, cpu or meta.", AUDIT)
DEVICE_INDEX = Opt("device_index", int, 0, ("--device-index",), "Which npu/cuda device the meter uses.", AUDIT)
TOLERANCE = Opt("tolerance", float, DEFAULT_TOLERANCE, ("--tolerance",),
                "Relative tolerance on the planned bytes.", AUDIT)
FORMAT = Opt("fmt", Format, Format.table, ("--format",), "table, or json (stdout holds only the JSON).", OUTPUT)
DETAIL = Opt("detail", Detail, Detail.layers, ("--detail",), "Table detail: summary, groups, layers.", OUTPUT)
HTML = Opt("html", Optional[str], None, ("--html",),
           "Also write the report as an HTML page: expected vs allocated bars per strategy and group, the tables.",
           OUTPUT)
SVG = Opt("svg", Optional[str], None, ("--svg",), "Also write the report as one SVG image (bars and tables).", OUTPUT)
CONFIG = Opt("config", Optional[str], None, ("--model", "--config"),
             "The model as vLLM takes it: a Hub id (org/name), a model folder, or a config.json.", MODEL)
PRESET = Opt("preset", Optional[str], None, ("--preset",), f"A shipped model: {', '.join(PRESETS)}.", MODEL)
REVISION = Opt("revision", Optional[str], None, ("--revision",),
               "The Hub revision of --model: a branch, tag or commit (vLLM's --revision).", MODEL)
TRUST_REMOTE_CODE = Opt("trust_remote_code", bool, False, ("--trust-remote-code",),
                        "Let the model folder's own config code run (vLLM's flag; nothing runs without it).", MODEL)
MODEL_OPTIONS = (CONFIG, PRESET, REVISION, TRUST_REMOTE_CODE)

AUDIT_OPTIONS = (*DEPLOYMENT_OPTIONS, STRATEGY, METER, DEVICE_INDEX, TOLERANCE, FORMAT, DETAIL, HTML, SVG)


def _command(app: typer.Typer, name: str, body: Callable[[Any], int], options: tuple[Opt, ...], help: str,
             panel: str = "Commands", fixed: dict | None = None, description: str | None = None) -> None:
    """Register ``body(namespace) -> exit code`` as command ``name`` taking ``options`` (``fixed``: values
    the command sets itself, as a preset's name)."""

    def command(**values: Any) -> int:
        try:
            return body(SimpleNamespace(**(fixed or {}), **values))
        except BaseException as e:  # past typer and click, which map some exceptions to exit codes of their own
            raise _Raised(e) from None

    command.__signature__ = inspect.Signature([o.parameter() for o in options])  # type: ignore[attr-defined]
    command.__doc__ = description or help
    command.__name__ = name.replace("-", "_").replace(".", "_")
    app.command(name, help=description or help, short_help=help, rich_help_panel=panel)(command)


class _Raised(Exception):
    """What a command body raised, carried past typer and click: they turn ``KeyboardInterrupt`` into a
    silent 130, ``EOFError`` (a truncated archive, too) into an abort, and a broken pipe into exit 1;
    kvaudit maps every exception itself (``main``)."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(repr(raised))
        self.raised = raised


def audit_command(a: Any) -> int:
    """Run the audit the options describe, render it, and return the exit code."""
    if not 0.0 <= a.tolerance < 1.0:
        raise UsageError(f"--tolerance must be in [0, 1), got {a.tolerance}")
    _check_outputs(a.html, a.svg)
    if getattr(a, "plan", None):
        return _saved_plan_audit(a)
    from kvaudit import audit as core
    from kvaudit.capacity import for_report
    from kvaudit.meters import select_meter
    from kvaudit.plan import vllm_version
    from kvaudit.results import Report
    from kvaudit.resolve import resolve_strategies
    from kvaudit.strategies import STRATEGIES

    spec, p = _model(a)
    strategies, broken = resolve_strategies(a.strategy or list(STRATEGIES))
    for s in strategies:
        if s.note:
            _note(f"kvaudit: {s.note}")
    meter = select_meter(a.meter, a.device_index)
    stages = [_deployment(a, spec, p, rank) for rank in _pp_ranks(a)]
    _note(f"kvaudit: planning with vLLM {vllm_version()} and auditing {len(strategies)} "
          f"strategies on the {meter.name} meter" + (f", {len(stages)} pipeline stages" if len(stages) > 1 else ""))
    reports = []
    for dep in stages:
        skipped: list[tuple[str, str]] = list(broken)
        audits = tuple(core.audit_all(dep, strategies, meter, a.tolerance, skipped))
        caps, safe = for_report(dep, list(audits), strategies)
        reports.append(Report(deployment=dep, audits=audits, meter=meter.name, meter_device=meter.describe(),
                              vllm_version=vllm_version(), skipped=tuple(skipped), capacity=caps,
                              safe_utilization=safe))
    _render(reports, Format(a.fmt), Detail(a.detail))
    _write_pages(a, reports)
    return max(rep.exit_code for rep in reports)


def _saved_plan_audit(a: Any) -> int:
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
    from kvaudit.resolve import resolve_strategies
    from kvaudit.strategies import STRATEGIES

    strategies, broken = resolve_strategies(a.strategy or list(STRATEGIES))
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
        skipped: list[tuple[str, str]] = list(broken)
        audits = tuple(core.audit_all(st.deployment, strategies, meter, a.tolerance, skipped,
                                      plan_for=lambda s, st=st: planfile.plan_for(st, s, saved.path)))
        caps = {r.plan.name: st.capacity[r.plan.name] for r in audits}
        safe = {r.strategy: st.safe_utilization[r.strategy] for r in audits if r.strategy in st.safe_utilization}
        reports.append(Report(deployment=st.deployment, audits=audits, meter=meter.name,
                              meter_device=meter.describe(), vllm_version=saved.vllm_version,
                              skipped=tuple(skipped), capacity=caps, safe_utilization=safe))
    _render(reports, Format(a.fmt), Detail(a.detail))
    _write_pages(a, reports)
    return max(rep.exit_code for rep in reports)


def _deployment_options_given(a: Any) -> str | None:
    """The first model or deployment option given with ``--plan`` (a saved plan fixes them all)."""
    for o in (*MODEL_OPTIONS, *DEPLOYMENT_OPTIONS):
        if o.name not in ("vllm_python", "pp_rank") and getattr(a, o.name, o.default) != o.default:
            return o.decls[0].split("/")[0]
    return None


def _model(a: Any) -> tuple[Any, Any]:
    """The model spec and preset the options name."""
    from kvaudit.deployment import load_model

    return load_model(a.preset, a.config, getattr(a, "revision", None), getattr(a, "trust_remote_code", False))


def _pp_ranks(a: Any) -> list[int]:
    """The pipeline stages to plan: the one ``--pp-rank`` names, else every stage."""
    if a.pp_rank is not None:
        return [a.pp_rank]
    return list(range(max(1, a.pp or 1)))


def plan_command(a: Any) -> int:
    """Plan only: capacity as vLLM computes it, and per strategy the highest safe utilization."""
    from kvaudit import report
    from kvaudit.capacity import plan_stage
    from kvaudit.plan import vllm_version
    from kvaudit.resolve import resolve_strategies
    from kvaudit.strategies import STRATEGIES

    _check_outputs(a.save)
    spec, p = _model(a)
    strategies, broken = resolve_strategies(a.strategy or list(STRATEGIES))
    stages = [plan_stage(_deployment(a, spec, p, rank), strategies, broken) for rank in _pp_ranks(a)]
    if a.save:
        from kvaudit.planfile import save

        path = save(stages, vllm_version(), a.save)
        _note(f"kvaudit: saved {sum(len(st.plans) for st in stages)} plans of {spec.name} by vLLM {vllm_version()} "
              f"to {path} (audit them anywhere torch runs: kvaudit audit --plan {path})")
    if Format(a.fmt) is Format.json:
        sys.stdout.write(report.plan_to_json(stages, vllm_version()) + "\n")
    else:
        _print(report.render_plan(stages, vllm_version()), gap=True)
    sys.stdout.flush()
    return 0


def _deployment(a: Any, spec: Any, p: Any, pp_rank: int = 0) -> Any:
    """The deployment the options describe, resolved by vLLM (``kvaudit.plan.deploy``)."""
    from kvaudit.plan import deploy

    return deploy(spec, p, vars(a), pp_rank)


def models_command(a: Any) -> int:
    """List the presets with the layer mix vLLM's own model code registers for each."""
    from kvaudit.deployment import load_preset_spec
    from kvaudit.plan import layer_mix, make_deployment

    rows = []
    for name, p in PRESETS.items():
        if a.names and name not in a.names:
            continue
        spec = load_preset_spec(p)
        try:  # the layer mix needs vLLM's model for the rank, not a KV budget (kimi-k2 has none at 0.9): one given
            d = make_deployment(spec, tp=p.tp, max_model_len=p.max_model_len, gpu_memory_utilization=0.9,
                                device=p.device, kv_cache_memory_bytes=1 << 30)
            architecture, mix, why = d.architecture, layer_mix(d), ""
        except ConfigError as e:  # a model this vLLM cannot build here: its row says why, the others still list
            architecture, mix, why = spec.architecture or "?", "—", f"  (not built here: {e.message})"
        rows.append((name, p.title, architecture, mix, f"TP {p.tp}, {p.device}", p.config, why))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)) + f"  fixtures/configs/{r[5]}{r[6]}")
    return 0


def triage_command(a: Any) -> int:
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


def history_command(a: Any) -> int:
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
        from kvaudit.history import render

        _print(render(rows, f"{spec.name}: TP {d.tp}, util {d.gpu_memory_utilization}, planned by vLLM "
                            f"{vllm_version()}, meter meta (accounting, not a device measurement)"))
    audited = [r for r in rows if r.ratio is not None]
    return 1 if any(r.verdict == "FAIL" for r in audited) and audited[-1].verdict == "FAIL" else (
        0 if audited else 3)


def check_command(a: Any) -> int:
    """``kvaudit check``: the policy's matrix, rendered, with JUnit / JSON / pages as asked."""
    from kvaudit import check
    from kvaudit.policy import load_policy
    from kvaudit.strategies import STRATEGIES

    _check_outputs(a.junit, a.html, a.svg)
    policy = load_policy(a.policy, tuple(STRATEGIES))
    result = check.run_policy(policy, meter=a.meter, device_index=a.device_index, progress=check.progress_to_stderr())
    if Format(a.fmt) is Format.json:
        sys.stdout.write(check.to_json(result) + "\n")
    else:
        _print(check.render(result))
    sys.stdout.flush()
    if a.junit:
        _write(a.junit, check.to_junit(result))
    _write_pages(a, list(result.reports), title=f"kvaudit check {a.policy}",
                 lead=check.summary_line(result).removeprefix("kvaudit check: "), preface=check.render(result))
    _note(check.summary_line(result))
    return result.exit_code


def compare_command(a: Any) -> int:
    """``kvaudit compare OLD.json NEW.json``: per group and layer deltas; exit 1 on a regression."""
    from kvaudit import compare

    if not 0.0 <= a.tolerance < 1.0:
        raise UsageError(f"--tolerance must be in [0, 1), got {a.tolerance}")
    result = compare.compare(compare.load_report(a.old), compare.load_report(a.new), a.tolerance)
    if Format(a.fmt) is Format.json:
        sys.stdout.write(compare.to_json(result) + "\n")
    else:
        _print(compare.render(result, Detail(a.detail).value))
    sys.stdout.flush()
    _note(compare.summary_line(result))
    return result.exit_code


def meters_command(a: Any) -> int:
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


def _print(renderables: list[Any], gap: bool = False) -> None:
    """Print rich renderables to stdout (a blank line after each with ``gap``)."""
    console = _console()
    for renderable in renderables:
        console.print(renderable)
        if gap:
            console.print()


def _render(reports: list[Any], fmt: Format, detail: Detail) -> None:
    """One report per pipeline stage: the JSON report (``{"stages": [...]}`` for several), or the tables."""
    from kvaudit import report

    if fmt is Format.json:
        sys.stdout.write((report.to_json(reports[0]) if len(reports) == 1 else report.stages_to_json(reports)) + "\n")
    else:
        _print([r for rep in reports for r in report.render_tables(rep, detail.value)], gap=True)
    sys.stdout.flush()
    for rep in reports:
        _note(report.summary_line(rep))



def _write_pages(a: Any, reports: list[Any], **page_options: Any) -> None:
    """``--html`` / ``--svg``: the report as a page and as an image, for a person without a terminal
    (``page_options``: the page's title, lead line and preface, as ``check`` sets them)."""
    if not (a.html or a.svg):
        return
    from kvaudit import page

    detail = Detail(getattr(a, "detail", Detail.layers)).value
    for path, text in ((a.html, page.to_html(reports, detail=detail, **page_options) if a.html else ""),
                       (a.svg, page.to_svg(reports, detail=detail, **page_options) if a.svg else "")):
        if path:
            _write(path, text)


def _check_outputs(*paths: str | None) -> None:
    """Refuse, before any work, an output file that cannot be written: a folder, a missing folder, a file
    or folder without write permission, a read-only file system (a file is made in its folder and removed)."""
    import tempfile
    from pathlib import Path

    for path in paths:
        if path is None:
            continue
        p = Path(path).expanduser()
        if p.is_dir():
            raise UsageError(f"{path} is a directory, not a file to write")
        if not p.parent.is_dir():
            raise UsageError(f"cannot write {path}: folder {p.parent} does not exist")
        try:
            if p.exists():
                if not os.access(p, os.W_OK):
                    raise PermissionError(13, "Permission denied")
            else:
                fd, probe = tempfile.mkstemp(dir=p.parent, prefix=".kvaudit-write-check-")
                os.close(fd)
                os.unlink(probe)
        except OSError as e:
            raise UsageError(f"cannot write {path}: {e.strerror or e}") from None


def _write(path: str, text: str) -> None:
    """Write an output file; a failure is one line, exit 2."""
    from pathlib import Path

    try:
        Path(path).expanduser().write_text(text, encoding="utf-8", errors="replace")
    except OSError as e:
        raise UsageError(f"cannot write {path}: {e.strerror or e}") from None
    _note(f"kvaudit: wrote {path}")


def _version(value: bool) -> None:
    if value:
        print(f"kvaudit {__version__}")
        raise typer.Exit()


COMMANDS = ("audit", "plan", "check", "compare", "models", "triage", "history", "meters")


def build_app() -> typer.Typer:
    """The typer application: the commands, one shortcut per preset, shell completion."""
    from kvaudit.tables import keep_option_names_whole

    keep_option_names_whole()
    app = typer.Typer(name="kvaudit", help=DESCRIPTION, add_completion=True, rich_markup_mode="rich",
                      context_settings={"help_option_names": ["--help", "-h"]}, pretty_exceptions_enable=False)

    @app.callback()
    def root(version: Annotated[bool, typer.Option("--version", help="Print kvaudit's version and exit.",
                                                   is_eager=True, callback=_version)] = False,
             debug: Annotated[bool, typer.Option("--debug", help="On an error, also print its traceback (taken "
                                                 "anywhere on the command line; or KVAUDIT_DEBUG=1).")] = False) -> None:
        """Audit a KV-cache allocator against vLLM's own plan."""

    plan_file = Opt("plan", Optional[str], None, ("--plan",),
                    "Audit a plan saved by 'kvaudit plan --save' instead of planning: needs only torch, not vLLM "
                    "(plan on one machine, measure on another).", MODEL)
    _command(app, "audit", audit_command, (*MODEL_OPTIONS, plan_file, *AUDIT_OPTIONS),
             "Audit a model (--model: a Hub id, a folder, a config.json) or a preset (--preset).",
             description="Audit the KV-cache allocation of a model config under each strategy.")
    for name, preset in PRESETS.items():
        _command(app, name, audit_command, AUDIT_OPTIONS, f"{preset.title} ({preset.description}).", panel="Presets",
                 fixed={"preset": name, "config": None, "plan": None, "revision": None, "trust_remote_code": False},
                 description=f"Audit {preset.title}: TP {preset.tp}, max-model-len {preset.max_model_len}, "
                             f"{preset.device}, unless options say otherwise.")
    save = Opt("save", Optional[str], None, ("--save",),
               "Also write the plans as data (deployment, groups, specs, tensors and their layers, num_blocks, "
               "capacity, the vLLM that planned) for 'kvaudit audit --plan'.", OUTPUT)
    _command(app, "plan", plan_command, (*MODEL_OPTIONS, save, *AUDIT_OPTIONS[:-2]),
             "Plan only: capacity as vLLM logs it, Mamba slots, --kv-cache-memory, safe util.",
             description="Plan with vLLM's own model and planner, allocate nothing: KV-cache tokens and concurrency "
                         "as vLLM computes and logs them, Mamba slots against max_num_seqs, the --kv-cache-memory "
                         "that reproduces the plan, and per strategy the highest gpu_memory_utilization that does "
                         "not run out of device memory.")
    policy = Opt("policy", str, "kvaudit.toml", (), "The policy file (default kvaudit.toml).", argument=True)
    junit = Opt("junit", Optional[str], None, ("--junit",),
                "Also write JUnit XML: one test case per cell, failures carrying the reasons.", OUTPUT)
    only = Opt("meter", Optional[str], None, ("--meter",), "Override the policy's meter for every cell.", AUDIT)
    _command(app, "check", check_command, (policy, only, DEVICE_INDEX, FORMAT, junit, HTML, SVG),
             "Run a policy file's matrix of models, deployments and strategies: a CI gate.",
             description="Run the matrix a policy file describes (models or config paths × TP × PP × "
                         "utilization × kv-cache dtype × strategies, on one meter, with a tolerance and the expected "
                         "outcome of each cell) in one process. Exit 0 every cell as expected, 1 any cell not, "
                         "2 a bad policy or a deployment vLLM refuses, 3 a cell could not be measured.")
    old = Opt("old", str, ..., (), "The earlier report (kvaudit audit --format json).", argument=True)
    new = Opt("new", str, ..., (), "The later report.", argument=True)
    _command(app, "compare", compare_command, (old, new, TOLERANCE, FORMAT, DETAIL),
             "Diff two saved JSON reports per group and layer; exit 1 on a regression.",
             description="Compare two saved reports (two vLLM or vllm-ascend versions, two platforms, with and "
                         "without KV transfer): per strategy, group and layer, bytes and ratio deltas. Exit 1 on a "
                         "regression beyond the tolerance.")
    _command(app, "triage", triage_command, (
        Opt("report", str, ..., (), "The report: a file, or - for stdin.", argument=True),
        Opt("config", Optional[str], None, ("--config",),
            "The model's config.json, when no shipped preset matches the model.", MODEL),
        Opt("title", Optional[str], None, ("--title",),
            "The issue's title (versions and models are often only there); a first line that reads like one "
            "([Bug]: ...) is taken as the title."),
        TOLERANCE, Opt("fmt", TriageFormat, TriageFormat.markdown, ("--format",), "markdown or json.", OUTPUT)),
        "From a pasted OOM report to a root-cause report.",
        description="Read a pasted vLLM / vllm-ascend report (logs, traceback, smi tables, versions), reconstruct "
                    "the deployment, audit the reported release's allocator and the fixed one, and write a report "
                    "to paste into the issue.")
    _command(app, "history", history_command, (
        Opt("model", str, ..., (), f"A shipped model ({', '.join(PRESETS)}), a Hub id, a model folder or a "
            "config.json.", argument=True), REVISION, TRUST_REMOTE_CODE,
        Opt("since", Optional[str], None, ("--since",), "The first release to audit (default: every published one)."),
        *DEPLOYMENT_OPTIONS, FORMAT),
        "Audit every published vllm-ascend release's own code on one model: where it changed.",
        description="Audit every published vllm-ascend release's own KV-cache allocation code (from its sdist, "
                    "fetched once into the cache) on one deployment, in one process, on the meta meter: one row "
                    "per release with its ratio, storages and verdict, and the release where the ratio changed "
                    "with the pull request behind it where known.")
    _command(app, "models", models_command,
             (Opt("names", Optional[list[str]], None, (), "Only these presets.", argument=True),),
             "List the shipped presets with their layer mix (as vLLM's model code builds it).",
             description="List the presets: title, architecture, layer mix per kind, deployment, config.")
    _command(app, "meters", meters_command, (Opt("device_index", int, 0, ("--device-index",),
                                                  "Which npu/cuda device to probe."),),
             "List every meter with its availability here or the reason it is not.")
    return app


@functools.lru_cache(maxsize=1)
def _click_command() -> Any:
    """The click command of ``build_app()``, built once per process (about 40 ms; in-process callers such as the
    pytest plugin and the tests run many commands)."""
    return typer.main.get_command(build_app())


def _click_exceptions() -> Any:
    """The click exceptions typer raises: its vendored click (typer 0.2x+), else click itself."""
    try:
        from typer._click import exceptions
    except ImportError:  # typer releases that depend on click
        from click import exceptions  # type: ignore[no-redef]
    return exceptions


def _invoke(argv: list[str]) -> int:
    """Parse ``argv`` with typer and run the command; click's usage errors become one-line ``UsageError``."""
    ex = _click_exceptions()
    command = _click_command()
    raised = None
    try:
        code = command.main(args=argv, prog_name="kvaudit", standalone_mode=False)
    except _Raised as e:  # raised below, outside this handler, so that its own cause and context stay its own
        raised = e.raised
    except ex.UsageError as e:  # click's usage errors: several lines with the usage; here one, naming the command
        where = e.ctx.command_path.partition(" ")[2] if e.ctx is not None else ""
        raise UsageError((f"{where}: " if where else "") + e.format_message()) from None
    except ex.ClickException as e:
        raise UsageError(e.format_message()) from None
    except typer.Abort:
        raise KeyboardInterrupt from None
    if raised is not None:
        raise raised
    return code if isinstance(code, int) else 0


def _print_help_to_stderr() -> None:
    import contextlib

    with contextlib.redirect_stdout(sys.stderr):
        _invoke(["--help"])


def _elsewhere(argv: list[str], debug: bool = False) -> int | None:
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
    if debug:
        env["KVAUDIT_DEBUG"] = "1"
    _note(f"kvaudit: running with {exe} (its vLLM plans)")
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run([str(exe), "-m", "kvaudit", *rest], env=env).returncode


class _PipeGuard:
    """stdout or stderr that a closed reader cannot break: after the first broken pipe (``kvaudit ... | head``)
    the rest of the output is dropped and the command runs on, so its exit code is still the verdict; text its
    encoding cannot hold is written with replacement characters."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.broken = False

    def _drop(self) -> None:
        self.broken = True
        try:  # the stream's own buffer is flushed once more at exit: into /dev/null, not the closed pipe
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no file descriptor (a test's captured stream)
            pass

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                return self._stream.write(text)
            except UnicodeEncodeError:  # text the terminal's encoding cannot show (a lone surrogate from a file)
                encoding = getattr(self._stream, "encoding", None) or "utf-8"
                return self.write(text.encode(encoding, "replace").decode(encoding, "replace"))
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _one_line(text: str, limit: int = 400) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _interrupted(e: BaseException | None) -> bool:
    """Whether Ctrl-C ended the command: a KeyboardInterrupt, or an error raised because of one (Python
    turns an interrupt inside a class body's ``__set_name__`` into a RuntimeError whose cause it is)."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


def _failure(e: BaseException) -> tuple[int, str]:
    """The exit code and the one line for an exception that ended a command."""
    if isinstance(e, KvauditError):
        return e.exit_code, f"kvaudit: error: {e.message}"
    if isinstance(e, ModuleNotFoundError) and not (e.name or "").startswith("kvaudit"):
        missing = missing_dependency(e)  # a package this command needs (torch, vLLM, ...) is not installed
        return missing.exit_code, f"kvaudit: error: {missing.message}"
    if _interrupted(e):
        return EXIT_INTERRUPTED, "kvaudit: interrupted"
    if isinstance(e, MemoryError):
        return EXIT_NOT_MEASURED, "kvaudit: error: this host ran out of memory (nothing was measured)"
    where = ""
    tb = e.__traceback__
    while tb is not None:  # the innermost frame, to name in the report
        where = f" at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return EXIT_BUG, (f"kvaudit: internal error (a bug in kvaudit, not a finding): {type(e).__name__}: "
                      f"{_one_line(e) or '-'}{where}; rerun with --debug for the traceback and report it "
                      f"(exit {EXIT_BUG})")


def _wants_json(argv: list[str]) -> bool:
    """Whether the command line asks for JSON (``--format json`` or ``--format=json``), read as given: the error
    may be in the parsing itself."""
    return any(a == "--format=json" or a == "--format" and argv[i + 1:i + 2] == ["json"] for i, a in enumerate(argv))


def error_json(code: int, line: str) -> str:
    """The JSON object of an ending that is no report: bad input, nothing measured, a bug, an interrupt."""
    import json

    message = line.removeprefix("kvaudit: ").removeprefix("error: ")
    return json.dumps({"schema_version": 1, "kvaudit_version": __version__, "error": message, "exit_code": code,
                       "exit_reason": EXIT_CODES[code]})


def main(argv: list[str] | None = None) -> int:
    """Run the CLI and return its exit code (``kvaudit.errors.EXIT_CODES``); every error is one line on
    stderr, with its traceback under ``--debug`` (anywhere on the command line) or ``KVAUDIT_DEBUG=1``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or os.environ.get("KVAUDIT_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    streams = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _PipeGuard(sys.stdout), _PipeGuard(sys.stderr)
    try:
        return _main(argv, debug)
    except SystemExit as e:  # shell completion exits through sys.exit
        return e.code if isinstance(e.code, int) else 0 if e.code is None else EXIT_BAD_INPUT
    except BaseException as e:  # noqa: BLE001 - every ending is mapped to a documented exit code
        code, line = _failure(e)
        if debug:
            import traceback

            traceback.print_exception(type(e), e, e.__traceback__, file=sys.stderr)
        print(line, file=sys.stderr)
        if _wants_json(argv):  # a pipeline that parses stdout gets the ending too (kvaudit/error.schema.json)
            sys.stdout.write(error_json(code, line) + "\n")
        return code
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = streams


def _main(argv: list[str], debug: bool) -> int:
    code = _elsewhere(argv or [], debug)
    if code is not None:
        return code
    if not argv and "_KVAUDIT_COMPLETE" not in os.environ:  # (shell completion runs with no arguments)
        _print_help_to_stderr()
        return EXIT_BAD_INPUT
    return _invoke(_with_model_named(argv))


def _with_model_named(argv: list[str]) -> list[str]:
    """The command line with a model named as vLLM takes one (``vllm serve MODEL``) made explicit:
    ``kvaudit MODEL ...`` audits it, and ``kvaudit audit|plan MODEL ...`` takes it as ``--model`` (``--preset``
    for a shipped preset's name). MODEL is a Hub id (org/name), a model folder or a config.json."""
    from kvaudit.hub import is_hub_id

    def named(word: str) -> bool:
        return not word.startswith("-") and (is_hub_id(word) or os.path.exists(os.path.expanduser(word)))

    first = argv[0] if argv else "-"
    if first.startswith("-") or first in (*COMMANDS, *PRESETS):
        if first in ("audit", "plan") and len(argv) > 1 and (argv[1] in PRESETS or named(argv[1])):
            return [first, "--preset" if argv[1] in PRESETS else "--model", *argv[1:]]
        return argv
    if named(first):
        return ["audit", "--model", *argv]
    raise UsageError(f"unknown preset or command {first!r}, and no such file (presets: {', '.join(PRESETS)}; "
                     f"commands: {', '.join(COMMANDS)}; or a Hub id org/name, a model folder, a config.json)")


def run() -> None:
    """Console-script entry point.

    Once vLLM is loaded the process holds its modules, a gloo group and the models built on ``meta``,
    whose teardown at interpreter exit takes seconds (about 5 s of a 14 s audit here) and does
    nothing kvaudit needs; so after the output is flushed and kvaudit's own temp files are removed,
    the process ends at once. So does an interrupted one: Ctrl-C can land inside a library's import,
    leaving half-built objects (a logging handler with no stream) whose teardown at exit would print a
    traceback after "kvaudit: interrupted"."""
    code = main()
    plan = sys.modules.get("kvaudit.plan")
    if plan is None and code != EXIT_INTERRUPTED:
        sys.exit(code)
    if plan is not None:
        plan.remove_temp_dirs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
