"""The ``kvaudit`` command on typer and rich: the application of the commands (one module each in this
folder, on the option table of ``kvaudit.cli.options``), parsing, and every ending mapped to an exit code.

Exit codes (``kvaudit.errors.EXIT_CODES``): 0 every audited strategy passed, 1 any failed, 2 bad input,
3 could not measure, 4 a bug in kvaudit (never a finding), 130 interrupted. Every error is one line on
stderr; ``--debug`` adds the traceback. A reader that closes stdout early (``| head``) does not change
the exit code. Neither torch nor vLLM is imported until a command needs them (``kvaudit --help`` stays fast).
Every option is declared once (``Opt``) and shared by the commands that take it; each command body
reads the parsed options as one namespace, so commands keep the same names as vLLM's flags.
"""

from __future__ import annotations

import errno
import functools
import inspect
import os
import signal
import sys
from types import SimpleNamespace
from typing import Annotated, Any, Callable

import typer

from kvaudit import __version__
from kvaudit.cli import audit, check, compare, history, live, meters, models, plan, triage
from kvaudit.cli.options import AUDIT_OPTIONS
from kvaudit.cli.output import note
from kvaudit.errors import (EXIT_BAD_INPUT, EXIT_BUG, EXIT_CODES, EXIT_INTERRUPTED, EXIT_NOT_MEASURED, KvauditError,
                            UsageError, did_you_mean, missing_dependency)
from kvaudit.escape import terminal_safe
from kvaudit.model.deployment import PRESETS
from kvaudit.model.options import Opt

DESCRIPTION = ("Audit a KV-cache allocator against vLLM's own plan: expected vs allocated bytes per layer "
               "and group, with a verdict. Exit codes: "
               + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items()) + ".")

COMMANDS = tuple(c.NAME for c in (audit, plan, check, compare, models, triage, live, history, meters))
"""The command names, as error messages list them."""


def build_app() -> typer.Typer:
    """The typer application: the commands, one shortcut per preset, shell completion."""
    from kvaudit.cli import help

    help.install()
    app = typer.Typer(name="kvaudit", help=DESCRIPTION, add_completion=True, rich_markup_mode="rich",
                      context_settings={"help_option_names": ["--help", "-h"]}, pretty_exceptions_enable=False)

    @app.callback()
    def root(version: Annotated[bool, typer.Option("--version", help="Print kvaudit's version and exit.",
                                                   is_eager=True, callback=_version)] = False,
             debug: Annotated[bool, typer.Option("--debug", help="On an error, also print its traceback (taken "
                                                 "anywhere on the command line; or KVAUDIT_DEBUG=1).")] = False) -> None:
        """Audit a KV-cache allocator against vLLM's own plan."""

    _command(app, audit)
    for name, preset in PRESETS.items():
        _register(app, name, audit.run, AUDIT_OPTIONS, f"{preset.title} ({preset.description}).", panel="Presets",
                  fixed={"preset": name, "config": None, "plan": None, "revision": None, "trust_remote_code": False},
                  description=f"Audit {preset.title}: TP {preset.tp}, max-model-len {preset.max_model_len}, "
                              f"{preset.device}, unless options say otherwise.")
    for command in (plan, check, compare, triage, live, history, models, meters):
        _command(app, command)
    return app


def _command(app: typer.Typer, command: Any) -> None:
    """Register a command module (``NAME``, ``OPTIONS``, ``HELP``, ``DESCRIPTION``, ``run``)."""
    _register(app, command.NAME, command.run, command.OPTIONS, command.HELP, description=command.DESCRIPTION,
              usage=getattr(command, "USAGE", "[OPTIONS]"))


