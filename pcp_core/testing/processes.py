"""Real `pcp` processes for end-to-end tests (`E2E`): started with their output in files,
watched, and killed (by pid) at the end of the test if still running, with any worker
that connected to a shepherd the test started. Processes are also found by their command
line through /proc, which is how tests check that no worker is left over.

    @pytest.fixture
    def e2e(tmp_path):
        harness = E2E(tmp_path / "processes")
        yield harness
        harness.end_all()
"""

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest


@dataclass
class Started:
    """A started process whose stdout and stderr go to files."""

    process: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def wait(self, timeout: float) -> int:
        return self.process.wait(timeout)

    def err(self) -> str:
        return self.stderr.read_text(errors="replace")

    def output(self) -> str:
        """stdout and stderr so far, for assertion messages."""
        return self.stdout.read_text(errors="replace") + self.err()


@dataclass
class E2E:
    """Starting `pcp` processes and watching them, for one test."""

    folder: Path
    started: list[Started] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)  # shepherds whose workers we started

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, args: list[str], **popen: Any) -> Started:
        stdout, stderr = self.folder / f"{name}.out", self.folder / f"{name}.err"
        with stdout.open("wb") as out, stderr.open("wb") as err:
            process = subprocess.Popen(args, stdout=out, stderr=err, **popen)
        handle = Started(process, stdout, stderr)
        self.started.append(handle)
        return handle

    def pcp(self, name: str, *args: str, **popen: Any) -> Started:
        """Start the `pcp` CLI in a fresh interpreter, as a user would."""
        return self.start(name, [sys.executable, "-m", "pcp_core", *args], **popen)

    def run_pcp(self, name: str, *args: str, timeout: float = 300) -> Started:
        """Run the `pcp` CLI to its end."""
        handle = self.pcp(name, *args)
        try:
            handle.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"pcp {' '.join(args)} ran over {timeout} s:\n{handle.output()[-3000:]}")
        return handle

    def shepherd(self, *args: str) -> tuple[Started, str]:
        """`pcp shepherd ARGS` on a free port of 127.0.0.1, once it listens, and its
        address (workers connecting to it are ended with the test)."""
        port = self.free_port()
        address = f"127.0.0.1:{port}"
        self.own(address)
        handle = self.pcp("shepherd", "shepherd", "--port", str(port), *args)
        self.wait_for(
            lambda: self.listening_port(handle) or handle.process.poll() is not None,
            120,
            "the shepherd to listen",
        )
        assert self.listening_port(handle) == port, handle.output()
        return handle, address

    def own(self, address: str) -> None:
        """Workers connecting to `address` were started by this test: end them at the end."""
        self.addresses.append(address)

    @contextlib.contextmanager
    def cpu_capped(self, cores: float) -> Iterator[None]:
        """Every process this test started, and every process they started, in one cgroup
        of `cores` CPUs for the block (new children are born in it); uncapped where this
        machine has no writable cgroup cpu controller."""
        from pcp_core.rehearsal.cpu import cpu_groups, quota_problem

        if quota_problem() is not None:
            yield
            return
        with cpu_groups({"capped": cores}, f"{os.getpid()}-capped") as groups:
            procs = groups.groups["capped"] / "cgroup.procs"
            pending = [handle.pid for handle in self.started if handle.process.poll() is None]
            while pending:
                pid = pending.pop()
                with contextlib.suppress(OSError):  # ended meanwhile
                    procs.write_text(str(pid))
                for children in Path(f"/proc/{pid}/task").glob("*/children"):
                    with contextlib.suppress(OSError):
                        pending += [int(child) for child in children.read_text().split()]
            yield

    def end_all(self) -> None:
        for handle in reversed(self.started):
            if handle.process.poll() is None:
                handle.process.kill()
                handle.process.wait()
        for address in self.addresses:  # workers a killed parent could not end
            for pid in self.pids_with(f"--connect {address}"):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    @staticmethod
    def wait_for(condition: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll `condition` until it returns something truthy; fail after `timeout` s."""
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.1)

    @staticmethod
    def free_port() -> int:
        """A TCP port on 127.0.0.1 that was free a moment ago."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            return probe.getsockname()[1]

    @staticmethod
    def listening_port(handle: Started, host: str = "127.0.0.1") -> int | None:
        """The port of a shepherd's "shepherd listening address=HOST:PORT" line."""
        pattern = rf"shepherd listening\s+address={re.escape(host)}:(\d+)"
        match = re.search(pattern, handle.err())
        return int(match.group(1)) if match else None

    @staticmethod
    def pids_with(text: str) -> list[int]:
        """Live processes (zombies excluded) whose command line contains `text`."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError, UnicodeDecodeError):
                continue  # gone meanwhile, or not ours to read
            if text in cmdline and state != "Z":
                found.append(int(entry.name))
        return found

    @staticmethod
    def metrics(run_dir: Path) -> list[dict[str, Any]]:
        """The records of metrics.jsonl so far (a half-written last line is left out)."""
        path = run_dir / "metrics.jsonl"
        records = []
        for line in path.read_text().splitlines() if path.exists() else []:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                break
        return records
