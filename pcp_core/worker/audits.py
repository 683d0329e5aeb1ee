"""What a spot check reads on both sides: the state a worker's round started from.

A round's result follows from the global parameters it was sent, its data and program
(all the shepherd's), and two things only the worker holds: its inner optimizer state and
what its codec's error feedback still owes (`pcp_core.codecs.Feedback`). In an audited
run (`RunSettings.audited`) each Result carries the digest of those two as the round
started (`state_digest`), so a worker cannot pick another state once it is asked for it;
an `Audit` asks for the state itself, sent back as `state_tensors`. The shepherd's side,
which re-runs the round and compares, is `pcp_core.shepherd.spot_checks`.
"""

import hashlib
from dataclasses import dataclass

import numpy as np

from pcp_core.wire.messages import Spec, Tensor

RESIDUAL_PREFIX = "residual."  # a codec residual's tensor name: the prefix and the parameter's


@dataclass
class RoundStart:
    """The worker-held state a round started from: its inner optimizer state in the order
    of the program's opt specs, and the codec residuals owed, by parameter name."""

    opt_state: list[np.ndarray]
    residuals: dict[str, np.ndarray]

    def digest(self, opt_names: list[str]) -> str:
        """SHA-256 over every tensor's name, dtype, shape and bytes, in a fixed order."""
        hasher = hashlib.sha256()
        for tensor in self.tensors(opt_names):
            array = np.ascontiguousarray(tensor.array)
            header = f"{tensor.name}|{array.dtype.str}|{array.shape}\n"
            hasher.update(header.encode())
            hasher.update(array.tobytes())
        return hasher.hexdigest()

    def tensors(self, opt_names: list[str]) -> list[Tensor]:
        """As an AuditState carries it: the opt state by name, then each residual."""
        tensors = [Tensor(n, a) for n, a in zip(opt_names, self.opt_state, strict=True)]
        return tensors + [
            Tensor(RESIDUAL_PREFIX + name, self.residuals[name]) for name in sorted(self.residuals)
        ]

    @classmethod
    def from_tensors(
        cls, tensors: list[Tensor], opt_specs: list[Spec], param_specs: list[Spec]
    ) -> "RoundStart":
        """The state an AuditState carries; ValueError where it is not the program's: each
        opt spec's tensor, and float32 residuals of parameters only, each of its shape."""
        by_name = {t.name: t.array for t in tensors}
        if len(by_name) != len(tensors):
            raise ValueError("the audited state names a tensor twice")
        opt_state = [_take(by_name, name, shape, dtype) for name, shape, dtype in opt_specs]
        residuals = {}
        for name, shape, _ in param_specs:
            key = RESIDUAL_PREFIX + name
            if key in by_name:
                residuals[name] = _take(by_name, key, shape, "float32")
        if by_name:
            raise ValueError(f"the audited state holds unknown tensors: {sorted(by_name)[:3]}")
        return cls(opt_state, residuals)


def _take(
    by_name: dict[str, np.ndarray], name: str, shape: tuple[int, ...], dtype: str
) -> np.ndarray:
    array = by_name.pop(name, None)
    if array is None or tuple(array.shape) != tuple(shape) or array.dtype.name != dtype:
        raise ValueError(f"the audited state's {name} is missing or not {dtype} {tuple(shape)}")
    return array
