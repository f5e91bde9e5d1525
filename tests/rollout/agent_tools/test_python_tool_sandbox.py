"""The python tool runs code in an isolated, limited child process; every failure is an error result.

These tests run real sandboxes on this machine: they check that writes outside the working directory,
network connections, the parent's environment and runaway programs are all stopped, not just reported.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlflow.config.validation import ConfigError
from rlflow.rollout.agent.tools import sandbox
from rlflow.rollout.agent.tools.base import ToolResult, build_tools
from rlflow.rollout.agent.tools.python_tool import CUT_MARK, PythonTool, Run

REQUIRED_ISOLATION = {"user-namespace", "network-namespace", "pid-namespace", "no-new-privs", "rlimits",
                      "landlock-filesystem", "landlock-tcp", "seccomp-no-unix-sockets"}


@pytest.fixture(scope="module")
def tool() -> PythonTool:
    return build_tools(["python"], {"python": {"timeout_s": 10, "memory_mb": 256}})["python"]


def run(tool: PythonTool, code: str) -> ToolResult:
    return asyncio.run(tool.call({"code": textwrap.dedent(code)}, {}))


def sandbox_processes(marker: str = "rlflow-python-tool-") -> list[int]:
    """Host pids of the processes whose working directory's path contains ``marker`` (a sandbox's workspace)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker in os.readlink(entry / "cwd"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def no_sandbox_left(marker: str = "rlflow-python-tool-", deadline_s: float = 3.0) -> bool:
    end = time.monotonic() + deadline_s
    while sandbox_processes(marker) and time.monotonic() < end:
        time.sleep(0.05)
    return not sandbox_processes(marker)


def test_this_machine_gives_the_full_isolation(tool):
    assert REQUIRED_ISOLATION <= set(tool.isolation), tool.isolation


def test_prints_output(tool):
    assert run(tool, "print(6 * 7)\nprint('ok')") == ToolResult("42\nok\n")
    assert run(tool, "x = 1") == ToolResult("(no output: print() what you want to see)")


def test_an_exception_is_an_error_result_ending_with_the_traceback(tool):
    result = run(tool, "print('before')\n1 / 0")
    lines = result.text.splitlines()
    assert result.error and lines[0] == "before" and "Traceback (most recent call last):" in lines
    assert lines[-2:] == ["ZeroDivisionError: division by zero", "exit status 1"]
    assert run(tool, "import sys; sys.exit(3)") == ToolResult("exit status 3", error=True)


def test_an_infinite_loop_is_killed_at_the_timeout_with_everything_it_started():
    tool = PythonTool({"timeout_s": 2, "cpu_s": 60})
    start = time.monotonic()
    result = run(tool, """
        import os, time
        if os.fork() == 0:
            os.setsid()  # leave the process group: only the PID namespace still holds it
            time.sleep(600)
        while True:
            pass
    """)
    assert time.monotonic() - start < 2 + 3
    assert result == ToolResult("timed out after 2.0 s", error=True)
    assert no_sandbox_left()


def test_background_processes_die_when_the_program_ends(tool):
    result = run(tool, """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(600)
        print("parent done")
    """)
    assert result == ToolResult("parent done\n")
    assert no_sandbox_left()


def test_a_cancelled_call_kills_its_sandbox(tool):
    async def cancel_after_start():
        call = asyncio.ensure_future(tool.call({"code": "import time; time.sleep(600)"}, {}))
        await asyncio.sleep(1.0)
        assert sandbox_processes()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.sleep(0.5)  # let asyncio see the killed process exit before the loop closes

    asyncio.run(cancel_after_start())
    assert no_sandbox_left()


def test_the_sandbox_dies_with_the_process_that_started_it(tmp_path):
    """A rollout worker killed mid-call takes its sandboxes along (each process has a parent-death signal)."""
    workdir = tmp_path / "rlflow-python-tool-orphan"
    workdir.mkdir()
    (workdir / "main.py").write_text("import time\ntime.sleep(600)\n")
    launcher = textwrap.dedent("""
        import json, os, subprocess, sys, time
        status = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
        config = {"status_fd": status, "parent_pid": os.getpid(), "rlimits": {}, "allow_unisolated": False}
        subprocess.Popen([sys.executable, "-I", "-S", "-B", sys.argv[2], json.dumps(config)], pass_fds=(status,),
                         cwd=sys.argv[3])
        time.sleep(600)
    """)
    worker = subprocess.Popen([sys.executable, "-c", launcher, str(tmp_path / "status"), sandbox.__file__,
                               str(workdir)])
    try:
        end = time.monotonic() + 30
        while len(sandbox_processes(str(workdir))) < 3 and time.monotonic() < end:  # script, PID 1, program
            time.sleep(0.05)
        assert len(sandbox_processes(str(workdir))) == 3
        worker.kill()
        worker.wait()
        assert no_sandbox_left(str(workdir))
    finally:
        worker.kill()
        for pid in sandbox_processes(str(workdir)):
            os.kill(pid, 9)


def test_the_cpu_limit_kills_a_busy_program():
    result = run(PythonTool({"timeout_s": 60, "cpu_s": 1}), "while True: pass")
    assert result == ToolResult("killed: CPU time limit 1 s", error=True)


def test_a_memory_bomb_is_an_error_result(tool):
    result = run(tool, "blocks = []\nwhile True: blocks.append(bytearray(10 ** 7))")
    assert result.error and result.text.splitlines()[-2:] == [
        "MemoryError", "exit status 1 (memory limit 256 MiB reached)"], result
    assert run(tool, "x = bytearray(1 << 30)").text.endswith("\nexit status 1 (memory limit 256 MiB reached)")


def test_a_big_file_hits_the_file_size_limit(tool):
    result = run(tool, "open('big', 'wb').write(b'x' * (9 << 20))")
    assert result.error and result.text.splitlines()[-2:] == [
        "OSError: [Errno 27] File too large", "exit status 1 (file size limit 8 MiB reached)"], result


def test_writes_outside_the_working_directory_fail_and_inside_work(tool, tmp_path):
    home = Path(os.environ.get("HOME") or Path.home())
    name = f"rlflow-sandbox-escape-{os.getpid()}.txt"
    outside = [tmp_path / name, home / name, Path("/tmp") / name]
    existing = tmp_path / "existing.txt"
    existing.write_text("original")
    try:
        result = run(tool, f"""
            import errno, os
            for target in {[str(path) for path in outside] + [str(existing)]!r}:
                try:
                    with open(target, "a") as file:
                        file.write("escaped")
                    print("WROTE", target)
                except OSError as error:
                    print("refused", errno.errorcode[error.errno])
            for attempt in (lambda: os.mkdir({str(tmp_path / "dir")!r}),
                            lambda: os.symlink("x", {str(tmp_path / "link")!r}),
                            lambda: os.link({str(existing)!r}, "hard"),
                            lambda: os.rename("main.py", {str(tmp_path / "moved.py")!r})):
                try:
                    attempt()
                    print("DID", attempt)
                except OSError as error:
                    print("refused", errno.errorcode[error.errno])
            os.symlink({str(existing)!r}, "inside-link")
            try:
                open("inside-link", "w").write("escaped")
                print("WROTE through a symlink")
            except OSError as error:
                print("refused", errno.errorcode[error.errno])
            os.makedirs("sub/dir")
            with open("sub/dir/mine.txt", "w") as file:
                file.write("inside")
            print(open("sub/dir/mine.txt").read(), os.listdir("."))
        """)
        assert not result.error, result
        lines = result.text.splitlines()
        # a hard link from outside is refused as a cross-device link: Landlock's answer to a missing REFER right
        assert lines[:9] == ["refused EACCES"] * 6 + ["refused EXDEV"] + ["refused EACCES"] * 2, result.text
        assert lines[9].startswith("inside ['") and "'sub'" in lines[9]
        assert not any(path.exists() for path in outside)
        assert existing.read_text() == "original"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.txt"]
    finally:
        for path in outside:
            path.unlink(missing_ok=True)


def test_the_parent_environment_is_not_visible(tool, monkeypatch):
    monkeypatch.setenv("RLFLOW_SANDBOX_MARKER", "marker-secret-4711")
    result = run(tool, f"""
        import errno, os
        print(sorted(os.environ))
        try:
            print(open("/proc/{os.getpid()}/environ", "rb").read())
        except OSError as error:
            print("refused", errno.errorcode[error.errno])
    """)
    assert result == ToolResult("['LANG', 'PATH']\nrefused EACCES\n")


def test_processes_outside_the_sandbox_cannot_be_signalled_or_traced(tool):
    """The namespace's PID 1 is outside the Landlock domain (signal scoping); this process is not even visible."""
    result = run(tool, f"""
        import errno, os
        for attempt in (lambda: os.kill(1, 0), lambda: os.kill({os.getpid()}, 0),
                        lambda: open("/proc/{os.getpid()}/mem", "rb")):
            try:
                attempt()
                print("REACHED")
            except OSError as error:
                print("refused", errno.errorcode[error.errno])
    """)
    assert result == ToolResult("refused EPERM\nrefused ESRCH\nrefused EACCES\n")


def test_the_network_and_unix_sockets_are_unreachable(tool, tmp_path):
    with socket.socket() as tcp, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp, \
            socket.socket(socket.AF_UNIX) as unix:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        udp.bind(("127.0.0.1", 0))
        unix.bind(str(tmp_path / "server.sock"))
        unix.listen()
        result = run(tool, f"""
            import socket
            attempts = {{
                "tcp": lambda: socket.create_connection(("127.0.0.1", {tcp.getsockname()[1]}), timeout=2),
                "udp": lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
                    b"leak", ("127.0.0.1", {udp.getsockname()[1]})),
                "unix": lambda: socket.socket(socket.AF_UNIX).connect({str(tmp_path / "server.sock")!r}),
                "dns": lambda: socket.getaddrinfo("example.com", 80),
            }}
            for name, attempt in attempts.items():
                try:
                    attempt()
                    print(name, "CONNECTED")
                except OSError as error:
                    print(name, "refused")
        """)
        assert result == ToolResult("tcp refused\nudp refused\nunix refused\ndns refused\n")
        for server in (tcp, udp, unix):
            server.settimeout(0.5)
        with pytest.raises(socket.timeout):
            tcp.accept()
        with pytest.raises(socket.timeout):
            udp.recv(16)
        with pytest.raises(socket.timeout):
            unix.accept()


def test_without_namespaces_landlock_still_blocks_tcp_and_writes(tmp_path):
    """The fallback: with user namespaces used up, the sandbox runs on Landlock alone and says so."""
    workdir, status = tmp_path / "work", tmp_path / "status"
    workdir.mkdir()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        server.settimeout(0.5)
        (workdir / "main.py").write_text(textwrap.dedent(f"""
            import socket
            for name, attempt in (("tcp", lambda: socket.create_connection(("127.0.0.1", {server.getsockname()[1]}))),
                                  ("write", lambda: open({str(tmp_path / "escaped")!r}, "w"))):
                try:
                    attempt()
                    print(name, "DONE")
                except OSError:
                    print(name, "refused")
        """))
        config = json.dumps({"status_fd": 3, "parent_pid": os.getpid(), "rlimits": {}, "allow_unisolated": False})
        # In a user namespace of its own with max_user_namespaces 0, the sandbox cannot unshare.
        script = (f"echo 0 > /proc/sys/user/max_user_namespaces && exec {sys.executable} -I -S -B "
                  f"{sandbox.__file__} '{config}' 3>{status}")
        finished = subprocess.run(["unshare", "--user", "--map-root-user", "sh", "-c", script], cwd=workdir,
                                  capture_output=True, text=True, timeout=60)
        assert finished.stdout == "tcp refused\nwrite refused\n", finished
        with pytest.raises(socket.timeout):
            server.accept()
    reports = [json.loads(line) for line in status.read_text().splitlines()]
    isolation = [name for report in reports for name in report.get("isolation", [])]
    assert "network-namespace" not in isolation and {"landlock-filesystem", "landlock-tcp"} <= set(isolation)
    assert reports[0]["missing"] == ["user, network and PID namespaces (unshare(user, network, pid): No space left on "
                                     "device)"]
    assert not (tmp_path / "escaped").exists()


def test_a_machine_without_the_mechanisms_refuses_to_run(tool, monkeypatch):
    def no_namespaces():
        raise OSError(1, "unshare(user, network, pid): Operation not permitted")

    monkeypatch.setattr(sandbox, "enter_namespaces", no_namespaces)
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: (0, "the kernel has no Landlock"))
    read, write = os.pipe()
    try:
        config = {"status_fd": write, "parent_pid": os.getppid(), "rlimits": {}, "allow_unisolated": False}
        sandbox.main(["sandbox.py", json.dumps(config)])  # refuses before it forks or changes this process
    finally:
        os.close(write)
    with os.fdopen(read) as status:
        report = json.loads(status.read())
    assert report["refused"].startswith(
        "the python tool needs network isolation: a network namespace (unshare(user, network, pid): Operation not "
        "permitted) or Landlock ABI >= 4 for TCP (this kernel: none); and filesystem isolation: Landlock (the "
        "kernel has no Landlock). Nothing ran.")
    assert "rollout.multi_turn.tool_options.python.allow_unisolated=true" in report["refused"]
    assert tool.describe(Run("", "", {"refused": report["refused"]})) == ToolResult(report["refused"], error=True)


