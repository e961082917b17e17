"""Run a model runner's KV-cache allocation method outside its runner, unchanged.

The method is read from source (an installed package or a release's sdist) without importing its
module, which would need the accelerator stack. kvaudit compiles it with the helper methods and
module-level helpers it calls (taken from the same source tree) and the module-level values they read
(computed as the module's import computes them), binds the names it imports from
torch and vLLM to the installed ones, and calls it on a stand-in ``self`` that provides only the
attributes kvaudit knows. Anything else the code reads stops the audit with exit 3, naming it.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import copy
import functools
import importlib
import importlib.abc
import importlib.util
import sys
import tarfile
import zlib
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from kvaudit.errors import StrategyFailed

ALLOCATE = "_allocate_kv_cache_tensors"
INITIALIZE = "initialize_kv_cache_tensors"


_OTHER_FILES = ("Dockerfile", "docs/source/user_guide/release_notes.md")
"""Besides the Python sources: the vLLM a release pins (its Dockerfile's ``VLLM_TAG``) and its notes."""


MAX_MEMBER_BYTES = 4 << 20
"""The largest source file read from a release's sdist (vllm-ascend's largest, 0.30's ``model_runner_v1.py``: 0.3 MB):
a larger member is no release's (a 1 GiB one once took 2.6 GB of memory to read)."""
MAX_SOURCE_BYTES = 256 << 20
"""The most source read from one sdist in all (vllm-ascend 0.30: 22.6 MB of Python in 1,896 files)."""


class SourceTree:
    """Python sources of one package release: a directory on disk or an sdist tarball."""

    def __init__(self, label: str, root: Path | None = None, tarball: Path | None = None) -> None:
        self.label = label
        self.root, self.tarball = root, tarball
        self._members: dict[str, str] | None = None
        self._parsed: dict[str, ast.Module] = {}

    def read(self, rel: str) -> str | None:
        """The text of ``rel`` (e.g. ``vllm_ascend/utils.py``; of the other files, ``_OTHER_FILES``), or
        ``None`` if absent."""
        if self.root is not None:
            p = self.root / rel
            return p.read_text(encoding="utf-8") if p.is_file() else None
        if self._members is None:  # one pass over the archive: every .py file, keyed by its path
            members: dict[str, str] = {}
            total = 0
            try:
                with tarfile.open(self.tarball) as tf:  # type: ignore[arg-type]
                    for m in tf:
                        rest = m.name.partition("/")[2]
                        if not (m.isfile() and (rest.endswith(".py") or rest in _OTHER_FILES)):
                            continue
                        total += m.size
                        if m.size > MAX_MEMBER_BYTES or total > MAX_SOURCE_BYTES:
                            raise StrategyFailed(
                                f"{self.label}: {self.tarball} is not a release's source: {m.name} is {m.size:,} B"
                                + (f" (a source file is at most {MAX_MEMBER_BYTES:,} B here)" if m.size > MAX_MEMBER_BYTES
                                   else f", past {MAX_SOURCE_BYTES:,} B of sources in all"))
                        if (f := tf.extractfile(m)) is not None:
                            members[rest] = f.read(MAX_MEMBER_BYTES + 1).decode("utf-8", errors="replace")
            except (tarfile.TarError, EOFError, OSError, zlib.error) as e:  # EOFError: a gzip stream cut short
                raise StrategyFailed(f"{self.label}: cannot read {self.tarball}: {type(e).__name__}: "
                                     f"{' '.join(str(e).split()) or 'truncated'}") from None
            self._members = members
        return self._members.get(rel)

    def parse(self, rel: str | None) -> ast.Module | None:
        """The syntax tree of ``rel`` (an empty module where the file is absent), parsed once per tree: one
        release's code reads the same files many times (``vllm_ascend/utils.py`` ten times for 0.29). Shared:
        what is compiled from it is compiled as it is or from a copy (``_bare``), never changed in place."""
        if rel is None:
            return None
        if rel not in self._parsed:
            self._parsed[rel] = ast.parse(self.read(rel) or "", filename=rel)
        return self._parsed[rel]

    def module_file(self, module: str) -> str | None:
        """The relative path of a dotted module in this tree, if it is there."""
        base = module.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            if self.read(rel) is not None:
                return rel
        return None


def installed_tree(package: str, label: str) -> SourceTree | None:
    """The installed ``package``'s sources, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return SourceTree(label, root=Path(list(spec.submodule_search_locations)[0]).parent)


class Unprovided(StrategyFailed, AttributeError):
    """Allocation code read a runner attribute kvaudit does not provide: exit 3, naming it. Being an
    ``AttributeError`` too, code that guards with ``getattr(self, name, default)`` gets the default, as
    it would on a runner whose ``__init__`` did not set that attribute."""


class _Attrs:
    """A stand-in object: known attributes only; reading any other one names it and stops."""

    def __init__(self, owner: str, path: str, values: dict[str, Any]) -> None:
        object.__setattr__(self, "_owner", owner)
        object.__setattr__(self, "_path", path)
        for k, v in values.items():
            object.__setattr__(self, k, _Attrs(owner, f"{path}.{k}", v) if isinstance(v, dict) else v)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise Unprovided(f"{self._owner} reads {self._path}.{name}, which kvaudit's runner stand-in "
                         "does not provide (a version kvaudit does not know yet)")


def _missing(label: str, name: str, origin: str) -> type:
    """A placeholder for a name the code imports but kvaudit cannot load: harmless until used. Used as a
    class in ``isinstance``/``issubclass`` it matches nothing, which is exact: every object the code
    gets (vLLM's plan and specs, the built model's layers) is vLLM's, never one of a class kvaudit
    cannot load. Called, or read from, it stops the audit naming itself."""
    def fail(*_a: Any, **_k: Any) -> Any:
        raise StrategyFailed(f"{label}'s allocation code uses {name} (from {origin}), which kvaudit cannot load")

    meta = type(f"Missing_{name}_meta", (type,), {"__instancecheck__": lambda c, o: False,
                                                  "__subclasscheck__": lambda c, o: False,
                                                  "__call__": fail, "__getattr__": lambda c, a: fail(),
                                                  "__iter__": fail, "__contains__": fail, "__len__": fail})
    return meta(name, (), {})


@dataclass
class Extracted:
    """An allocation method compiled from source, ready to call on a stand-in runner."""

    label: str
    method: str
    """Where the code came from, e.g. ``NPUModelRunner._allocate_kv_cache_tensors``."""
    functions: dict[str, Callable] = field(repr=False)
    helpers: tuple[str, ...]
    """Module-level helpers taken from the same source tree."""

    package: str = "vllm_ascend"
    """The code's own package: imports of it inside functions get placeholders when it is not installed."""
    reads_layer_strides: bool = False
    """The code reads ``KVCacheTensor.layer_stride`` (vLLM 0.29+'s plan format, vllm-ascend 0.28+):
    it must be handed vLLM's own ``KVCacheConfig``, not the ``shared_by`` view."""

    def call(self, kv_cache_config: Any, attributes: dict[str, Any], methods: dict[str, Callable] | None = None,
             modules: dict[str, dict[str, Any]] | None = None) -> dict:
        """Run the allocation on a stand-in ``self`` carrying ``attributes`` and, besides the extracted
        ones, ``methods`` (the runner's base-class methods the code calls, e.g. vLLM's own); ``modules``
        are modules of the code's package with known contents (what its build writes)."""
        runner = stand_in(f"{self.label}'s {self.method}", "self", attributes, {**(methods or {}), **self.functions})
        return run_extracted(self.functions[ALLOCATE], runner, kv_cache_config, label=self.label,
                             package=self.package, known=modules)


def extract_allocator(tree: SourceTree, module: str, class_name: str,
                      known: dict[str, dict[str, Any]] | None = None) -> Extracted:
    """Compile ``class_name``'s allocation method of ``module`` (from ``tree``) and what it calls. ``known``:
    modules of the code's package with known contents (what its build writes, ``releases.build_info``),
    for the module-level values the code reads that its package computes when imported (``_Loader.value``)."""
    rel = tree.module_file(module)
    if rel is None:
        raise StrategyFailed(f"{tree.label} has no {module}")
    mod = tree.parse(rel)
    cls = next((n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == class_name), None)
    if cls is None:
        raise StrategyFailed(f"{tree.label}: {module} defines no class {class_name}")
    methods = {n.name: n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    if ALLOCATE in methods:
        entry, where = methods[ALLOCATE], f"{class_name}.{ALLOCATE}"
    elif INITIALIZE in methods:
        entry, where = _cut_allocation_loop(methods[INITIALIZE], tree.label), f"{class_name}.{INITIALIZE} (its allocation loop)"
    else:
        raise StrategyFailed(f"{tree.label}: {class_name} has neither {ALLOCATE} nor {INITIALIZE}")
    params = [a.arg for a in entry.args.posonlyargs + entry.args.args]
    if params != ["self", "kv_cache_config"] or entry.args.kwonlyargs or entry.args.vararg:
        raise StrategyFailed(f"{tree.label}: {where}({', '.join(params)}) has a signature kvaudit does not know "
                             "(it calls method(self, kv_cache_config))")
    chosen = {ALLOCATE: entry}
    todo = [entry]
    while todo:
        for called in _self_methods(todo.pop(), methods):
            if called not in chosen:
                chosen[called] = methods[called]
                todo.append(methods[called])
    namespace: dict[str, Any] = {"__name__": f"kvaudit_extracted_{module}", "__builtins__": builtins}
    loader = _Loader(tree, known)
    loader.bind(rel, mod, list(chosen.values()), namespace)
    compiled = ast.Module(body=[_bare(fn) for fn in chosen.values()], type_ignores=[])
    exec(compile(ast.fix_missing_locations(compiled), f"{tree.label}:{rel}", "exec"), namespace)
    read = {n.attr for fn in list(chosen.values()) + loader.nodes for n in ast.walk(fn) if isinstance(n, ast.Attribute)}
    return Extracted(tree.label, where, {name: namespace[name] for name in chosen}, tuple(loader.helpers),
                     module.split(".")[0], "layer_stride" in read)


class _PlaceholderModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves ``package`` and its submodules, when the package is not installed, as modules whose every
    name is a ``_missing`` placeholder: what allocation code imports inside a function (``from
    vllm_ascend.core.kv_cache_interface import X``) then behaves as its module-level imports do."""

    def __init__(self, package: str, label: str, known: dict[str, dict[str, Any]]) -> None:
        self.package, self.label, self.known = package, label, known
        self.made: list[str] = []

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:  # noqa: D102
        if fullname == self.package or fullname.startswith(self.package + "."):
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> Any:  # noqa: D102
        mod = types.ModuleType(spec.name)
        mod.__path__ = []  # type: ignore[attr-defined]
        if spec.name in self.known:
            mod.__dict__.update(self.known[spec.name])
        else:
            mod.__getattr__ = functools.partial(self.attribute, spec.name)  # type: ignore[attr-defined]
        self.made.append(spec.name)
        return mod

    def exec_module(self, module: Any) -> None:  # noqa: D102
        return None

    def attribute(self, module: str, name: str) -> Any:
        """A name of a placeholder module: a known submodule (``from vllm_ascend import _build_info``),
        else a placeholder; dunders (``getattr(_build_info, "__device_type__", None)``) are absent."""
        if f"{module}.{name}" in self.known:
            return importlib.import_module(f"{module}.{name}")
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(self.label, name, module)


@contextlib.contextmanager
def _placeholder_package(package: str, label: str, known: dict[str, dict[str, Any]]) -> Iterator[None]:
    if importlib.util.find_spec(package) is not None:  # installed (an Ascend host): the real modules
        yield
        return
    finder = _PlaceholderModules(package, label, known)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in finder.made:
            sys.modules.pop(name, None)


def run_extracted(fn: Callable, owner: Any, *args: Any, label: str, package: str = "vllm_ascend",
                  known: dict[str, dict[str, Any]] | None = None) -> Any:
    """Call ``fn`` (an extracted method) on ``owner`` (a ``stand_in``), the code's own package served as it
    is for allocation code: ``known`` modules (what its build writes), placeholders for the rest."""
    with _placeholder_package(package, label, known or {}):
        return fn(owner, *args)


def stand_in(label: str, path: str, attributes: dict[str, Any], methods: dict[str, Any] | None = None) -> Any:
    """An object with ``attributes`` and ``methods`` only, for extracted code to read (``self.model_runner``);
    reading anything else names it (``path``) and stops."""
    return type("StandIn", (_Attrs,), dict(methods or {}))(label, path, attributes)


def class_literals(tree: SourceTree, module: str, class_name: str) -> dict[str, Any]:
    """The class-level names of ``class_name`` bound to literals (``supports_x = True``)."""
    rel = tree.module_file(module)
    mod = tree.parse(rel)
    cls = next((n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == class_name), None) if mod else None
    return _constants(ast.Module(body=cls.body, type_ignores=[])) if cls else {}


def extract_method(tree: SourceTree, module: str, class_name: str, name: str,
                   known: dict[str, dict[str, Any]] | None = None) -> Callable | None:
    """One method of ``class_name`` in ``module`` (from ``tree``), compiled alone, or ``None`` where the
    class has no such method: a runner base-class method the allocation code calls. ``known`` as for
    ``extract_allocator``."""
    rel = tree.module_file(module)
    mod = tree.parse(rel)
    cls = next((n for n in mod.body if isinstance(n, ast.ClassDef) and n.name == class_name), None) if mod else None
    fn = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None) if cls else None
    if rel is None or mod is None or fn is None:
        return None
    namespace: dict[str, Any] = {"__name__": f"kvaudit_extracted_{module}", "__builtins__": builtins}
    _Loader(tree, known).bind(rel, mod, [fn], namespace)
    exec(compile(ast.fix_missing_locations(ast.Module(body=[_bare(fn)], type_ignores=[])), f"{tree.label}:{rel}",
                 "exec"), namespace)
    return namespace[name]


def _cut_allocation_loop(fn: ast.FunctionDef, label: str) -> ast.FunctionDef:
    """vllm-ascend <= 0.11: the allocation is the top of ``initialize_kv_cache_tensors``, from the
    start through the completeness ``assert`` after the ``kv_cache_tensors`` loop; the rest reshapes."""
    body, seen_loop, raw_name = [], False, None
    for st in fn.body:
        body.append(st)
        if raw_name is None and isinstance(st, (ast.Assign, ast.AnnAssign)) and isinstance(st.value, ast.Dict):
            target = st.targets[0] if isinstance(st, ast.Assign) else st.target
            raw_name = target.id if isinstance(target, ast.Name) else None
        if isinstance(st, ast.For) and ast.unparse(st.iter) == "kv_cache_config.kv_cache_tensors":
            seen_loop = True
        if seen_loop and isinstance(st, ast.Assert):
            break
    else:
        raise StrategyFailed(f"{label}: {INITIALIZE} has no allocation loop kvaudit recognizes")
    if raw_name is None:
        raise StrategyFailed(f"{label}: {INITIALIZE} builds no raw-tensor dict kvaudit recognizes")
    body.append(ast.copy_location(ast.Return(value=ast.Name(id=raw_name, ctx=ast.Load())), body[-1]))
    cut = ast.FunctionDef(name=ALLOCATE, args=fn.args, body=body, decorator_list=[], returns=None,
                          type_comment=None, **_type_params())
    return ast.fix_missing_locations(ast.copy_location(cut, fn))


def _type_params() -> dict:
    return {"type_params": []} if "type_params" in ast.FunctionDef._fields else {}


def _self_methods(fn: ast.AST, methods: dict[str, ast.AST]) -> list[str]:
    return sorted({n.attr for n in ast.walk(fn) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
                   and n.value.id == "self" and n.attr in methods})


def _bare(fn: ast.FunctionDef) -> ast.FunctionDef:
    """The function without argument/return annotations (evaluated at def time; the code's behaviour
    does not depend on them) and without decorators but ``@property``, which changes what reading the
    name gives (a value, not a bound method that is always true)."""
    fn = copy.deepcopy(fn)  # keeps the source's line numbers for tracebacks
    for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
        a.annotation = None
    fn.returns = None
    fn.decorator_list = [d for d in fn.decorator_list if isinstance(d, ast.Name) and d.id == "property"]
    return fn  # type: ignore[return-value]


def _imports(mod: ast.Module, module_name: str) -> dict[str, tuple[str, str | None]]:
    """Top-level imports (also under ``if``/``try``): bound name -> (module, attribute or None)."""
    out: dict[str, tuple[str, str | None]] = {}
    stack = list(mod.body)
    while stack:
        n = stack.pop(0)
        if isinstance(n, (ast.If, ast.Try)):
            stack[:0] = list(n.body) + [x for h in getattr(n, "handlers", []) for x in h.body] + list(n.orelse)
        elif isinstance(n, ast.Import):
            for a in n.names:
                out[a.asname or a.name.split(".")[0]] = (a.name if a.asname else a.name.split(".")[0], None)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                base = ".".join(module_name.split(".")[: -n.level] + ([base] if base else []))
            for a in n.names:
                out[a.asname or a.name] = (base, a.name)
    return out


class _Loader:
    """Binds the global names of extracted functions, compiling helpers from the tree once each."""

    def __init__(self, tree: SourceTree, known: dict[str, dict[str, Any]] | None = None) -> None:
        self.tree = tree
        self.known = known or {}
        """Modules of the tree's package with known contents, served while a module-level value is computed."""
        self.compiled: dict[tuple[str, str], Any] = {}
        self._computed: dict[str, dict[str, ast.Assign | ast.AnnAssign]] = {}
        self.helpers: list[str] = []
        self.nodes: list[ast.AST] = []
        """The helpers' syntax trees, to see what they read."""

    def bind(self, rel: str, mod: ast.Module, fns: list[ast.AST], namespace: dict[str, Any]) -> None:
        """Bind every global name ``fns`` (from module file ``rel``) load into ``namespace``."""
        module_name = rel[:-3].replace("/__init__", "").replace("/", ".")
        package = module_name.split(".")[0]
        imports = _imports(mod, module_name)
        top_defs = {n.name: n for n in mod.body if isinstance(n, ast.FunctionDef)}
        top_classes = {n.name: n for n in mod.body if isinstance(n, ast.ClassDef)}
        constants = _constants(mod)
        computed = self.computed(rel, mod)
        for name in sorted({n.id for fn in fns for n in ast.walk(fn)
                            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}):
            if name in namespace or hasattr(builtins, name):
                continue
            if name in top_defs:
                namespace[name] = self.helper(rel, mod, top_defs[name])
            elif name in top_classes:
                namespace[name] = self.klass(rel, mod, top_classes[name])
            elif name in constants:
                namespace[name] = constants[name]
            elif name in computed:
                namespace[name] = self.value(rel, mod, computed[name])
            elif name in imports and imports[name][0].split(".")[0] == package:
                source, attr = imports[name]
                module = source if attr is None else f"{source}.{attr}"
                if self.tree.module_file(module) is not None and (attr is None or self._is_module(source, attr)):
                    namespace[name] = self.module(module, name)  # `import vllm_ascend.envs as envs_ascend`
                else:
                    namespace[name] = self.from_tree(source, attr or name, name)
            elif name in imports:
                namespace[name] = _import(*imports[name], self.tree.label, name)
            else:
                namespace[name] = _missing(self.tree.label, name, module_name)

    def from_tree(self, module: str, attr: str, name: str) -> Any:
        """A module-level function of the same source tree, compiled from its source."""
        rel = self.tree.module_file(module)
        mod = self.tree.parse(rel)
        node = next((n for n in mod.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == attr),
                    None) if mod else None
        if mod is not None and node is None and attr in (constants := _constants(mod)):
            return constants[attr]
        if mod is not None and node is None and attr in (computed := self.computed(rel, mod)):
            return self.value(rel, mod, computed[attr])  # type: ignore[arg-type]
        if rel is None or mod is None or node is None:
            return _missing(self.tree.label, name, module)
        return self.klass(rel, mod, node) if isinstance(node, ast.ClassDef) else self.helper(rel, mod, node)

    def klass(self, rel: str, mod: ast.Module, node: ast.ClassDef) -> Any:
        """A module-level class of the tree (an enum, a spec subclass), compiled with its decorators; one
        whose body needs what kvaudit cannot load stays a placeholder."""
        key = (rel, node.name)
        if key not in self.compiled:
            holder = types.ModuleType(f"kvaudit_extracted_{rel}")
            own: dict[str, Any] = holder.__dict__
            own["__builtins__"] = builtins
            self.compiled[key] = _missing(self.tree.label, node.name, rel)
            try:
                self.bind(rel, mod, [node], own)
                with _visible_module(holder):
                    exec(compile(ast.fix_missing_locations(ast.Module(body=[node], type_ignores=[])),
                                 f"{self.tree.label}:{rel}", "exec"), own)
            except Exception:
                return self.compiled[key]
            self.compiled[key] = own[node.name]
            self.helpers.append(f"{rel[:-3].replace('/', '.')}.{node.name}")
        return self.compiled[key]

    def _is_module(self, package: str, attr: str) -> bool:
        """Whether ``from package import attr`` names a module of the tree rather than a function."""
        rel = self.tree.module_file(package)
        mod = self.tree.parse(rel)
        defined = {n.name for n in mod.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))} if mod else set()
        return attr not in defined

    def module(self, module: str, name: str) -> Any:
        """A module of the tree run whole (``vllm_ascend.envs``: settings read from the environment). One
        that imports what kvaudit cannot load (the NPU stack) stays a placeholder, harmless until used."""
        key = (module, "")
        if key not in self.compiled:
            rel = self.tree.module_file(module)
            mod = types.ModuleType(f"kvaudit_extracted_{module}")
            try:
                exec(compile(self.tree.read(rel) or "", f"{self.tree.label}:{rel}", "exec"), mod.__dict__)
            except Exception:
                self.compiled[key] = _missing(self.tree.label, name, module)
            else:
                self.compiled[key] = mod
                self.helpers.append(module)
        return self.compiled[key]

    def computed(self, rel: str, mod: ast.Module) -> dict[str, ast.Assign | ast.AnnAssign]:
        """``_computed`` of the module file ``rel``, once per file."""
        if rel not in self._computed:
            self._computed[rel] = _computed(mod)
        return self._computed[rel]

    def value(self, rel: str, mod: ast.Module, node: ast.Assign | ast.AnnAssign) -> Any:
        """A module-level name the module computes when imported (``NAME = expression``, not a literal), computed
        as its import computes it: the expression's names bound from the same tree (its functions, classes and
        the other such values) and the code's package served as for the allocation code (the ``known``
        modules, placeholders for the rest), once per tree. vllm-ascend 0.27+'s
        ``vllm_ascend/device/hardware_profile.py`` (vllm-ascend PR #13721) sets ``_CURRENT_HARDWARE_PROFILE =
        get_hardware_profile(get_device_config()._device_type)``, and its ``device/device_config.py`` (PR #13672)
        takes the device type from ``vllm_ascend/_build_info.py`` (``__device_type__``, written by the build for
        its ``SOC_VERSION``), so the profile is the one of the chip the build was made for: with kvaudit's build
        info (``releases.build_info``), an Atlas A2's (``AscendDeviceType.A2``, ascend910b1). 0.27-0.28's
        ``quantization/utils.py`` ``enable_fa_quant`` asks it on every model (``FP8_ATTENTION`` is an A5
        capability, as 0.20-0.26 asked ``get_ascend_device_type() != AscendDeviceType.A5``). An expression that
        needs what kvaudit cannot load (the NPU stack, a ``_build_info`` kvaudit does not know) leaves a
        placeholder, harmless until used."""
        name = (node.targets[0] if isinstance(node, ast.Assign) else node.target).id  # type: ignore[union-attr]
        key = (rel, f"{name}=")
        if key not in self.compiled:
            module = rel[:-3].replace("/__init__", "").replace("/", ".")
            placeholder = self.compiled[key] = _missing(self.tree.label, name, module)  # breaks cycles
            own: dict[str, Any] = {"__name__": f"kvaudit_extracted_{rel}", "__builtins__": builtins}
            try:
                self.bind(rel, mod, [node.value], own)  # type: ignore[list-item]
                expression = ast.fix_missing_locations(ast.Expression(body=node.value))  # type: ignore[arg-type]
                with _placeholder_package(module.split(".")[0], self.tree.label, self.known):
                    self.compiled[key] = eval(compile(expression, f"{self.tree.label}:{rel}", "eval"), own)
            except Exception:
                self.compiled[key] = placeholder
            else:
                self.helpers.append(f"{module}.{name}")
        return self.compiled[key]

    def helper(self, rel: str, mod: ast.Module, fn: ast.FunctionDef) -> Any:
        key = (rel, fn.name)
        if key not in self.compiled:
            own: dict[str, Any] = {"__name__": f"kvaudit_extracted_{rel}", "__builtins__": builtins}
            self.compiled[key] = _missing(self.tree.label, fn.name, rel)  # breaks cycles while compiling
            self.bind(rel, mod, [fn], own)
            exec(compile(ast.fix_missing_locations(ast.Module(body=[_bare(fn)], type_ignores=[])),
                         f"{self.tree.label}:{rel}", "exec"), own)
            self.compiled[key] = own[fn.name]
            self.helpers.append(f"{rel[:-3].replace('/', '.')}.{fn.name}")
            self.nodes.append(fn)
        return self.compiled[key]


