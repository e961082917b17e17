"""Faults a user's machine has (issue 34): full disks, odd output paths, closed streams, tiny widths, networks that
hang. The verdict and its exit code are never lost, and every output file is written atomically.

Streams, full disks and networks are tested with real processes: a saved plan is audited (``audit --plan``, torch
only), a small tmpfs is mounted in a user namespace (``unshare -rm``; skipped with the reason where that is not
allowed), and a local server accepts connections and never answers."""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest

from kvaudit import network, outfile
from kvaudit.cli import main
from kvaudit.errors import UsageError
from conftest import ROOT


@pytest.fixture(scope="module")
def saved_plan(tmp_path_factory):
    """A plan of llama-3.1-8b saved once, audited by the real processes below with torch alone."""
    path = tmp_path_factory.mktemp("plan") / "llama.json"
    assert main(["plan", "llama-3.1-8b", "--save", str(path)]) == 0
    return path


def _kvaudit(*argv: str, shell_redirects: str = "", env: dict | None = None, timeout: float = 120):
    """``python -m kvaudit ARGV`` in a real process, with shell redirections (``>&-``) where given."""
    cmd = " ".join([sys.executable, "-m", "kvaudit", *(f"'{a}'" for a in argv)]) + " " + shell_redirects
    return subprocess.run(["bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


# --- outputs: written atomically, checked before the work ------------------------------------------------------

def test_a_failed_write_leaves_the_old_file_whole_and_no_temporary_file(tmp_path, monkeypatch):
    old = tmp_path / "report.html"
    old.write_text("the previous report")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError):
        outfile.write(old, "x" * 100_000)
    assert old.read_text() == "the previous report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.html"]


def test_a_write_replaces_the_file_keeps_its_mode_and_follows_a_link(tmp_path):
    real = tmp_path / "real.html"
    real.write_text("old")
    real.chmod(0o640)
    link = tmp_path / "link.html"
    link.symlink_to(real)
    assert outfile.write(link, "new") == real
    assert link.is_symlink() and real.read_text() == "new" and (real.stat().st_mode & 0o777) == 0o640
    fresh = tmp_path / "fresh.html"
    umask = os.umask(0o022)
    try:
        outfile.write(fresh, "a")
    finally:
        os.umask(umask)
    assert fresh.stat().st_mode & 0o777 == 0o644  # as open() makes it, not mkstemp's 0600


@pytest.mark.parametrize("case", ["dangling link", "/proc", "full disk", "folder"])
def test_an_output_that_cannot_be_written_is_refused_before_the_work(tmp_path, monkeypatch, case):
    if case == "dangling link":
        path = tmp_path / "r.html"
        path.symlink_to(tmp_path / "missing" / "r.html")
        want = "folder"
    elif case == "/proc":
        path, want = "/proc/kvaudit-report.html", "cannot write"
    elif case == "full disk":
        path, want = tmp_path / "r.html", "No space left"
        monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 0))
    else:
        path, want = tmp_path, "directory"
    with pytest.raises(UsageError, match=want):
        outfile.check(path)


