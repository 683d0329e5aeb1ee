"""A rich progress bar showing step, loss and tokens/s (the CLI's `Progress`)."""

from types import TracebackType

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class RichProgress:
    def __init__(self) -> None:
        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}  {task.fields[tokens_per_s]:,.0f} tok/s"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            redirect_stderr=True,
        )
        self._task = None

    def __enter__(self) -> "RichProgress":
        self._bar.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self._bar.stop()

    def start(self, total_steps: int, description: str) -> None:
        if self._task is not None:
            self._bar.remove_task(self._task)
        self._task = self._bar.add_task(
            description, total=total_steps, loss=float("nan"), tokens_per_s=0.0
        )

    def update(self, step: int, **fields: float) -> None:
        if self._task is not None:
            self._bar.update(self._task, completed=step, **fields)
