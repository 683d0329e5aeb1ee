"""Conformance suite for launchers. A launcher package proves itself in two lines:

    class TestMyLauncher(LauncherConformance):
        launcher_name = "mine"

It is registered with a name, a description and options described in words; its plan
names files inside the run directory (the submit script among them), submits with a
list of words, and is the same for the same request; every process it starts reads the
token file, and the secret itself appears in no file it writes, no command it runs and
no record of the launch; every file it writes is its owner's alone; an option it does
not take is refused. Submitting is not exercised here (it needs the engine): test that
against a real one, as PCP's own launchers are (tests/test_launch_engines.py).
"""

import stat
from pathlib import Path
from typing import Any, ClassVar

import pytest

from pcp_core.launchers import LaunchError, LaunchPlan, LaunchRequest


class LauncherConformance:
    launcher_name: ClassVar[str]
    options: ClassVar[dict[str, str]] = {}  # settings the plan needs, if any

    @pytest.fixture
    def launcher(self) -> Any:
        from pcp_core import plugins

        return plugins.host().launcher(self.launcher_name)

    def request(self, launcher: Any, run_dir: Path) -> LaunchRequest:
        from pcp_core.launch.prepare import build_request

        return build_request(
            launcher,
            run_dir,
            workers=3,
            port=7171,
            python="/opt/pcp/bin/python",
            shepherd_args=["--steps", "100", "--inner-steps", "10"],
            worker_args=["--backend", "cpu"],
            options=self.options,
        )

    def written(self, launcher: Any, run_dir: Path) -> tuple[LaunchRequest, LaunchPlan]:
        from pcp_core.launch.prepare import write

        request = self.request(launcher, run_dir)
        return request, write(launcher, request, dry_run=True)

    def test_registered(self, launcher: Any) -> None:
        assert launcher.name == self.launcher_name and launcher.description
        assert all(isinstance(k, str) and v for k, v in launcher.options.items())

    def test_plan_is_files_in_the_run_directory_and_a_command(
        self, launcher: Any, tmp_path: Path
    ) -> None:
        plan = launcher.plan(self.request(launcher, tmp_path / "run"))
        assert plan.files and all(isinstance(text, str) for text in plan.files.values())
        for name in plan.files:
            assert not Path(name).is_absolute() and ".." not in Path(name).parts, name
            assert name not in ("token", "launch.json"), f"{name} is the core's"
        assert plan.executable is None or plan.executable in plan.files
        assert plan.submit is None or all(isinstance(w, str) for w in plan.submit)

    def test_plan_is_deterministic(self, launcher: Any, tmp_path: Path) -> None:
        request = self.request(launcher, tmp_path / "run")
        assert launcher.plan(request) == launcher.plan(request)

    def test_every_process_reads_the_token_file_and_no_secret_is_written(
        self, launcher: Any, tmp_path: Path
    ) -> None:
        request, plan = self.written(launcher, tmp_path / "run")
        secret = request.token_file.read_text().strip()
        assert len(secret) >= 32
        texts = {p.name: p.read_text() for p in request.run_dir.iterdir() if p.name != "token"}
        assert any(str(request.token_file) in text for text in plan.files.values())
        for name, text in texts.items():
            assert secret not in text, f"the secret is in {name}"
        assert secret not in " ".join(plan.submit or ())

    def test_files_are_the_owners_alone(self, launcher: Any, tmp_path: Path) -> None:
        request, plan = self.written(launcher, tmp_path / "run")
        for path in request.run_dir.iterdir():
            mode = stat.S_IMODE(path.stat().st_mode)
            assert mode & 0o077 == 0, f"{path.name} has mode {mode:04o}"
        if plan.executable:
            assert (request.run_dir / plan.executable).stat().st_mode & stat.S_IXUSR

    def test_an_unknown_option_is_refused(self, launcher: Any, tmp_path: Path) -> None:
        from pcp_core.launch.prepare import build_request

        with pytest.raises(LaunchError, match="no-such-option"):
            build_request(launcher, tmp_path, 2, 7171, "python", [], [], {"no-such-option": "1"})
