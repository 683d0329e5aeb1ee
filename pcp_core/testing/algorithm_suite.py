"""The algorithm conformance suite. An algorithm package proves itself in three lines:

    class TestMyAlgorithm(AlgorithmConformance):
        algorithm_name = "mine"

It trains with `pcp_core.run.train` (in this process, the CPU backend, a tiny model, a
few steps) and checks that the run writes its config, metrics and a summary whose final
loss is finite and below the loss of an untrained model; and runs `pcp train
--algorithm NAME` as a user would (a fresh process) with a bad setting, which must be
refused with a one-line error.
"""

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

TINY_MODEL = ("--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16")
TINY_RUN = (*TINY_MODEL, "--batch-size", "8", "--steps", "40", "--eval-every", "20")


def flag_values(args: tuple[str, ...]) -> dict[str, str]:
    """`("--inner-steps", "10", ...)` as settings by name, for `config_file.resolve`."""
    names, values = args[::2], args[1::2]
    if len(names) != len(values) or not all(name.startswith("--") for name in names):
        raise ValueError(f"expected --FLAG VALUE pairs, got {args}")
    return {name[2:].replace("-", "_"): value for name, value in zip(names, values, strict=True)}


def run_pcp(*args: str, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """The `pcp` CLI of this environment in a fresh interpreter."""
    return subprocess.run(
        [sys.executable, "-m", "pcp_core", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=timeout,
        env={**os.environ, "COLUMNS": "200"},
    )


class AlgorithmConformance:
    algorithm_name: ClassVar[str]
    extra_args: ClassVar[tuple[str, ...]] = ()  # the algorithm's own flags for a short run

    def train(self, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
        out = tmp_path / "run"
        command = ("train", "--algorithm", self.algorithm_name, "--backend", "cpu", "--out")
        result = run_pcp(*command, str(out), *TINY_RUN, *self.extra_args, *args, cwd=tmp_path)
        return result, out

    def test_trains_to_a_summary(self, tmp_path: Path) -> None:
        # imported here, not at the top: collecting a plugin's tests stays fast
        from pcp_core import plugins, run
        from pcp_core.config_file import declared_settings, resolve

        flags: dict[str, Any] = flag_values((*TINY_RUN, *self.extra_args))
        flags |= {"algorithm": self.algorithm_name, "backend": "cpu", "out": tmp_path / "run"}
        config = resolve(None, flags, declared=declared_settings(plugins.host()))
        out = Path(run.train(config, dashboard=False)["run_dir"])
        summary: dict[str, Any] = json.loads((out / "summary.json").read_text())
        assert (out / "config.toml").is_file() and (out / "metrics.jsonl").is_file()
        loss = summary["final_train_loss"]
        assert math.isfinite(loss) and loss < summary["unigram_entropy"] + 0.5, summary

    def test_bad_setting_is_a_one_line_error(self, tmp_path: Path) -> None:
        result, _ = self.train(tmp_path, "--n-head", "3")  # 32 is not divisible by 3
        assert result.returncode == 2, result.stderr[-3000:]
        assert result.stderr.startswith("error:") and "Traceback" not in result.stderr
