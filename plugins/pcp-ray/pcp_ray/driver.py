"""The driver of a Ray launch: `python -m pcp_ray.driver RUN_DIR/pcp-ray.json`.

It joins the Ray cluster, starts the shepherd's actor, then one actor per worker, each
placed by the resources the plan names, and waits for the shepherd to end. The actors
belong to the driver: when it ends (the run is over, Ctrl-C, SIGTERM, or the driver
dies), Ray ends them and their processes with it. A worker actor that dies is restarted
by Ray (up to `max-restarts` times); the new actor starts its process again, and the new
worker rejoins. Running the driver again resumes the run from its last checkpoint.
"""

import json
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import structlog

from pcp_core.cli.common import configure_logging
from pcp_core.launch.script import WORKERS_GRACE_S
from pcp_ray.launcher import LOCAL

log = structlog.get_logger(__name__)

POLL_S = 1.0  # how often the driver wakes while it waits (so signals are taken)
PLACEMENT_WARN_S = 60.0  # how often it says that actors still wait for resources
SIGNALLED: list[str] = []  # the signals that asked the driver to stop
KEPT_FROM_ACTORS = {"PCP_TOKEN"}  # the secret travels in the token file, never through Ray


def pcp_environment() -> dict[str, str]:
    """The driver's PCP_* settings (log format, cache, ...), for the actors' processes:
    Ray starts actors with its raylet's environment, not the driver's."""
    return {
        name: value
        for name, value in os.environ.items()
        if name.startswith("PCP_") and name not in KEPT_FROM_ACTORS
    }


class NoCluster(RuntimeError):
    """The plan's Ray cluster cannot be reached."""


class Stopped(Exception):
    """SIGTERM or SIGINT reached the driver."""


def local_resources(plan: dict[str, Any]) -> dict[str, Any]:
    """ray.init's arguments for a Ray of this machine alone: logical CPUs and custom
    resources enough for every actor of the plan (one machine's actors share its cores,
    as local workers do), the GPUs as Ray finds them."""
    workers = plan["workers"]
    wanted = {name: amount * workers for name, amount in plan["worker_resources"].items()}
    for name, amount in plan["shepherd_resources"].items():
        wanted[name] = wanted.get(name, 0) + amount
    cpus = 1 + math.ceil(plan["cpus_per_worker"] * workers)
    return {"address": None, "num_cpus": max(cpus, os.cpu_count() or 1), "resources": wanted}


def start_actors(plan: dict[str, Any]) -> tuple[Any, list[Any]]:
    """The shepherd's and the workers' actors, their processes running."""
    import ray

    from pcp_ray.actors import PcpProcess

    run_dir = Path(plan["run_dir"])
    restarts = plan["max_restarts"]
    runtime_env = {"env_vars": pcp_environment()}
    shepherd = PcpProcess.options(  # type: ignore[attr-defined]  # mypy skips @ray.remote
        name="shepherd",
        num_cpus=1,
        resources=plan["shepherd_resources"],
        max_restarts=restarts,
        max_task_retries=-1,
        runtime_env=runtime_env,
    ).remote(plan["shepherd"], str(run_dir / "shepherd.log"), shepherd_dir=plan["shepherd_dir"])
    address = shepherd.node_address.remote()
    placed([address], "shepherd", {"CPU": 1, **plan["shepherd_resources"]})
    host = ray.get(address)
    log.info("shepherd started", node=host, log=str(run_dir / "shepherd.log"))
    workers = [
        PcpProcess.options(  # type: ignore[attr-defined]  # mypy skips @ray.remote
            name=f"worker-{index}",
            num_cpus=plan["cpus_per_worker"],
            num_gpus=plan["gpus_per_worker"],
            resources=plan["worker_resources"],
            max_restarts=restarts,
            max_task_retries=-1,
            runtime_env=runtime_env,
        ).remote(plan["worker"], str(run_dir / f"worker-{index}.log"), shepherd=host)
        for index in range(plan["workers"])
    ]
    addresses = [worker.node_address.remote() for worker in workers]  # answered once placed
    asked = {"CPU": plan["cpus_per_worker"], "GPU": plan["gpus_per_worker"]}
    placed(addresses, "workers", {**asked, **plan["worker_resources"]})
    log.info("workers started", count=len(workers), logs=str(run_dir / "worker-N.log"))
    return shepherd, workers