def _constants(mod: ast.Module) -> dict[str, Any]:
    """Module-level names bound to literals (``X = 2 * 1024 * 1024`` aside, ``frozenset({...})`` too)."""
    out: dict[str, Any] = {}
    for n in mod.body:
        target = (n.targets[0] if isinstance(n, ast.Assign) and len(n.targets) == 1 else
                  n.target if isinstance(n, ast.AnnAssign) and n.value is not None else None)
        if not isinstance(target, ast.Name):
            continue
        value = n.value
        wrap = None
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in (
                "frozenset", "set", "tuple") and len(value.args) == 1 and not value.keywords:
            wrap, value = {"frozenset": frozenset, "set": set, "tuple": tuple}[value.func.id], value.args[0]
        try:
            literal = ast.literal_eval(value)  # type: ignore[arg-type]
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
        out[target.id] = wrap(literal) if wrap else literal
    return out


@contextlib.contextmanager
def _visible_module(module: types.ModuleType) -> Iterator[None]:
    """``module`` in ``sys.modules`` while a class body runs in its namespace: ``@dataclass`` looks a string
    annotation up in ``sys.modules[cls.__module__]`` (``dataclasses._is_type``: is it a ``ClassVar``?), and
    class annotations are strings here (this module's ``from __future__ import annotations`` is inherited by
    its ``compile`` calls). Without it every dataclass of the tree (vllm-ascend 0.27+'s ``DeviceConfig`` and
    ``HardwareProfile``, ``vllm_ascend/device/``) fails to compile and stays a placeholder."""
    saved = sys.modules.get(module.__name__)
    sys.modules[module.__name__] = module
    try:
        yield
    finally:
        if saved is None:
            sys.modules.pop(module.__name__, None)
        else:
            sys.modules[module.__name__] = saved