def test_a_full_disk_keeps_the_previous_page_whole_and_the_verdict(saved_plan, tmp_path):
    """A 64 KiB tmpfs: the probe's empty file fits, the ~80 KB page does not."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) to mount a small tmpfs")
    mnt = tmp_path / "small"
    mnt.mkdir()
    cmd = (f"mount -t tmpfs -o size=64k tmpfs {mnt} && echo old > {mnt}/r.html && "
           f"{sys.executable} -m kvaudit audit --plan {saved_plan} --meter meta --html {mnt}/r.html >/dev/null; "
           f"echo rc=$?; cat {mnt}/r.html; ls -A {mnt}")
    p = subprocess.run(["unshare", "-rm", "bash", "-c", cmd], cwd=ROOT, capture_output=True, text=True, timeout=120)
    if "rc=" not in p.stdout:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {p.stderr.strip()[:200]}")
    assert p.stdout.split() == ["rc=0", "old", "r.html"], (p.stdout, p.stderr)
    assert f"kvaudit: could not write {mnt}/r.html: No space left on device" in p.stderr, p.stderr
    assert p.stderr.strip().splitlines()[-1].startswith("kvaudit: PASS"), p.stderr


# --- streams ---------------------------------------------------------------------------------------------------

def test_stdout_closed_and_dev_full_keep_the_verdict_and_its_exit_code(saved_plan):
    """One process for both (each costs torch's import): the report's stream closed, its page on a full device."""
    p = _kvaudit("audit", "--plan", str(saved_plan), "--meter", "meta", "--html", "/dev/full", shell_redirects=">&-")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert any(line.startswith("kvaudit: could not write /dev/full: No space left") for line in lines), p.stderr
    assert lines[-1].startswith("kvaudit: PASS"), p.stderr


def test_triage_of_stdin_closed_is_one_line_and_exit_2():
    p = _kvaudit("triage", "-", shell_redirects="<&-")
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert p.stderr.startswith("kvaudit: error: stdin is empty"), p.stderr


@pytest.mark.parametrize("columns", ["0", "1"])
def test_a_tiny_width_is_drawn_at_the_minimum(monkeypatch, capsys, columns, saved_plan):
    from kvaudit.cli import output

    monkeypatch.setenv("COLUMNS", columns)
    assert output.width() == output.MIN_WIDTH
    assert main(["audit", "--plan", str(saved_plan), "--meter", "meta", "--detail", "summary"]) == 0
    out = capsys.readouterr().out
    assert len(out) > 2000 and max(len(line) for line in out.splitlines()) <= output.MIN_WIDTH, out[:300]


# --- networks that hang ----------------------------------------------------------------------------------------

@pytest.fixture
def silent_server():
    """A server that accepts every connection and never answers; its URL."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    stop.set()
    t.join()
    for c in held:
        c.close()
    srv.close()


def test_a_hub_that_never_answers_gives_up_in_the_timeout_with_exit_3(silent_server, tmp_path):
    start = time.monotonic()
    p = _kvaudit("someorg/somemodel", "--meter", "meta", timeout=60,
                 env={"HF_ENDPOINT": silent_server, "HF_HUB_CACHE": str(tmp_path), "HF_HUB_OFFLINE": "0",
                      network.ENV: "1"})
    assert p.returncode == 3, p.stderr
    lines = p.stderr.strip().splitlines()
    assert lines[0].startswith("kvaudit: fetching someorg/somemodel's config from the Hub") and "timeout 1 s" in lines[0]
    assert "did not answer within 1 s (KVAUDIT_NETWORK_TIMEOUT)" in lines[-1] and len(lines) == 2, p.stderr
    assert time.monotonic() - start < 45


def test_a_package_index_that_never_answers_falls_back_to_the_cache(silent_server, monkeypatch, tmp_path, capsys):
    from kvaudit.ci import history

    (tmp_path / "kvaudit" / "sdists" / "vllm-ascend-0.11.0").mkdir(parents=True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("PIP_INDEX_URL", silent_server + "/simple")
    monkeypatch.setenv(network.ENV, "1")
    start = time.monotonic()
    versions, source = history.published()
    assert versions == ["0.11.0"] and source.startswith("kvaudit's cache"), source
    assert time.monotonic() - start < 30  # pip's defaults: 109 s
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("kvaudit: listing vllm-ascend's releases on the package index") and "timeout 1 s" in err[0]
    assert err[-1].startswith("kvaudit: the package index did not answer within 1 s (KVAUDIT_NETWORK_TIMEOUT); "
                              "listing the releases in kvaudit's cache"), err


def test_a_strategy_named_twice_is_refused_before_any_is_resolved(capsys, monkeypatch):
    from kvaudit.strategies import resolve

    monkeypatch.setattr(resolve, "resolve_strategy", lambda name: pytest.fail("resolved before the check"))
    with pytest.raises(UsageError, match="-s vllm is given twice"):
        resolve.resolve_strategies(["vllm"] * 20_000)


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan", "inf"])
def test_a_bad_network_timeout_is_a_usage_error(monkeypatch, value):
    monkeypatch.setenv(network.ENV, value)
    with pytest.raises(UsageError, match=network.ENV):
        network.timeout_s()


# --- signals ---------------------------------------------------------------------------------------------------

def test_sigterm_ends_like_ctrl_c_and_leaves_no_temporary_folder(tmp_path):
    """``kill``, a CI job's timeout, ``docker stop``: exit 130, one line, and the gloo store kvaudit makes in TMPDIR
    while it builds the model is removed (SIGTERM's default ending skipped every clean-up)."""
    import signal

    p = subprocess.Popen([sys.executable, "-m", "kvaudit", "qwen3-next", "--meter", "meta"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    deadline = time.monotonic() + 90
    while not list(tmp_path.glob("kvaudit-dist-*")) and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(tmp_path.glob("kvaudit-dist-*")), "the model was never built"
    p.send_signal(signal.SIGTERM)
    err = p.stderr.read()
    assert p.wait(timeout=60) == 130, err
    assert err.strip().splitlines()[-1] == "kvaudit: interrupted" and "Traceback" not in err, err
    assert not list(tmp_path.glob("kvaudit-*")), list(tmp_path.iterdir())  # (torch's inductor cache may stay)


# --- names that reach the terminal ----------------------------------------------------------------------------

TITLE = "\x1b]0;PWNED\x07\x1b[2J"
"""Set the window's title, clear the screen."""


def test_a_policys_model_name_reaches_the_terminal_as_text(tmp_path, capsys):
    policy = tmp_path / "kvaudit.toml"
    escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 32 else c for c in TITLE)  # (TOML's escapes)
    policy.write_text(f'[[model]]\nname = "{escaped}llama"\n')
    code = main(["check", str(policy)])
    out, err = capsys.readouterr()
    assert code == 2 and "\x1b" not in out + err and "\\x1b]0;PWNED\\x07" in err, err


def test_a_saved_reports_names_reach_the_terminal_as_text(tmp_path, capsys, monkeypatch):
    import json

    monkeypatch.setenv("COLUMNS", "200")
    doc = json.loads((ROOT / "fixtures/reports/compare/qwen3-next-util0.7-meta.json").read_text())
    doc["model"] = TITLE + doc["model"]
    doc["audits"][0]["strategy"] = TITLE + doc["audits"][0]["strategy"]
    doc["audits"][0]["layers"][0]["layer"] = TITLE + doc["audits"][0]["layers"][0]["layer"]
    paths = []
    for name in ("old.json", "new.json"):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(doc))
    code = main(["compare", *map(str, paths), "--detail", "layers"])
    out, err = capsys.readouterr()
    assert code == 0 and "\x1b" not in out + err and "\\x1b]0;PWNED\\x07" in out, out[:500]


def test_a_config_folders_name_reaches_the_terminal_as_text(tmp_path, capsys):
    import shutil

    folder = tmp_path / f"{TITLE}model"
    folder.mkdir()
    shutil.copy(ROOT / "fixtures/configs/llama-3.1-8b/config.json", folder / "config.json")
    code = main(["audit", "--config", str(folder), "--meter", "meta", "--detail", "summary"])
    out, err = capsys.readouterr()
    assert code == 0 and "\x1b]" not in out + err and "\\x1b]0;PWNED" in out + err, (out[:300], err)


def test_a_policys_why_reaches_the_terminal_as_text(tmp_path):
    """Every string of a policy is made text when it is read (a cell's why is shown where its outcome is)."""
    from kvaudit.ci.policy import load_policy

    policy = tmp_path / "kvaudit.toml"
    escaped = "".join(f"\\u{ord(c):04x}" if ord(c) < 32 else c for c in TITLE)
    policy.write_text(f'[check]\nmeter = "meta"\n[[model]]\nname = "llama-3.1-8b"\nstrategies = ["vllm"]\n'
                      f'why = "{escaped}ok"\n')
    assert [c.why for c in load_policy(policy, ("vllm",)).cells] == ["\\x1b]0;PWNED\\x07\\x1b[2Jok"]


def test_an_error_naming_a_path_reaches_the_terminal_as_text(capsys):
    code = main(["audit", "--config", f"/nonexistent/{TITLE}/config.json", "--meter", "meta"])
    err = capsys.readouterr().err
    assert code == 2 and "\x1b" not in err and "\\x1b]0;PWNED" in err, err


def test_a_note_naming_an_output_reaches_the_terminal_as_text(tmp_path, capsys):
    code = main(["llama-3.1-8b", "--meter", "meta", "--detail", "summary", "--html", str(tmp_path / f"{TITLE}.html")])
    err = capsys.readouterr().err
    assert code == 0 and "\x1b" not in err and "kvaudit: wrote" in err and "\\x1b]0;PWNED" in err, err


# --- reading large pastes --------------------------------------------------------------------------------------

def test_each_out_of_memory_line_is_placed_without_rebuilding_the_frame_index(monkeypatch):
    """100,000 tracebacks (16.7 MB) took 274 s: every error line rebuilt the list of frame lines (bench/readers.py
    times it: 'report: out-of-memory tracebacks')."""
    from kvaudit.triage import evidence

    seen, real = [], evidence._phase

    def spy(frames, line, reach=80, at=None):
        seen.append(at)
        return real(frames, line, reach, at)

    monkeypatch.setattr(evidence, "_phase", spy)
    one = ('Traceback (most recent call last):\n  File "/v/gpu_model_runner.py", line 1, in profile_run\n'
           "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    ev = evidence.extract(evidence.clean_lines(one * 50))
    assert len(ev.all("oom_phase")) == 50
    per_line = seen[:-1]  # (the last call is for the last traceback alone)
    assert len(per_line) == 50 and all(at is per_line[0] for at in per_line) and per_line[0] is not None


# --- odd environments ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["audit", "--model", "/tmp/" + "a" * 300 + "/config.json", "--meter", "meta"],
                                  ["check", "/tmp/" + "a" * 300 + ".toml"]])
def test_a_path_component_over_255_characters_is_bad_input(capsys, argv):
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "File name too long" in err, err


def test_an_ascii_only_locale_runs_in_utf8_mode_and_stderr_closed_keeps_the_whole_report():
    """``LC_ALL=C PYTHONCOERCECLOCALE=0 PYTHONUTF8=0``: torch's and vLLM's UTF-8 files were read as ASCII (exit 4).
    One process for both (each costs vLLM's import): the report on stdout is whole with stderr closed (exit 4 or 120
    with a traceback before)."""
    import json

    p = _kvaudit("llama-3.1-8b", "--meter", "meta", "--format", "json", shell_redirects="2>&-",
                 env={"LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"})
    assert p.returncode == 0 and json.loads(p.stdout)["exit_code"] == 0, p.stdout[-500:]


def test_a_home_that_does_not_exist_is_not_made(tmp_path, monkeypatch):
    from kvaudit.plan import planner
    from kvaudit.strategies import releases

    home = tmp_path / "nonexistent"
    monkeypatch.setenv("HOME", str(home))
    for name in ("VLLM_CACHE_ROOT", "XDG_CACHE_HOME", "KVAUDIT_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    with planner.quiet_vllm():
        pass
    root = os.environ["VLLM_CACHE_ROOT"]
    assert not root.startswith(str(home)) and os.path.isdir(root)
    planner.remove_temp_dirs()
    assert not os.path.exists(root)
    from kvaudit.errors import StrategyFailed

    with pytest.raises(StrategyFailed, match="does not exist, so the release cache has no place"):
        releases.fetch_sdist("0.13.0")
    assert not home.exists()


def test_plan_save_on_a_failing_disk_keeps_the_previous_plan_whole(tmp_path, monkeypatch, capsys):
    saved = tmp_path / "qwen.plan.json"
    saved.write_text('{"the previous plan": true}\n')

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    code = main(["plan", "llama-3.1-8b", "--save", str(saved)])
    err = capsys.readouterr().err
    assert code == 2 and "No space left on device" in err and "unchanged" in err, err
    assert saved.read_text() == '{"the previous plan": true}\n' and sorted(p.name for p in tmp_path.iterdir()) == [
        "qwen.plan.json"]


# --- a note before each slow step (issue 35) -------------------------------------------------------------------

@pytest.mark.parametrize("argv, first", [
    (["llama-3.1-8b", "--meter", "meta"], "kvaudit: importing torch and vLLM, then building the model"),
    (["plan", "llama-3.1-8b"], "kvaudit: importing torch and vLLM, then building the model"),
    (["models", "llama-3.1-8b"], "kvaudit: building each preset's model"),
    (["meters"], "kvaudit: importing torch and asking each device library"),
    (["triage", str(ROOT / "fixtures/reports/threads/vllm-27508.txt")], "kvaudit: reading the report, then planning"),
])
def test_the_first_line_comes_before_the_slow_step(argv, first):
    """Read as it streams: the note is there while the command is still at work (it is stopped once read)."""
    line, running = _first_line_while_running(*argv)
    assert line.startswith(first) and running, line


def _first_line_while_running(*argv: str) -> tuple[str, bool]:
    """``python -m kvaudit ARGV``'s first stderr line, and whether the process was still at work when it came."""
    p = subprocess.Popen([sys.executable, "-m", "kvaudit", *argv], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        return p.stderr.readline(), p.poll() is None
    finally:
        p.kill()
        p.wait()


# --- errors that say what to do next (issue 35) ----------------------------------------------------------------

@pytest.mark.parametrize("argv, hint", [
    (["qwen3next"], "unknown preset or command 'qwen3next' (did you mean 'qwen3-next'?)"),
    (["audit", "--preset", "llama3.1-8b"], "unknown preset 'llama3.1-8b' (did you mean 'llama-3.1-8b'?)"),
    (["qwen3-next", "--meter", "gpu"], "unknown meter 'gpu' (did you mean 'cuda'?)"),
    (["qwen3-next", "-s", "vlm"], "unknown strategy 'vlm' (did you mean 'vllm'?)"),
    (["check", "/nonexistent/kvaudit.toml"], "policy file not found (start from examples/kvaudit.toml; docs/ci.md"),
])
def test_an_unknown_name_suggests_the_nearest(capsys, argv, hint):
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and hint in err[-1], err


def test_a_name_near_nothing_suggests_nothing():
    from kvaudit.errors import did_you_mean

    assert did_you_mean("zzzz", ["qwen3-next", "cuda"]) == "" and did_you_mean("cuda", ["cuda"]) == ""
    assert did_you_mean("QWEN3_NEXT", ["qwen3-next", "qwen3-8b"]) == " (did you mean 'qwen3-next'?)"  # (case, marks)


def test_an_unavailable_meter_points_to_the_listing_and_the_dry_run(capsys, monkeypatch):
    from kvaudit.measure import meters

    monkeypatch.setattr(meters.DeviceMeter, "probe", lambda self: "no device here")
    code = main(["qwen3-next", "--meter", "cuda"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 3 and err[-1].endswith("(kvaudit meters lists what this host has; --meter meta audits without a "
                                          "device)"), err


@pytest.mark.parametrize("columns", [60, 80, 120])
@pytest.mark.parametrize("argv, header", [(["models", "llama-3.1-8b", "qwen3-next"], "preset"),
                                          (["meters"], "meter")])
def test_models_and_meters_fit_the_width_with_a_header_row(monkeypatch, capsys, columns, argv, header):
    """They had printed 168 and 103 columns whatever the terminal, with no header row, and models the path of a
    shipped config that an installed wheel does not have."""
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(argv) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= columns and any(f"┃ {header}" in line for line in lines), out
    assert "fixtures/configs" not in out


def test_a_saved_plans_audit_says_so_before_importing_torch(saved_plan):
    line, running = _first_line_while_running("audit", "--plan", str(saved_plan), "--meter", "meta")
    assert line.startswith("kvaudit: importing torch to allocate the saved plans") and running, line


def test_triage_on_a_terminal_is_rendered_and_markdown_in_a_pipe(monkeypatch, capsys):
    from kvaudit.cli import triage as cli_triage

    report = str(ROOT / "fixtures/reports/threads/vllm-27508.txt")
    assert main(["triage", report]) == 0
    piped = capsys.readouterr().out
    monkeypatch.setattr(cli_triage, "_on_terminal", lambda: True)
    assert main(["triage", report]) == 0
    shown = capsys.readouterr().out
    assert main(["triage", report, "--format", "markdown"]) == 0
    asked = capsys.readouterr().out
    assert "\\_" in piped and asked == piped  # Markdown, escapes and all, where a program reads it
    assert "\\_" not in shown and "## " not in shown and "kvaudit" in shown


def test_the_device_check_names_the_python_to_use_when_this_one_lacks_torch(tmp_path):
    """It printed a raw traceback (issue 35)."""
    import venv

    venv.create(tmp_path / "bare", with_pip=False)
    p = subprocess.run(["bash", str(ROOT / "scripts/device-check"), "run"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHON": str(tmp_path / "bare" / "bin" / "python")})
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and "cannot import torch" in lines[0] and "PYTHON=" in lines[0], p.stderr