def placed(refs: list[Any], what: str, asked: dict[str, float]) -> None:
    """Wait until Ray has placed the actors whose `node_address` calls are `refs`,
    warning every PLACEMENT_WARN_S while some still wait for resources."""
    pending = refs
    while pending := wait_for(pending, PLACEMENT_WARN_S):
        log.warning(
            "actors wait for resources that the cluster lacks or has in use",
            actors=what,
            waiting=len(pending),
            each_asks=asked,
        )


def wait_for(refs: list[Any], seconds: float | None) -> list[Any]:
    """Wait for all of `refs` (None: for ever), waking every POLL_S for signals; the
    ones still running."""
    import ray

    deadline = None if seconds is None else time.monotonic() + seconds
    pending = list(refs)
    while pending and (deadline is None or time.monotonic() < deadline):
        _, pending = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        if SIGNALLED:
            raise Stopped(SIGNALLED[0])
    return pending


def exit_statuses(actors: list[Any], seconds: float | None) -> list[int | None]:
    """The exit statuses of the actors' processes once all have ended, or as they stand
    after `seconds` (None: wait for ever), None for one still running; 1 for an actor that
    died and that Ray will not restart.

    Each actor is asked anew every POLL_S, so the driver takes signals, and reaches an
    actor that Ray restarted, whose process is a new one.
    """
    import ray

    deadline = None if seconds is None else time.monotonic() + seconds
    statuses: list[int | None] = [None] * len(actors)
    while True:
        asked = {i: actors[i].exit_status.remote() for i, s in enumerate(statuses) if s is None}
        answered, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=POLL_S)
        for i, ref in asked.items():
            if ref in answered:
                try:
                    statuses[i] = ray.get(ref)
                except ray.exceptions.RayActorError as error:
                    log.warning("an actor died for good", error=str(error).splitlines()[0])
                    statuses[i] = 1
        if SIGNALLED:
            raise Stopped(SIGNALLED[0])
        if all(s is not None for s in statuses):
            return statuses
        if deadline is not None and time.monotonic() >= deadline:
            return statuses
        time.sleep(POLL_S)


def stop_on_signals() -> None:
    """SIGTERM and SIGINT make the driver's next wait raise `Stopped` (raised inside
    Ray's own wait, an exception would come out mangled), so it ends its actors."""

    def stop(signum: int, frame: object) -> None:
        SIGNALLED.append(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def run(plan: dict[str, Any]) -> int:
    """The whole run; the shepherd's exit status."""
    import ray

    joined = {"address": plan["address"]} if plan["address"] != LOCAL else local_resources(plan)
    try:
        ray.init(namespace=plan["namespace"], log_to_driver=False, **joined)
    except ConnectionError as error:
        raise NoCluster(
            f"no Ray cluster at {plan['address']!r} ({error}); start one (`ray start --head`), "
            f"name it with -o address=HOST:PORT, or use -o address={LOCAL} for one on this "
            "machine alone"
        ) from None
    stop_on_signals()  # after ray.init, which puts its own handlers (an abort) in place
    actors: list[Any] = []
    try:
        shepherd, workers = start_actors(plan)
        actors = [shepherd, *workers]
        (status,) = exit_statuses([shepherd], None)
        assert status is not None  # waited for ever
        log.info("the shepherd ended", status=status)
        # a shepherd that stopped the run tells its workers; one that failed does not
        exit_statuses(workers, WORKERS_GRACE_S if status == 0 else 0)
        return status
    finally:
        for actor in actors:
            ray.kill(actor, no_restart=True)
        ray.shutdown()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m pcp_ray.driver RUN_DIR/pcp-ray.json", file=sys.stderr)
        return 2
    try:
        plan = json.loads(Path(argv[0]).read_text())
    except (OSError, ValueError) as error:
        print(f"pcp_ray.driver: cannot read the plan {argv[0]}: {error}", file=sys.stderr)
        return 2

    configure_logging(verbose=False)
    try:
        return run(plan)
    except NoCluster as error:
        print(f"pcp_ray.driver: {error}", file=sys.stderr)
        return 2
    except ImportError as error:
        print(f"pcp_ray.driver: {error}: install pcp-ray here and on every node", file=sys.stderr)
        return 2
    except Stopped as why:
        print(f"pcp_ray.driver: {why}: the run's actors are stopped", file=sys.stderr)
        return 128 + signal.Signals[str(why)].value


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
