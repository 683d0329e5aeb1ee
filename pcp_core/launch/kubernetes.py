"""The Kubernetes launcher: the shepherd as a Deployment of one behind a Service, the
workers as an indexed Job, the secret as a Secret mounted read-only (0400).

`pcp launch kubernetes -o image=IMAGE` writes the manifests (one `kind: List`, JSON,
which `kubectl apply` reads as YAML) and `apply.sh`, which makes the Secret from the
token file (`kubectl create secret --from-file`, so the secret is on no command line and
in no manifest) and applies the manifests. The image needs PCP installed and bash.
"""

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from pcp_core.launch.script import resume_or_start
from pcp_core.launchers import Launcher, LaunchError, LaunchPlan, LaunchRequest, shell_join

MANIFESTS = "kubernetes.json"
APPLY = "apply.sh"
IN_POD = Path("/pcp")  # the run directory inside the shepherd's pod
TOKEN_DIR = "/etc/pcp"
STATUS_PORT = 8080  # the shepherd's /healthz, for the probes

OPTIONS = {
    "image": "Container image with PCP installed (required).",
    "namespace": "Namespace to run in (default: default).",
    "gpus-per-worker": "GPUs each worker asks for (default 0).",
    "gpu-resource": "The GPU resource name (default nvidia.com/gpu; amd.com/gpu on AMD).",
    "run-claim": "PersistentVolumeClaim for the shepherd's run directory, so checkpoints "
    "outlive its pod and a restarted shepherd resumes (default: an emptyDir, lost with it).",
    "python": "The Python with PCP in the image (default python3).",
}


class KubernetesLauncher(Launcher):
    name = "kubernetes"
    description = "a shepherd Deployment and Service, the workers as an indexed Job"
    options = OPTIONS
    tool = "kubectl"

    def plan(self, request: LaunchRequest) -> LaunchPlan:
        image = request.options.get("image")
        if not image:
            raise LaunchError("kubernetes needs -o image=IMAGE (an image with PCP installed)")
        gpus = request.options.get("gpus-per-worker", "0")
        if not gpus.isdigit():
            raise LaunchError(f"kubernetes option gpus-per-worker must be a number: {gpus!r}")
        name = "pcp-" + "".join(c if c.isalnum() else "-" for c in request.run_dir.name.lower())
        name = name.strip("-")[:40]
        namespace = request.options.get("namespace", "default")
        inside = replace(
            request,
            python=request.options.get("python", "python3"),
            token_file=Path(TOKEN_DIR) / "token",
            run_dir=IN_POD,
        )
        items = [
            service(name, request.port),
            shepherd(name, image, inside, request.options.get("run-claim")),
            workers(name, image, inside, int(gpus), request.options),
        ]
        manifests = {"apiVersion": "v1", "kind": "List", "items": items}
        secret = (
            shell_join(["kubectl", "create", "secret", "generic", f"{name}-token", "-n", namespace])
            + f" --from-file=token={shell_join([str(request.token_file)])}"
        )
        text = (
            "#!/bin/bash\n# Written by `pcp launch kubernetes`: the Secret from the token file "
            "(never\n# on a command line), then the shepherd's Deployment and Service and the "
            "workers' Job.\nset -euo pipefail\n"
            f"{secret} --dry-run=client -o yaml | kubectl apply -f -\n"
            f"kubectl apply -n {shell_join([namespace])} -f {MANIFESTS}\n"
        )
        return LaunchPlan(
            files={MANIFESTS: json.dumps(manifests, indent=2), APPLY: text},
            submit=(f"./{APPLY}",),
            executable=APPLY,
            next_steps=(
                f"watch: kubectl -n {namespace} logs -f deployment/{name}-shepherd\n"
                f"stop:  kubectl -n {namespace} delete -f {request.run_dir / MANIFESTS}"
            ),
        )


def labels(name: str, role: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": name, "app.kubernetes.io/component": role}


def token_volume(name: str) -> dict[str, Any]:
    return {"name": "token", "secret": {"secretName": f"{name}-token", "defaultMode": 0o400}}


def mounts(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": "token", "mountPath": TOKEN_DIR, "readOnly": True}, *extra]


def service(name: str, port: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": f"{name}-shepherd", "labels": labels(name, "shepherd")},
        "spec": {
            "selector": labels(name, "shepherd"),
            "ports": [{"name": "pcp", "port": port, "targetPort": port}],
        },
    }


def shepherd(name: str, image: str, inside: LaunchRequest, claim: str | None) -> dict[str, Any]:
    """The Deployment of one shepherd: resumed from its run's checkpoint when the pod is
    started again (kept only with a run-claim), probed on /healthz."""
    command = [*inside.shepherd_command(), "--status-port", str(STATUS_PORT)]
    command += ["--status-host", "0.0.0.0"]
    start = resume_or_start(inside.shepherd_dir) + f'exec {shell_join(command)} "${{start[@]}}"'
    probe = {"httpGet": {"path": "/healthz", "port": STATUS_PORT}, "periodSeconds": 10}
    run = {"persistentVolumeClaim": {"claimName": claim}} if claim else {"emptyDir": {}}
    pod = {
        "metadata": {"labels": labels(name, "shepherd")},
        "spec": {
            "containers": [
                {
                    "name": "shepherd",
                    "image": image,
                    "command": ["bash", "-c", start],
                    "ports": [{"containerPort": inside.port}, {"containerPort": STATUS_PORT}],
                    "readinessProbe": probe,
                    "livenessProbe": {**probe, "initialDelaySeconds": 60, "failureThreshold": 6},
                    "volumeMounts": mounts({"name": "run", "mountPath": str(IN_POD)}),
                }
            ],
            "volumes": [token_volume(name), {"name": "run", **run}],
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{name}-shepherd", "labels": labels(name, "shepherd")},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": labels(name, "shepherd")},
            "template": pod,
        },
    }


def workers(
    name: str, image: str, inside: LaunchRequest, gpus: int, options: Any
) -> dict[str, Any]:
    """The indexed Job of the workers: a worker that fails is started again by the Job."""
    container: dict[str, Any] = {
        "name": "worker",
        "image": image,
        "command": inside.worker_command(f"{name}-shepherd:{inside.port}"),
        "volumeMounts": mounts(),
    }
    if gpus:
        resource = options.get("gpu-resource", "nvidia.com/gpu")
        container["resources"] = {"limits": {resource: gpus}}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{name}-workers", "labels": labels(name, "worker")},
        "spec": {
            "completionMode": "Indexed",
            "completions": inside.workers,
            "parallelism": inside.workers,
            "backoffLimit": 6 * inside.workers,
            "template": {
                "metadata": {"labels": labels(name, "worker")},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "containers": [container],
                    "volumes": [token_volume(name)],
                },
            },
        },
    }


KUBERNETES = KubernetesLauncher()
