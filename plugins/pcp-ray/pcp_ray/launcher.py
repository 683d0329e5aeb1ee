"""The Ray launcher: the run's plan as RUN_DIR/pcp-ray.json, submitted by running the
driver (`python -m pcp_ray.driver pcp-ray.json`) on a machine of the Ray cluster.

The plan names the commands (the core's `pcp shepherd` and `pcp worker`, reading the
token file), the resources each actor asks Ray for, and how often Ray restarts a worker
actor that dies. Running the driver again resumes the run from its last checkpoint.
"""

import hashlib
import json

from pcp_core.launchers import Launcher, LaunchError, LaunchPlan, LaunchRequest

PLAN = "pcp-ray.json"
SHEPHERD_ADDRESS = "{shepherd}"  # in the worker command: the shepherd actor's node address
DEFAULT_RESTARTS = 10
LOCAL = "local"  # the address option's value for a Ray of this machine alone, started by the driver

OPTIONS = {
    "address": "The Ray cluster to join (ray.init's address; default: auto, the cluster this "
    f"machine belongs to, or $RAY_ADDRESS); {LOCAL}: start a Ray of this machine alone for "
    "the run.",
    "worker-resources": "Ray resources each worker actor asks for, NAME=AMOUNT[,NAME=AMOUNT] "
    "(custom resources naming accelerator kinds, e.g. rocm=1); default: none.",
    "shepherd-resources": "Ray resources the shepherd actor asks for, as worker-resources "
    "(e.g. head=1 to keep it on a node of its own); default: none.",
    "gpus-per-worker": "GPUs each worker actor takes (Ray's num_gpus; Ray sets "
    "CUDA_VISIBLE_DEVICES); default: 0.",
    "cpus-per-worker": "CPU cores each worker actor takes (Ray's num_cpus); default: 1.",
    "max-restarts": f"Times Ray restarts a worker actor that dies (-1: always); default: "
    f"{DEFAULT_RESTARTS}.",
}


def resources(key: str, text: str) -> dict[str, float]:
    """NAME=AMOUNT[,NAME=AMOUNT] as Ray's custom resources."""
    found: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, amount = item.partition("=")
        try:
            value = float(amount)
        except ValueError:
            value = -1.0
        if not equals or not name.strip() or not value > 0:
            raise LaunchError(f"ray option {key}: {item!r} is not NAME=AMOUNT with AMOUNT > 0")
        found[name.strip()] = value
    return found


def number(key: str, text: str, least: float) -> float:
    """An option's number, at least `least`."""
    try:
        value = float(text)
    except ValueError:
        value = least - 1
    if not value >= least:
        raise LaunchError(f"ray option {key} must be a number of at least {least:g}: {text!r}")
    return value


class RayLauncher(Launcher):
    name = "ray"
    description = "Ray actors: the shepherd and each worker, placed by Ray's resources"
    options = OPTIONS

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        options = request.options
        restarts = number("max-restarts", options.get("max-restarts", str(DEFAULT_RESTARTS)), -1)
        if restarts != int(restarts):
            raise LaunchError(f"ray option max-restarts must be whole: {restarts:g}")
        run = str(request.run_dir)
        plan = {
            "address": options.get("address", "auto"),
            # one namespace per run directory: its actors' names are the run's alone
            "namespace": "pcp-" + hashlib.sha256(run.encode()).hexdigest()[:12],
            "run_dir": run,
            "shepherd": request.shepherd_command(),
            "shepherd_dir": str(request.shepherd_dir),
            "shepherd_resources": resources(
                "shepherd-resources", options.get("shepherd-resources", "")
            ),
            "workers": request.workers,
            "worker": request.worker_command(f"{SHEPHERD_ADDRESS}:{request.port}"),
            "worker_resources": resources("worker-resources", options.get("worker-resources", "")),
            "gpus_per_worker": number("gpus-per-worker", options.get("gpus-per-worker", "0"), 0),
            "cpus_per_worker": number("cpus-per-worker", options.get("cpus-per-worker", "1"), 0),
            "max_restarts": int(restarts),
        }
        return LaunchPlan(
            files={PLAN: json.dumps(plan, indent=2)},
            submit=(request.python, "-m", "pcp_ray.driver", PLAN),
            next_steps=(
                f"logs: {request.run_dir}/shepherd.log, worker-N.log; Ray's dashboard shows "
                f"the actors\nresume after a stop: cd {run} && "
                f"{request.python} -m pcp_ray.driver {PLAN}"
            ),
        )


RAY = RayLauncher()
