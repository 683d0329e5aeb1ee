"""Draw `--lr-schedule`'s four schedules (pcp_core.optimizers.learning_rate, the function
the programs run) for docs/training.md:

    python scripts/plot_lr_schedules.py    # writes docs/lr_schedules.png
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from pcp_core.optimizers import SCHEDULES, InnerSettings, learning_rate

STEPS = 1000
OUT = Path(__file__).parents[1] / "docs" / "lr_schedules.png"


def main() -> None:
    figure, axes = plt.subplots(figsize=(7, 3.2))
    for kind in SCHEDULES:
        settings = InnerSettings(
            lr=3e-3, min_lr=3e-4, warmup_steps=100, total_steps=STEPS, schedule=kind,
            decay_steps=round(0.2 * STEPS),
        )  # fmt: skip
        rate = learning_rate(settings)
        axes.plot(range(STEPS + 1), [float(rate(step)) for step in range(STEPS + 1)], label=kind)
    axes.set_xlabel("step (--steps 1000, --warmup-steps 100)")
    axes.set_ylabel("learning rate")
    axes.set_title("--lr-schedule, --lr 3e-3 (--min-lr: a tenth; wsd: --decay-fraction 0.2)")
    axes.legend()
    figure.tight_layout()
    figure.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
