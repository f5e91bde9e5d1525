"""The ``python`` tool: runs the model's program in a sandboxed child process and returns what it printed.

Each call writes the program to ``main.py`` in a fresh temporary directory (removed afterwards) and
starts ``sandbox.py`` there with ``asyncio``, so many calls run at once. The child gets a minimal
environment (``PATH`` and ``LANG`` only), no stdin, resource limits and the isolation ``sandbox.py``
describes; a call that outlives ``timeout_s`` is killed with its whole process group. Building the tool
runs one empty program: on a machine without the required isolation that is a ``ConfigError``, unless
``allow_unisolated`` is set. The tool runs only when a config lists it in ``rollout.multi_turn.tools``.
What the isolation covers, and what it does not, is in docs/tools.md.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

from rlflow.config.validation import ConfigError
from rlflow.rollout.agent.tools.base import TOOL_REGISTRY, Tool, ToolResult

logger = logging.getLogger(__name__)

SANDBOX_SCRIPT = str(Path(__file__).with_name("sandbox.py"))
CHILD_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"}
MIB = 1 << 20
FILE_SIZE_MB = 8      # the largest file the program may write
OPEN_FILES = 64
PROCESSES = 64        # RLIMIT_NPROC; the kernel does not apply it to uid 0
DRAIN_GRACE_S = 1.0   # how long to wait for output after the program ended or was killed
PROBE_TIMEOUT_S = 60.0
STATUS_LIMIT = 1 << 16  # bytes of status lines kept
BYTES_PER_CHAR = 4    # each stream is read up to max_output_chars * 4 bytes (UTF-8), then decoded and cut
CUT_MARK = "\n[... output cut ...]\n"
NO_OUTPUT = "(no output: print() what you want to see)"
POSITIVE_OPTIONS = ("timeout_s", "cpu_s", "memory_mb", "max_output_chars")
MIN_MEMORY_MB = 64    # the interpreter needs about 30 MiB of address space to start

SIGNAL_NOTES = {
    signal.SIGXCPU: "killed: CPU time limit {cpu_s} s",
    signal.SIGKILL: "killed (SIGKILL; the limits are {cpu_s} s of CPU time and {memory_mb} MiB of memory)",
    signal.SIGSEGV: "crashed (SIGSEGV; the memory limit is {memory_mb} MiB)",
}

# The last stderr line of a program stopped by a limit it did not die of (Python ignores SIGXFSZ) -> the limit.
LIMIT_ERRORS = {
    "MemoryError": "memory limit {memory_mb} MiB",
    f"OSError: [Errno {errno.EFBIG}]": f"file size limit {FILE_SIZE_MB} MiB",
}


@dataclass(frozen=True)
class Run:
    """One finished run: its decoded output, the sandbox's merged status and whether it timed out.

    ``cut`` says that output was dropped while it was read (past ``max_output_chars * 4`` bytes: the
    start of stdout and the end of stderr are kept).
    """

    stdout: str
    stderr: str
    status: dict[str, Any]
    timed_out: bool = False
    cut: bool = False


class _Capture:
    """Reads a stream to its end, keeping its first (``keep="head"``) or last ``limit`` bytes."""

    def __init__(self, limit: int, keep: str) -> None:
        self.limit, self.keep = limit, keep
        self.data = bytearray()
        self.cut = False

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(1 << 16):
            self.data += chunk
            excess = len(self.data) - self.limit
            if excess > 0:
                self.cut = True
                del self.data[slice(excess) if self.keep == "tail" else slice(self.limit, None)]

    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@TOOL_REGISTRY.register("python")
class PythonTool(Tool):
    """Runs a Python 3 program (standard library only) in the sandbox of ``sandbox.py``."""

    description = ("Run a Python 3 program (standard library only, no network, writes only in its working "
                   "directory) and return what it prints. Print the values you need.")
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "the program; its output is what print() writes"}},
        "required": ["code"],
    }
    defaults = {"timeout_s": 5.0, "cpu_s": 5, "memory_mb": 512, "max_output_chars": 2000,
                "allow_unisolated": False}

    def __init__(self, options: Mapping[str, Any]) -> None:
        super().__init__(options)
        for key in POSITIVE_OPTIONS:
            if self.options[key] <= 0:
                raise ConfigError(f"{self.option_key(key)} must be > 0; got {self.options[key]}")
        if self.options["memory_mb"] < MIN_MEMORY_MB:
            raise ConfigError(f"{self.option_key('memory_mb')} must be at least {MIN_MEMORY_MB} (the interpreter "
                              f"needs that much to start); got {self.options['memory_mb']}")
        self.isolation = self._probe()

    # ------------------------------------------------------------------ the tool
    async def call(self, arguments: dict[str, Any], row_kwargs: dict[str, Any]) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str) or not code.strip():
            return ToolResult('the python tool needs a non-empty string argument "code"', error=True)
        return self.describe(await self.run(code))

    async def run(self, code: str) -> Run:
        """Run ``code`` in the sandbox; after ``timeout_s``, kill the sandbox's process group.

        The run is over when the status pipe closes: only the sandbox script and the namespace's PID 1
        hold it, so a process the program left behind cannot keep the call waiting. (``process.wait()``
        would: asyncio wakes it only once every output pipe is closed.)
        """
        limit = self.options["max_output_chars"] * BYTES_PER_CHAR
        stdout, stderr = _Capture(limit, keep="head"), _Capture(limit, keep="tail")
        status = _Capture(STATUS_LIMIT, keep="head")
        with _workspace(code) as workdir:
            status_read, status_write = os.pipe()
            try:
                status_pipe = await _open_read_pipe(status_read)
                process = await asyncio.create_subprocess_exec(
                    *self._command(status_write), **_spawn_options(workdir, status_write))
            finally:
                os.close(status_write)
            drains = asyncio.gather(stdout.drain(process.stdout), stderr.drain(process.stderr))
            status_read_to_end = asyncio.ensure_future(status.drain(status_pipe))
            timed_out = False
            try:
                await asyncio.wait_for(asyncio.shield(status_read_to_end), self.options["timeout_s"])
            except asyncio.TimeoutError:
                timed_out = True
            finally:  # timed out or cancelled: kill the sandbox script and PID 1, the kernel kills the rest
                if not status_read_to_end.done():
                    _kill_group(process.pid)
            for ending in (status_read_to_end, drains, process.wait()):
                try:
                    await asyncio.wait_for(ending, DRAIN_GRACE_S)
                except asyncio.TimeoutError:  # an escaped process still holds a pipe: keep what was read
                    pass
            return Run(stdout.text(), stderr.text(), _parse_status(status.data), timed_out, stdout.cut or stderr.cut)

    def describe(self, run: Run) -> ToolResult:
        """The result the model reads: the output on success, else the output and what went wrong."""
        status = run.status
        if "refused" in status:
            return ToolResult(status["refused"], error=True)
        if run.timed_out:
            note = f"timed out after {float(self.options['timeout_s']):.1f} s"
        elif "failed" in status:
            note = f"the sandbox failed: {status['failed']}"
        elif "signal" in status:
            note = self._signal_note(status["signal"])
        elif "exit" not in status:
            lines = run.stderr.strip().splitlines()
            note = f"the sandbox failed: {lines[-1] if lines else 'it reported nothing'}"
        elif status["exit"] == 0:
            return ToolResult(self._shown(run.stdout, "", run.cut) or NO_OUTPUT)
        else:
            note = self._exit_note(status["exit"], run.stderr)
        body = self._shown(run.stdout, run.stderr, run.cut)
        return ToolResult(f"{body.rstrip()}\n{note}" if body.strip() else note, error=True)

    def _shown(self, stdout: str, stderr: str, cut: bool) -> str:
        """stdout then stderr in at most ``max_output_chars`` characters: the start of stdout and the end of
        stderr (where the error is) stay, with ``CUT_MARK`` where the rest was."""
        limit = self.options["max_output_chars"]
        if len(stdout) + len(stderr) <= limit and not cut:
            return stdout + stderr
        stderr_room = min(len(stderr), limit - min(len(stdout), limit // 2))
        return f"{stdout[:limit - stderr_room]}{CUT_MARK}{stderr[len(stderr) - stderr_room:]}"

    def _signal_note(self, number: int) -> str:
        template = SIGNAL_NOTES.get(number, f"killed by signal {signal.Signals(number).name}")
        return template.format(**self.options)

    def _exit_note(self, code: int, stderr: str) -> str:
        last_line = (stderr.strip().splitlines() or [""])[-1]
        limit = next((limit for error, limit in LIMIT_ERRORS.items() if last_line.startswith(error)), None)
        return f"exit status {code}" + (f" ({limit.format(**self.options)} reached)" if limit else "")

    # ------------------------------------------------------------------ the sandbox
    def _command(self, status_fd: int) -> list[str]:
        cpu_s, memory = int(self.options["cpu_s"]), self.options["memory_mb"] * MIB
        limits = {"RLIMIT_CPU": [cpu_s, cpu_s + 1], "RLIMIT_AS": [memory, memory],
                  "RLIMIT_FSIZE": [FILE_SIZE_MB * MIB] * 2, "RLIMIT_NOFILE": [OPEN_FILES] * 2,
                  "RLIMIT_NPROC": [PROCESSES] * 2, "RLIMIT_CORE": [0, 0]}
        config = {"status_fd": status_fd, "parent_pid": os.getpid(), "rlimits": limits,
                  "allow_unisolated": self.options["allow_unisolated"]}
        return [sys.executable, "-I", "-S", "-B", SANDBOX_SCRIPT, json.dumps(config)]

    def _probe(self) -> tuple[str, ...]:
        """Run an empty program once: the isolation this machine gives, or a ConfigError saying what is missing."""
        with _workspace("") as workdir:
            status_read, status_write = os.pipe()
            try:
                finished = subprocess.run(self._command(status_write), **_spawn_options(workdir, status_write),
                                          timeout=PROBE_TIMEOUT_S)
            finally:
                os.close(status_write)
            with os.fdopen(status_read, "rb") as status_pipe:
                status = _parse_status(status_pipe.read())
        if "refused" in status:
            raise ConfigError(status["refused"])
        if status.get("exit") != 0:
            stderr = finished.stderr.decode(errors="replace").strip()
            raise ConfigError(f"the python tool's sandbox does not work here: {status.get('failed') or stderr}")
        isolation = tuple(status["isolation"])
        logger.info("python tool isolation: %s", ", ".join(isolation))
        if status["missing"]:
            logger.warning("python tool runs WITHOUT: %s (allow_unisolated)", "; ".join(status["missing"]))
        return isolation


@contextmanager
def _workspace(code: str) -> Iterator[str]:
    """A fresh temporary directory holding ``main.py``; removed on exit, whatever the program left in it."""
    with tempfile.TemporaryDirectory(prefix="rlflow-python-tool-", ignore_cleanup_errors=True) as workdir:
        Path(workdir, "main.py").write_text(code)
        yield workdir


async def _open_read_pipe(fd: int) -> asyncio.StreamReader:
    """An asyncio reader of the pipe ``fd`` (which it takes over and closes at end of file)."""
    reader = asyncio.StreamReader()
    await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                       os.fdopen(fd, "rb", buffering=0))
    return reader


def _spawn_options(workdir: str, status_fd: int) -> dict[str, Any]:
    """The keyword arguments both ``subprocess.run`` and ``asyncio.create_subprocess_exec`` take."""
    return {"cwd": workdir, "env": dict(CHILD_ENV), "stdin": subprocess.DEVNULL, "stdout": subprocess.PIPE,
            "stderr": subprocess.PIPE, "start_new_session": True, "pass_fds": (status_fd,)}


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:  # the group is already empty
        pass


def _parse_status(data: bytes) -> dict[str, Any]:
    """The status lines the sandbox wrote, merged: ``isolation`` and ``missing`` add up, later keys win."""
    merged: dict[str, Any] = {"isolation": [], "missing": []}
    for line in data.decode(errors="replace").splitlines():
        try:
            fields = json.loads(line)
        except json.JSONDecodeError:
            continue
        for key, value in fields.items():
            merged[key] = merged[key] + value if key in ("isolation", "missing") else value
    return merged