def test_output_is_cut_to_max_output_chars_keeping_the_error():
    tool = PythonTool({"max_output_chars": 200})
    long = run(tool, "print('a' * 100_000)")
    assert not long.error and long.text.startswith("a" * 100) and long.text.endswith(CUT_MARK)
    assert len(long.text) == 200 + len(CUT_MARK)
    failed = run(tool, "print('a' * 100_000)\nraise ValueError('the end')")
    assert failed.error and failed.text.startswith("a") and CUT_MARK in failed.text
    assert failed.text.splitlines()[-2:] == ["ValueError: the end", "exit status 1"]


def test_calls_run_concurrently(tool):
    async def four():
        return await asyncio.gather(*(tool.call({"code": "import time; time.sleep(1); print('slept')"}, {})
                                      for _ in range(4)))

    start = time.monotonic()
    results = asyncio.run(four())
    assert results == [ToolResult("slept\n")] * 4
    assert time.monotonic() - start < 3.5


@pytest.mark.parametrize("arguments", [{}, {"code": ""}, {"code": 42}])
def test_missing_code_is_an_error_result(tool, arguments):
    result = asyncio.run(tool.call(arguments, {}))
    assert result == ToolResult('the python tool needs a non-empty string argument "code"', error=True)


@pytest.mark.parametrize("options, message", [
    ({"timeout_s": 0}, r"rollout.multi_turn.tool_options.python.timeout_s must be > 0; got 0"),
    ({"memory_mb": 32}, r"python.memory_mb must be at least 64"),
    ({"cpu_s": 1.5}, r"python.cpu_s must be of type int; got 1.5"),
    ({"allow_unisolated": "yes"}, r"python.allow_unisolated must be of type bool"),
    ({"timeout": 3}, r"unknown option rollout.multi_turn.tool_options.python.timeout; the python tool takes: "
                     r"allow_unisolated, cpu_s, max_output_chars, memory_mb, timeout_s"),
])
def test_bad_options_are_config_errors(options, message):
    with pytest.raises(ConfigError, match=message):
        PythonTool(options)