def _register(app: typer.Typer, name: str, body: Callable[[Any], int], options: tuple[Opt, ...], help: str,
              panel: str = "Commands", fixed: dict | None = None, description: str | None = None,
              usage: str = "[OPTIONS]") -> None:
    """Register ``body(namespace) -> exit code`` as command ``name`` taking ``options`` (``fixed``: values
    the command sets itself, as a preset's name; ``usage``: what its usage line shows after its name)."""

    def command(**values: Any) -> int:
        try:
            return body(SimpleNamespace(**(fixed or {}), **values))
        except BaseException as e:  # past typer and click, which map some exceptions to exit codes of their own
            raise _Raised(e) from None

    command.__signature__ = inspect.Signature([o.parameter() for o in options])  # type: ignore[attr-defined]
    command.__doc__ = description or help
    command.__name__ = name.replace("-", "_").replace(".", "_")
    app.command(name, help=description or help, short_help=help, rich_help_panel=panel,
                options_metavar=usage)(command)


class _Raised(Exception):
    """What a command body raised, carried past typer and click: they turn ``KeyboardInterrupt`` into a
    silent 130, ``EOFError`` (a truncated archive, too) into an abort, and a broken pipe into exit 1;
    kvaudit maps every exception itself (``main``)."""

    def __init__(self, raised: BaseException) -> None:
        super().__init__(repr(raised))
        self.raised = raised


def _version(value: bool) -> None:
    if value:
        print(f"kvaudit {__version__}")
        raise typer.Exit()


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
    except ex.NoSuchOption as e:  # click lists every option near it; here the nearest one, if any is near
        where = e.ctx.command_path.partition(" ")[2] if e.ctx is not None else ""
        known = [n for p in (e.ctx.command.params if e.ctx is not None else []) for n in (*p.opts, *p.secondary_opts)
                 if n.startswith("-")]
        raise UsageError((f"{where}: " if where else "") + f"No such option: {e.option_name}"
                         + did_you_mean(e.option_name, known)) from None
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
    source = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ, KVAUDIT_IN_VLLM_PYTHON=str(exe),
               PYTHONPATH=os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")])))
    if debug:
        env["KVAUDIT_DEBUG"] = "1"
    note(f"kvaudit: running with {exe} (its vLLM plans)")
    sys.stdout.flush()
    sys.stderr.flush()
    return subprocess.run([str(exe), "-m", "kvaudit", *rest], env=env).returncode


def _sigterm_as_interrupt() -> Any:
    """SIGTERM (``kill``, a CI job's timeout, ``docker stop``) ends the command as Ctrl-C does: what it made is
    cleaned up on the way out (temporary folders, the release cache's partial fetch) and the exit is 130. The
    previous handler, to restore; ``None`` outside the main thread, where no handler can be set."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:
        return None


def _reopen_closed_streams() -> None:
    """A standard stream the caller closed (``kvaudit ... >&-``, ``2>&-``, ``<&-``) is opened on the null device, so
    what would go there is dropped and nothing else kvaudit opens lands on its descriptor (a file opened on
    descriptor 1 would receive the report); Python leaves ``sys.stdout`` and its siblings ``None`` for such a
    stream, and they are made writable (readable) again."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            try:
                null = os.open(os.devnull, os.O_RDONLY if mode == "r" else os.O_WRONLY)
            except OSError:
                continue
            if null != fd:
                os.dup2(null, fd)
                os.close(null)
        if getattr(sys, name) is None:
            setattr(sys, name, open(fd, mode, encoding="utf-8", errors="replace", closefd=False))
        if getattr(sys, f"__{name}__") is None:  # (code that writes to the original streams: vLLM's gloo set-up)
            setattr(sys, f"__{name}__", getattr(sys, name))


class _PipeGuard:
    """stdout or stderr that a closed reader cannot break: after the first broken pipe (``kvaudit ... | head``), or
    any other failed write (a stream closed under the command), the rest of the output is dropped and the command
    runs on, so its exit code is still the verdict; text its encoding cannot hold is written with replacement
    characters."""

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
            except (BrokenPipeError, OSError, ValueError):  # a closed reader, a stream closed under us
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._stream.flush()
            except (BrokenPipeError, OSError, ValueError):
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


_PATH_ERRORS = {errno.ENAMETOOLONG, errno.ELOOP, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.ENOENT, errno.EROFS}
"""File-system refusals of a path a user gave (a name over 255 characters, a loop of links, a file where a folder
should be): bad input, exit 2, wherever the path was first touched."""