def _computed(mod: ast.Module) -> dict[str, ast.Assign | ast.AnnAssign]:
    """Module-level names bound once, by ``NAME = expression`` at the top of the module, to what is not a literal
    (``_constants``): the statement that binds each. A name the module binds anywhere else too (under
    ``if``/``try``, by an import, a ``def`` or a loop) or that a function declares ``global`` is left out: its
    value at run time is not that expression's."""
    bound: dict[str, int] = {}
    todo: list[ast.AST] = list(mod.body)
    while todo:  # the module's own scope: not into the bodies of functions, classes, lambdas, comprehensions
        n = todo.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound[n.name] = bound.get(n.name, 0) + 1
            todo.extend(n.decorator_list)
            continue
        if isinstance(n, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            continue
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            bound[n.id] = bound.get(n.id, 0) + 1
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            for a in n.names:
                alias = a.asname or a.name.split(".")[0]
                bound[alias] = bound.get(alias, 0) + 1
        todo.extend(ast.iter_child_nodes(n))
    rebound = {g for n in ast.walk(mod) if isinstance(n, ast.Global) for g in n.names}
    literals = _constants(mod)
    out: dict[str, ast.Assign | ast.AnnAssign] = {}
    for n in mod.body:
        target = (n.targets[0] if isinstance(n, ast.Assign) and len(n.targets) == 1 else
                  n.target if isinstance(n, ast.AnnAssign) and n.value is not None else None)
        if isinstance(target, ast.Name) and target.id not in literals and target.id not in rebound \
                and bound.get(target.id) == 1:
            out[target.id] = n  # type: ignore[assignment]
    return out


_MOVED = {"vllm.v1.core.kv_cache_utils": "vllm.v1.core.kv_cache_planning"}
"""vLLM modules split since the releases that import from them: a name the release imports from the key,
the installed vLLM may keep in the value. vLLM moved its KV-cache planning functions (spec -> groups ->
tensors: ``get_kv_cache_groups``, ...) out of ``kv_cache_utils.py`` into ``kv_cache_planning.py``, the
move vllm-project/vllm#42309 describes; vllm-ascend 0.28-0.30 still import them from the first."""


def _import(module: str, attr: str | None, label: str, name: str) -> Any:
    """A name from an installed package (torch, vLLM, the standard library); vLLM's modules through the one door
    (``kvaudit.model.vllm_modules``), quieted as everywhere else."""
    from kvaudit.model.vllm_modules import module as vllm_module

    def load(name: str) -> Any:
        return vllm_module(name) if name.split(".")[0] == "vllm" else importlib.import_module(name)

    try:
        m = load(module)
        if attr and not hasattr(m, attr) and module in _MOVED:
            m = load(_MOVED[module])
        return getattr(m, attr) if attr else m
    except Exception:  # the installed version may lack it: only fatal if the code path uses it
        return _missing(label, name, f"{module} in this environment")
