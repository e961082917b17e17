"""The memory ledger of a triaged report: each term of vLLM's KV budget as the report states it (with its line) and
as kvaudit predicts it, and the inequality of that budget the figures break.

vLLM's worker budgets one rank's memory at start-up (``Worker.determine_available_memory``)::

    KV budget = device memory × gpu_memory_utilization − weights − peak activation − non-torch − graphs

then refuses to start (``check_enough_kv_cache_memory``) when the KV budget is not positive ("No available memory
for the cache blocks") or holds less than one request of ``max_model_len`` ("To serve at least one request with
the model's max seq len ..."). Every later out-of-memory error is an allocation the budget did not leave room for:
the device's free memory, less than what was asked. Each row's reported figure comes from the report's own lines
(vLLM's log formats, torch's out-of-memory message, smi tables), its predicted figure from kvaudit's memory model
(``kvaudit.model.memory``) and vLLM's planner (``kvaudit.plan.planner.request_need``). The verdict takes the
reported figure where there is one and says which it used.

Plain data in (facts, a deployment, a request's need); no vLLM import here.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from kvaudit.units import fmt_bytes

TERMS = {
    "device memory": "the device's memory, as torch reports it",
    "budget": "device memory × gpu_memory_utilization: what vLLM may use",
    "weights": "the model's weights on this rank",
    "peak activation": "the profile run's activation peak (forward pass and sampler)",
    "non-torch": "memory outside torch's allocator (collective buffers, workspaces)",
    "graphs": "CUDA/ACL graph memory",
    "KV budget": "what is left for the KV cache",
    "KV for one request": "the KV cache one request of max_model_len needs (vLLM's start-up check)",
    "KV allocated": "the KV cache the allocator allocates for vLLM's plan",
    "failing allocation": "the allocation that ran out",
    "free when it ran out": "the device's free memory the failing allocation met",
    "this process": "device memory this process held when it ran out",
    "outside this process": "device memory held when it ran out by neither this process nor free",
}
"""The ledger's terms, in the order of vLLM's budget; each row of ``Ledger.rows`` is one of them."""

REPORTED = {
    "device memory": ("device_memory",),
    "budget": ("requested_memory",),
    "weights": ("weights", "profiled_weights"),
    "peak activation": ("peak_activation",),
    "non-torch": ("non_torch",),
    "graphs": ("cudagraph_memory", "cudagraph_estimate", "graph_capture"),
    "KV budget": ("available_kv", "kv_cache_memory"),
    "KV for one request": ("kv_needed",),
}
"""The facts (``kvaudit.triage.evidence``, most from vLLM's own log formats) that state each term, in order of trust."""

PHASE_TERMS = {
    "weight loading": ("weights", "weights", "the weights"),
    "memory profiling": ("peak activation", "memory-profiling", "the profile run's activations"),
    "CUDA/ACL graph capture": ("graphs", "graph-capture", "the graphs"),
    "kv-cache allocation": ("KV allocated", "budget-did-not-fit", "the KV cache"),
    "serving requests": ("peak activation", "activations-while-serving", "activations while serving"),
    "warm-up": ("peak activation", "utilization-too-high", "the warm-up after graph capture, outside the budget"),
}
"""The term each phase of vLLM's start-up and serving allocates (``kvaudit.triage.evidence.PHASES``), the cause
(``kvaudit.triage.causes.CAUSES``) an allocation of that term that met too little free memory is, and its words."""

_OOM_TERMS = {"failing allocation": "tried", "free when it ran out": "free", "this process": "held_here",
              "outside this process": "held_outside"}
"""Ledger terms torch's out-of-memory line states, and the ``kvaudit.measure.oom.OomMessage`` field of each."""

_MODEL_TERMS = {"peak activation": "peak_activation", "non-torch": "non_torch", "graphs": "cuda_graphs"}
"""Ledger terms and the ``kvaudit.model.memory.Term`` key that predicts each."""


@dataclass(frozen=True)
class Row:
    """One term: the report's figure with the line that states it, and kvaudit's with how it was made."""

    term: str
    reported: int | None = None
    reported_at: str = ""
    """``line N: <text>`` of the figure reported."""
    predicted: int | None = None
    predicted_by: str = ""

    @property
    def value(self) -> int | None:
        """The figure the verdict uses: the reported one where the report states it."""
        return self.reported if self.reported is not None else self.predicted

    @property
    def source(self) -> str:
        """Where ``value`` comes from."""
        if self.reported is not None:
            return self.reported_at
        return f"predicted: {self.predicted_by}" if self.predicted is not None else "unknown"

    @property
    def difference(self) -> int | None:
        """Reported − predicted, where both are known."""
        if self.reported is None or self.predicted is None:
            return None
        return self.reported - self.predicted

    def to_dict(self) -> dict[str, Any]:
        """JSON form (bytes)."""
        return {"term": self.term, "reported": self.reported, "reported_at": self.reported_at or None,
                "predicted": self.predicted, "predicted_by": self.predicted_by or None,
                "difference": self.difference}


@dataclass(frozen=True)
class Breach:
    """The inequality of vLLM's budget the figures break, and what it means."""

    cause: str
    """A key of ``kvaudit.triage.causes.CAUSES``."""
    inequality: str
    """The inequality with its figures, each with its source ("weights 70.1 GiB (line 12) > budget 64 GiB")."""
    term: str
    """The deciding term (a key of ``TERMS``)."""


@dataclass(frozen=True)
class Ledger:
    """Every term of one rank's memory, reported beside predicted."""

    rows: tuple[Row, ...]
    utilization: float | None = None
    max_model_len: int | None = None
    fits_max_model_len: int | None = None
    """vLLM's ``estimate_max_model_len`` for the KV budget: the report's where its refusal states one, else kvaudit's
    (vLLM's function on the predicted rank's layer specs)."""
    fits_at: str = ""
    """``line N: <text>`` of a reported estimate; empty for kvaudit's."""
    component: tuple[str, str] | None = None
    """The package whose code asked for the allocation that ran out, where it is no part of vLLM's runtime (a KV
    connector, a plugin, a trainer), with the ``line N: ...`` of its frame."""

    def row(self, term: str) -> Row:
        """The row of ``term`` (an empty one where nothing is known of it)."""
        return next((r for r in self.rows if r.term == term), Row(term))

    def value(self, term: str) -> int | None:
        """The figure of ``term`` the verdict uses."""
        return self.row(term).value

    def with_allocation(self, allocated: int, planned: int, by: str, failing: int | None = None) -> Ledger:
        """The ledger with the audit's rows: what the allocator (``by``) allocates for vLLM's plan of ``planned``
        bytes, and the allocation where a device of this size runs out under it (``failing``), where it does."""
        new = {"KV allocated": Row("KV allocated", None, "", allocated, f"{by}, for vLLM's plan of {fmt_bytes(planned)}")}
        if failing is not None:
            old = self.row("failing allocation")
            new["failing allocation"] = dataclasses.replace(old, predicted=failing,
                                                            predicted_by=f"where {by} runs out on this device")
        order = list(TERMS)
        rows = sorted([r for r in self.rows if r.term not in new] + list(new.values()), key=lambda r: order.index(r.term))
        return dataclasses.replace(self, rows=tuple(rows))

    def to_dict(self) -> list[dict[str, Any]]:
        """JSON form: the rows."""
        return [r.to_dict() for r in self.rows if r.reported is not None or r.predicted is not None]

    def breach(self, phase: str | None = None) -> Breach | None:
        """The inequality of vLLM's budget these figures break, first in budget order: the weights over the device,
        the weights over the utilization's budget, no KV budget, a KV budget short of one request of max_model_len, the
        memory held outside this process beyond what the utilization leaves free; then, at the phase the frames name
        (``PHASE_TERMS``), the allocation of that phase's term that met less free memory than it asked; last, this
        process holding more than vLLM's budget (and a GiB): a term vLLM budgeted grew past what it planned, which
        term the traceback or the weights' figure tells (``over-budget``). ``None`` where none breaks (or the figures
        to tell are missing)."""
        T, W, K, R = (self.value(t) for t in ("device memory", "weights", "KV budget", "KV for one request"))
        u = self.utilization
        budget = self.value("budget") if self.row("budget").reported is not None else (
            int(T * u) if T and u else None)
        if T and W is not None and W > T and phase in (None, "weight loading", "memory profiling", "kv-cache planning"):
            return Breach("weights", f"weights {self._at('weights')} > device memory {self._at('device memory')}",
                          "weights")
        over = budget is not None and W is not None and W >= budget
        if K is not None and K <= 0 and self.row("KV budget").reported is not None:  # vLLM's own figure decides
            return Breach("no-room-for-kv-cache", f"KV budget {self._at('KV budget')} ≤ 0" + (
                f"; weights {self._at('weights')} ≥ budget {fmt_bytes(budget)} ({u} × {self._at('device memory')})"
                if over else ""), "KV budget")
        if over and phase in (None, "weight loading", "memory profiling", "kv-cache planning"):
            return Breach("weights", f"weights {self._at('weights')} ≥ budget {fmt_bytes(budget)} ({u} × "
                          f"{self._at('device memory')})", "weights")
        if K is not None and K <= 0:
            return Breach("no-room-for-kv-cache", f"KV budget {self._at('KV budget')} ≤ 0", "KV budget")
        if K is not None and R is not None and R > K:
            return Breach("budget-too-small-for-max-model-len",
                          f"KV for one request of {self.max_model_len:,} tokens {self._at('KV for one request')} > "
                          f"KV budget {self._at('KV budget')}" if self.max_model_len else
                          f"KV for one request {self._at('KV for one request')} > KV budget {self._at('KV budget')}",
                          "KV for one request")
        if self.component is not None:
            name, at = self.component
            return Breach("outside-budget", f"the allocation that ran out ({self._at('failing allocation')}) is "
                          f"{name}'s ({at.split(':', 1)[0]}), memory vLLM's budget does not hold", "failing allocation")
        outside = self.row("outside this process")
        if T and u and outside.value is not None and outside.value > (1 - u) * T + (1 << 30):
            return Breach("another-process", f"held outside this process {self._at('outside this process')} > "
                          f"what the utilization leaves free, (1 − {u}) × {fmt_bytes(T)} = {fmt_bytes(int((1 - u) * T))}",
                          "outside this process")
        tried, free = self.row("failing allocation").reported, self.row("free when it ran out").reported
        if phase in PHASE_TERMS and tried is not None and free is not None and tried > free:
            _, cause, what = PHASE_TERMS[phase]
            return Breach(cause, f"the failing allocation {self._at('failing allocation')} > free when it ran out "
                          f"{self._at('free when it ran out')}, allocating {what} ({phase})", "failing allocation")
        here = self.row("this process").reported
        if T and u and here is not None and here > u * T + (1 << 30):
            return Breach("over-budget", f"held by this process {self._at('this process')} > vLLM's budget, {u} × "
                          f"{fmt_bytes(T)} = {fmt_bytes(int(u * T))}", "this process")
        return None

    def _at(self, term: str) -> str:
        r = self.row(term)
        where = r.reported_at.split(":", 1)[0] if r.reported is not None else "predicted"
        return f"{fmt_bytes(r.value)} ({where})" if r.value is not None else "unknown"


def reported(facts: Any, term: str) -> Any:
    """The fact that states ``term`` in a report (``REPORTED``, in order of trust), or ``None``."""
    return next((x for key in REPORTED.get(term, ()) for x in facts.all(key) if isinstance(x.value, int)), None)


def build(facts: Any, d: Any = None, need: Any = None,
          stated: dict[str, tuple[int, str]] | None = None, utilization: float | None = None,
          weights: tuple[int, str] | None = None) -> Ledger:
    """The ledger of a report's facts (``kvaudit.triage.evidence.Evidence``) beside the deployment kvaudit predicts
    (``d``: a ``Deployment`` planned from the report's settings alone, or ``None``), the KV one request needs
    (``need``: ``kvaudit.plan.planner.RequestNeed``). ``stated``: a
    term's reported figure and its ``line N: ...`` where the report states it otherwise than by a fact of
    ``REPORTED`` (a device's memory read from its name); ``utilization``: the one the report runs at, where no
    deployment gives it; ``weights``: a prediction of the weights per rank and how it was made, where no deployment
    gives one (the parameter count a model's name states)."""
    rows = []
    terms = {t.key: t for t in (d.overhead_terms if d is not None else ())}
    for term in TERMS:
        f = reported(facts, term)
        said, at = (f.value, f.source) if f is not None else (None, "")
        if said is None and stated and term in stated:
            said, at = stated[term]
        predicted, by = None, ""
        if d is not None:
            if term == "device memory" and not d.device_memory_given:  # (a size given is the report's, not a prediction)
                predicted, by = d.device_memory_bytes, f"the {d.device} device, assumed"
            elif term == "budget":
                predicted, by = int(d.device_memory_bytes * d.gpu_memory_utilization), (
                    f"{d.gpu_memory_utilization} × {fmt_bytes(d.device_memory_bytes)}")
            elif term == "weights":
                predicted, by = d.weights_bytes, d.weights_source
            elif term in _MODEL_TERMS and _MODEL_TERMS[term] in terms:
                t = terms[_MODEL_TERMS[term]]
                predicted, by = t.bytes, t.source + ("" if t.budgeted else " (not subtracted from the budget)")
            elif term == "KV budget":
                predicted, by = d.kv_budget_bytes, "budget − weights − the terms above"
        elif term == "weights" and weights is not None:
            predicted, by = weights
        if term == "KV for one request" and need is not None:
            predicted, by = need.bytes, f"vLLM's max_memory_usage_bytes for {need.max_model_len:,} tokens"
        if term in _OOM_TERMS and (oom := facts.first("oom")) is not None:
            figure = getattr(oom.value, _OOM_TERMS[term])
            if figure is not None:
                said, at = figure, oom.source
        if said is not None or predicted is not None:
            rows.append(Row(term, said, at, predicted, by))
    est = facts.first("estimated_max_model_len")
    mml = facts.first("max_model_len")
    return Ledger(tuple(rows), d.gpu_memory_utilization if d is not None else utilization,
                  need.max_model_len if need is not None else d.max_model_len if d is not None else
                  mml.value if mml is not None else None,
                  est.value if est is not None else need.fits_max_model_len if need is not None else None,
                  est.source if est is not None else "",
                  (owner.value, owner.source) if (owner := facts.first("oom_package")) is not None else None)