def _failure(e: BaseException) -> tuple[int, str]:
    """The exit code and the one line for an exception that ended a command."""
    if isinstance(e, KvauditError):
        return e.exit_code, f"kvaudit: error: {e.message}"
    if isinstance(e, ModuleNotFoundError) and not (e.name or "").startswith("kvaudit"):
        missing = missing_dependency(e)  # a package this command needs (torch, vLLM, ...) is not installed
        return missing.exit_code, f"kvaudit: error: {missing.message}"
    if _interrupted(e):
        return EXIT_INTERRUPTED, "kvaudit: interrupted"
    if isinstance(e, OSError) and e.filename is not None and e.errno in _PATH_ERRORS:  # a path given that no file
        return EXIT_BAD_INPUT, f"kvaudit: error: {e.filename}: {e.strerror}"           # system takes (too long, ...)
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
    _reopen_closed_streams()
    terminate = _sigterm_as_interrupt()
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
        print(terminal_safe(line), file=sys.stderr)
        if _wants_json(argv):  # a pipeline that parses stdout gets the ending too (kvaudit/error.schema.json)
            sys.stdout.write(error_json(code, line) + "\n")
        return code
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        sys.stdout, sys.stderr = streams
        if terminate is not None:
            signal.signal(signal.SIGTERM, terminate)


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
    from kvaudit.model.hub import is_hub_id

    def named(word: str) -> bool:
        return not word.startswith("-") and (is_hub_id(word) or os.path.exists(os.path.expanduser(word)))

    first = argv[0] if argv else "-"
    if first.startswith("-") or first in (*COMMANDS, *PRESETS):
        if first in ("audit", "plan") and len(argv) > 1 and (argv[1] in PRESETS or named(argv[1])):
            return [first, "--preset" if argv[1] in PRESETS else "--model", *argv[1:]]
        return argv
    if named(first):
        return ["audit", "--model", *argv]
    raise UsageError(f"unknown preset or command {first!r}{did_you_mean(first, (*PRESETS, *COMMANDS))}, and no such "
                     f"file (presets: {', '.join(PRESETS)}; "
                     f"commands: {', '.join(COMMANDS)}; or a Hub id org/name, a model folder, a config.json)")


def _utf8_or_reexec() -> None:
    """Under an ASCII-only locale (``LC_ALL=C`` with ``PYTHONCOERCECLOCALE=0 PYTHONUTF8=0``) Python reads text files
    as ASCII, and torch's and vLLM's own template and source files are UTF-8: every command that loads vLLM ended in
    a UnicodeDecodeError. Such a run starts again at once in Python's UTF-8 mode (``-X utf8``), as a user of a
    UTF-8 terminal would run it; the output is UTF-8 too."""
    import locale

    if sys.flags.utf8_mode or os.environ.get("KVAUDIT_REEXEC") or \
            locale.getpreferredencoding(False).lower() not in ("ascii", "ansi_x3.4-1968", "646", "us-ascii"):
        return
    os.environ["KVAUDIT_REEXEC"] = "utf8"
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # (a stream the caller closed is None here, before main opens it on the null device)
            stream.flush()
    os.execv(sys.executable, [sys.executable, "-X", "utf8", "-m", "kvaudit", *sys.argv[1:]])


def run() -> None:
    """Console-script entry point.

    Once vLLM is loaded the process holds its modules, a gloo group and the models built on ``meta``,
    whose teardown at interpreter exit takes seconds (about 5 s of a 14 s audit here) and does
    nothing kvaudit needs; so after the output is flushed and kvaudit's own temp files are removed,
    the process ends at once. So does an interrupted one: Ctrl-C can land inside a library's import,
    leaving half-built objects (a logging handler with no stream) whose teardown at exit would print a
    traceback after "kvaudit: interrupted"."""
    _utf8_or_reexec()
    code = main()
    plan = sys.modules.get("kvaudit.plan.planner")
    if plan is None and code != EXIT_INTERRUPTED:
        sys.exit(code)
    if plan is not None:
        plan.remove_temp_dirs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
