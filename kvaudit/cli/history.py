"""``kvaudit history MODEL``: every published vllm-ascend release's own allocation code on one deployment."""

from __future__ import annotations

import sys
from typing import Any

from kvaudit.cli import deployments
from kvaudit.cli.options import (DEPLOYMENT_OPTIONS, FORMAT, HTML, MODEL_ARGUMENT, REVISION, SINCE, SVG,
                                 TRUST_REMOTE_CODE)
from kvaudit.cli.output import check_outputs, note, page_hint, show, write_text_pages
from kvaudit.errors import UsageError
from kvaudit.model.deployment import PRESETS

NAME = "history"
OPTIONS = (MODEL_ARGUMENT, REVISION, TRUST_REMOTE_CODE, SINCE, *DEPLOYMENT_OPTIONS, FORMAT, HTML, SVG)
HELP = "Audit every published vllm-ascend release's own code on one model: where it changed."
DESCRIPTION = ("Audit every published vllm-ascend release's own KV-cache allocation code (from its sdist, "
               "fetched once into the cache) on one deployment, in one process, on the meta meter: one row "
               "per release with its ratio, storages and verdict, and the release where the ratio changed "
               "with the pull request behind it where known.")


def run(a: Any) -> int:
    """Every published vllm-ascend release's own allocation code on one deployment; table or JSON."""
    import json

    from kvaudit.ci.history import history, published, render
    from kvaudit.plan.planner import vllm_version

    check_outputs(a.html, a.svg)
    a.preset, a.config = (a.model, None) if a.model in PRESETS else (None, a.model)
    spec, p = deployments.model(a)
    d = deployments.deployment(a, spec, p)
    versions, source = published(a.since)
    if not versions:
        raise UsageError(f"no vllm-ascend release from {a.since} on in {source}")
    note(f"kvaudit: auditing {len(versions)} vllm-ascend releases from {source} on the meta meter, planned by "
         f"vLLM {vllm_version()} (first fetch of each sdist takes a few seconds)")
    rows = history(d, versions, progress=lambda v: note(f"  {v}"))  # (in a CI log too: a cold run takes minutes)
    head = (f"{spec.name}: TP {d.tp}, util {d.gpu_memory_utilization}, planned by vLLM {vllm_version()}, meter "
            "meta (accounting, not a device measurement)")
    if a.fmt == "json":
        doc = {"model": spec.name, "deployment": d.to_dict(), "planned_with_vllm": vllm_version(),
               "meter": "meta", "releases": [r.to_dict() for r in rows]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        show(render(rows, head))
        page_hint(a)
    if a.html or a.svg:  # (the table and chart, rendered again only for a page)
        write_text_pages(a, render(rows, head), f"kvaudit history {spec.name}", head)
    audited = [r for r in rows if r.ratio is not None]
    return 1 if any(r.verdict == "FAIL" for r in audited) and audited[-1].verdict == "FAIL" else (
        0 if audited else 3)
