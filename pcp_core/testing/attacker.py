"""A worker that holds valid credentials and attacks the run through the real worker API.

    python -m pcp_core.testing.attacker ATTACK HOST:PORT --state-dir DIR [--name NAME]

It joins as `pcp worker` does (the secret from --token-file or $PCP_TOKEN), trains its
rounds honestly, and sends a crafted result in place of each honest one, from round
`--from-round` on (default 0). The attacks, by name:

- `flip:K`: its honest pseudo-gradient times -K (K = 1: a sign flip at its honest norm);
- `random`: a random direction at its honest norm;
- `ratchet:G`: its honest pseudo-gradient times G^round, a norm that grows each round;
- `lazy`: its round-0 result (pseudo-gradient and losses) every round, as if it never
  trained again;
- `transpose`: its largest matrix transposed: the right number of values, another shape;
- `forge:K`: honest results, but after each round its inner optimizer state is multiplied
  by K, so each next round starts from a state its last one did not end in (what a
  worker would do to steer its results past a spot check);
- `absent`: no attack, a baseline: every result NaN, so each is refused and the run is
  the honest workers' alone in the data layout of the attacked runs (each worker reads
  the shard of its index among all the workers).

Two attackers colluding are two processes of one attack. Used by the attack tests
(plugins/pcp-diloco/tests/test_attacks.py) and `benchmarks/attacks.py`.
"""

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from pcp_core import plugins
from pcp_core.wire import auth
from pcp_core.wire.messages import Tensor
from pcp_core.wire.transport import TransportOptions
from pcp_core.worker import loop
from pcp_core.worker.session import RoundWork

ATTACKS = ("flip", "random", "ratchet", "lazy", "transpose", "forge", "absent")


@dataclasses.dataclass
class Attack:
    """One attack and what it remembers between rounds."""

    kind: str
    factor: float = 1.0
    from_round: int = 0
    seed: int = 0
    first: RoundWork | None = None

    @classmethod
    def parse(cls, text: str, from_round: int = 0, seed: int = 0) -> "Attack":
        kind, _, value = text.partition(":")
        if kind not in ATTACKS:
            raise ValueError(f"unknown attack {kind!r}; one of {', '.join(ATTACKS)}")
        default = {"flip": 1.0, "ratchet": 1.5, "forge": 4.0}.get(kind, 1.0)
        return cls(kind, float(value) if value else default, from_round, seed)

    def __call__(self, work: RoundWork, round_index: int) -> RoundWork:
        if self.first is None:
            copies = [Tensor(t.name, t.array.copy()) for t in work.tensors]
            self.first = RoundWork(list(work.losses), work.compute_s, copies)
        if round_index < self.from_round:
            return work
        arrays = [t.array for t in work.tensors]
        if self.kind == "flip":
            for array in arrays:
                array *= -self.factor
        elif self.kind == "ratchet":
            for array in arrays:
                array *= self.factor**round_index
        elif self.kind == "random":
            self._randomise(arrays, round_index)
        elif self.kind == "lazy":
            first = self.first
            work.losses = list(first.losses)[: len(work.losses)]
            for array, old in zip(arrays, first.tensors, strict=True):
                array[...] = old.array
        elif self.kind == "absent":
            for array in arrays:
                array[...] = np.nan
        elif self.kind == "transpose":
            largest = max(
                (i for i, a in enumerate(arrays) if a.ndim == 2 and a.shape[0] != a.shape[1]),
                key=lambda i: arrays[i].size,
            )
            tensor = work.tensors[largest]
            work.tensors[largest] = Tensor(tensor.name, np.ascontiguousarray(tensor.array.T))
        return work

    def after(self, executor: Any, round_index: int) -> None:
        """Between rounds: a forger's inner optimizer state, its floats times K."""
        if self.kind != "forge" or round_index < self.from_round:
            return
        state = [np.asarray(array) for array in executor.opt_state()]
        forged = [a * self.factor if a.dtype.kind == "f" else a for a in state]
        executor.set_opt_state([a.astype(old.dtype) for a, old in zip(forged, state, strict=True)])

    def _randomise(self, arrays: list[np.ndarray], round_index: int) -> None:
        rng = np.random.default_rng([self.seed, round_index])
        norm = np.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays))
        noise = [rng.standard_normal(a.shape) for a in arrays]
        scale = norm / np.sqrt(sum(float(np.sum(np.square(n))) for n in noise))
        for array, values in zip(arrays, noise, strict=True):
            array[...] = values * scale


class AttackingHost:
    """The installed plugins, but every algorithm's worker round passes through `attack`."""

    def __init__(self, attack: Attack) -> None:
        self.host, self.attack = plugins.host(), attack

    def algorithm(self, name: str) -> Any:
        algorithm = self.host.algorithm(name)
        honest = algorithm.worker_round

        def round_(session: Any, assignment: Any) -> RoundWork:
            assert honest is not None  # a distributed algorithm: it has a worker round
            work = self.attack(honest(session, assignment), assignment.round)
            self.attack.after(session.executor, assignment.round)
            return work

        return dataclasses.replace(algorithm, worker_round=round_)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.host, name)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("attack", help=f"one of {', '.join(ATTACKS)} (flip:K, ratchet:G)")
    parser.add_argument("connect", help="the shepherd's HOST:PORT")
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--token-file", type=Path, default=None)
    parser.add_argument("--name", default="")
    parser.add_argument("--from-round", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    try:
        attack = Attack.parse(args.attack, args.from_round, args.seed)
    except ValueError as error:
        parser.error(str(error))
    host, _, port = args.connect.rpartition(":")
    options = loop.WorkerOptions(
        host=host,
        port=int(port),
        backend="cpu",
        target=None,
        device=None,
        secret=auth.load_secret(args.token_file),
        transport="capnp-tcp",
        transport_options=TransportOptions(timeout_s=args.timeout),
        state_dir=args.state_dir,
        name=args.name or f"attacker-{attack.kind}",
    )
    loop.run_worker(options, AttackingHost(attack))


if __name__ == "__main__":
    main()
