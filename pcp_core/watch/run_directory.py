"""A run directory: where a run writes its config.toml, metrics.jsonl, summary.json and
checkpoints, and how an earlier run in it is recognised and replaced."""

import contextlib
import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

from pcp_core import config as run_config
from pcp_core import config_file
from pcp_core.watch.metrics import finite_json


def new_run_dir(root: Path = Path("runs")) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    path = root / stamp
    suffix = 1
    while path.exists():
        suffix += 1
        path = root / f"{stamp}-{suffix}"
    return path


# What a run leaves in its directory: the first four mark it as a run (see
# `earlier_run`); --overwrite removes them all, local workers' logs and saved state too.
RUN_MARKERS = ("config.toml", "metrics.jsonl", "summary.json", "checkpoint*")
RUN_FILES: tuple[str, ...] = (
    *RUN_MARKERS,
    "metrics.jsonl.partial",
    "summary.json.partial",
    "loss.png",
)
RUN_FILES += ("worker-[0-9]*",)  # worker-N.log and worker-N/, the inner state


def earlier_run(run_dir: Path) -> list[str]:
    """The names of the files that show `run_dir` already holds a run; none if it is new."""
    if not run_dir.is_dir():
        return []
    return sorted({p.name for pattern in RUN_MARKERS for p in run_dir.glob(pattern)})


def remove_earlier_run(run_dir: Path) -> None:
    """Delete what an earlier run wrote into `run_dir`, so nothing of it is taken for this
    run's (metrics appended to, a checkpoint resumed from); other files stay."""
    for path in sorted({p for pattern in RUN_FILES for p in run_dir.glob(pattern)}):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()


def start_run_dir(run_dir: Path, config: run_config.RunConfig) -> None:
    """Create the run directory (unless it exists) and write its config.toml into it;
    one that cannot be created or written is a ConfigError, and one created here is
    removed again."""
    created = not run_dir.exists()
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(config_file.to_toml(config), encoding="utf-8")
    except OSError as error:
        if created and run_dir.is_dir():
            with contextlib.suppress(OSError):
                run_dir.rmdir()
        raise run_config.ConfigError(
            f"cannot write the run directory {run_dir}: {error.strerror or error}"
        ) from None


def write_json(path: Path, data: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    try:
        partial.write_text(json.dumps(finite_json(data), indent=2) + "\n", encoding="utf-8")
        partial.replace(path)
    except OSError:
        partial.unlink(missing_ok=True)
        raise
