"""Global parameters to workers through a codec (`RunSettings.codec_down`), without drift.

The shepherd keeps the parameters the workers hold (`Downlink.held`), which a lossy
codec makes differ a little from its own. Each round it encodes the change from them to
its parameters, once, for the parameters the round refreshes, and both sides add the
decoded change to their copy: the same float32 additions of the same decoded values, so
every worker's copy equals the shepherd's bit for bit (`HeldParameters` on the worker).
What a codec leaves out of one change is still there in the next one, so the copies do
not wander from the shepherd's parameters. A worker that does not hold the current copy
(its first round, a rejoin, a refused or retried round) gets the whole copy in float32:
the copy, changed as the others' is, not the shepherd's parameters, so every worker
starts a round from the same values. The copy is saved with each checkpoint
(`Downlink.state`), so a resumed run goes on from the values the workers held.

Encoded changes travel as uint8 tensors; whole values as float32.
"""

from dataclasses import dataclass, field

import numpy as np

from pcp_core.codecs import Codec, CodecError, decode_tensor, encode_tensor
from pcp_core.parallel import each
from pcp_core.wire.messages import Tensor
from pcp_core.wire.transport import TransportError

# checkpoint tensors of the copy the workers hold, by parameter name
HELD_PREFIX = "held."


@dataclass
class Outgoing:
    """A round's parameters as sent: the whole model, and the refreshed ones as changes
    for workers that hold the current copy (by parameter index)."""

    whole: list[Tensor]
    changes: dict[int, Tensor]


@dataclass
class Downlink:
    """The shepherd's side; `codec` None sends float32 values as they are."""

    names: list[str]
    codec: Codec | None = None
    held: list[np.ndarray] | None = None

    def outgoing(self, params: list[np.ndarray], refreshed: tuple[int, ...]) -> Outgoing:
        """What this round sends: the changes of the `refreshed` parameters, and the whole
        copy after them for workers that do not hold the last one."""
        if self.codec is None:
            whole = [Tensor(n, p) for n, p in zip(self.names, params, strict=True)]
            return Outgoing(whole, {i: whole[i] for i in refreshed})
        if self.held is None:  # the run's first round: the copy starts as the parameters
            self.held = [p.astype(np.float32, copy=True) for p in params]
            return Outgoing(self.whole(), {})
        codec, held = self.codec, self.held

        def change(i: int) -> Tensor:
            """Parameter i's change as sent; the copy moves by it as the workers' will."""
            data = encode_tensor(codec, params[i] - held[i])
            held[i] = held[i] + decode_tensor(codec, data, params[i].shape)
            return Tensor(self.names[i], np.frombuffer(data, np.uint8))

        elements = sum(params[i].size for i in refreshed)
        changes = dict(zip(refreshed, each(change, refreshed, elements), strict=True))
        return Outgoing(self.whole(), changes)

    def whole(self) -> list[Tensor]:
        assert self.held is not None
        return [Tensor(n, h) for n, h in zip(self.names, self.held, strict=True)]

    def state(self) -> dict[str, np.ndarray]:
        """The copy the workers hold, for a checkpoint (nothing under float32 values)."""
        if self.codec is None or self.held is None:
            return {}
        return {HELD_PREFIX + n: h.copy() for n, h in zip(self.names, self.held, strict=True)}

    def load_state(self, tensors: dict[str, np.ndarray]) -> None:
        """Go on from a checkpoint's copy, where it has one for every parameter."""
        found = [tensors.get(HELD_PREFIX + name) for name in self.names]
        if self.codec is not None and all(t is not None for t in found):
            self.held = [np.array(t, np.float32) for t in found]


@dataclass
class HeldParameters:
    """A worker's copy of the global parameters, kept in step with `Downlink.held`."""

    codec: Codec | None = None
    held: dict[str, np.ndarray] = field(default_factory=dict)

    def take(self, tensors: list[Tensor]) -> list[Tensor]:
        """An Assignment's tensors as float32 values: whole ones as they are, encoded
        changes added to the copy; the copy keeps both, the caller gets its own arrays."""
        codec = self.codec
        if codec is None:
            return tensors

        def value(tensor: Tensor) -> np.ndarray:
            """The tensor's float32 values: as they came, or the copy plus the change."""
            if tensor.array.dtype != np.uint8:
                return tensor.array.astype(np.float32)
            if tensor.name not in self.held:
                raise TransportError(f"a change of {tensor.name} for a worker without it")
            before = self.held[tensor.name]
            try:
                change = decode_tensor(codec, tensor.array.tobytes(), before.shape)
            except CodecError as error:
                raise TransportError(f"the change of {tensor.name}: {error}") from None
            return before + change

        elements = sum(self.held[t.name].size for t in tensors if t.name in self.held)
        values = each(value, tensors, elements)
        self.held.update((t.name, v) for t, v in zip(tensors, values, strict=True))
        return [Tensor(t.name, v.copy()) for t, v in zip(tensors, values, strict=True)]
