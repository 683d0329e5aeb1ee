"""The settings a Setup carries to a worker (`Setup.settings_json`): the run's, which a
distributed algorithm chooses (`RunSettings`), and the program's shape and where its data
is (`WorkerSettings`), with their JSON form. `pcp_core.wire.messages` exports them with
the messages, where plugins name them (docs/plugins.md).

A plugin's slot of them holds its own typed settings object (`Algorithm.worker_settings`):
the shepherd's `to_json` writes it as a JSON object, and the worker decodes it back into
that type once, at its join (`WorkerSettings.with_typed`).
"""

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:  # numpy's: imported where a codec is needed, not with the settings
    from pcp_core.codecs import Codec, CodecLookup

T = TypeVar("T")

Spec = tuple[str, tuple[int, ...], str]  # a tensor's name, shape and dtype


@dataclass(frozen=True)
class RunSettings:
    """What a distributed algorithm tells every worker about its run: its name (whose
    worker side runs the rounds), the run's id (a saved inner state must match it), how
    many round states to keep, one slot per plugin for what that plugin's worker side
    reads (its typed settings object, by plugin name: an algorithm's is the type it
    declares as `worker_settings`), and whether rounds overlap the network."""

    algorithm: str
    run_id: str
    inner_states_kept: int
    plugins: dict[str, Any] = field(default_factory=dict)
    # a worker starts each next round while its result travels (pcp_core.worker.overlap)
    overlap: bool = False
    # how a pseudo-gradient crosses the link (pcp_core.codecs): "f32", float32 as it is,
    # or the name of a registered codec, its tensors then bytes (uint8)
    codec: str = "f32"
    # how the global parameters cross to a worker that holds the last ones: as encoded
    # changes to its copy (pcp_core.wire.downlink), or "f32" values as they are
    codec_down: str = "f32"
    # each codec's options by name (`pcp_core.codecs.Codec.tuned`), uplink and downlink
    codec_options: dict[str, float] = field(default_factory=dict)
    codec_down_options: dict[str, float] = field(default_factory=dict)
    # what error feedback owes is multiplied by this before it is added to the next
    # pseudo-gradient (`pcp_core.codecs.Feedback.decay`); 1: kept whole
    feedback_decay: float = 1.0
    # each Delta follows its Result at once instead of waiting for a Fetch: a round trip
    # less a round, for a shepherd that holds one delta per worker at a time
    push_deltas: bool = False
    # an overlapped worker may report up to this many rounds past the last Assignment it
    # has, before their own Assignments arrive (pcp_core.worker.overlap); 0: none
    ahead: int = 0
    # spot checks (`pcp train --spot-check`): each Result commits to the state its round
    # started from, kept until the next round for the shepherd to ask for (Audit)
    audited: bool = False

    def uplink(self, codecs: "CodecLookup") -> "Codec | None":
        """The codec pseudo-gradients cross in, tuned; None: float32 as it is."""
        from pcp_core.codecs import on_the_wire

        return on_the_wire(self.codec, codecs, self.codec_options)

    def downlink(self, codecs: "CodecLookup") -> "Codec | None":
        """The codec the changes of the global parameters cross in, tuned; None: float32."""
        from pcp_core.codecs import on_the_wire

        return on_the_wire(self.codec_down, codecs, self.codec_down_options)

    @property
    def pushes(self) -> bool:
        """Whether Deltas follow their Results unasked: asked for, or needed by results
        sent ahead (a Fetch could be answered after a later round's Result)."""
        return self.push_deltas or self.ahead > 0


@dataclass(frozen=True)
class WorkerSettings(RunSettings):
    """The settings of a Setup: the run's, the program's shape, and where its data is."""

    batch_size: int = 0
    block_size: int = 0
    steps_per_call: int = 0
    param_specs: tuple[Spec, ...] = ()
    opt_specs: tuple[Spec, ...] = ()
    vocabulary: tuple[str, ...] | None = None  # a text corpus: its tokens are in the Setup
    manifest: dict[str, Any] | None = None  # a prepared dataset: this worker's shards

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "WorkerSettings":
        """The settings a Setup carries; ValueError, one line, for any other JSON."""
        try:
            return from_json_object(cls, json.loads(text))
        except (TypeError, ValueError) as error:
            raise ValueError(f"malformed settings in the Setup: {error}") from None

    def with_typed(self, name: str, declared: type | None) -> "WorkerSettings":
        """These settings with plugin `name`'s slot decoded into the type it declares
        (an absent slot: that type's defaults); as they are where it declares none.
        ValueError, one line, for a slot that is not that type's JSON object."""
        if declared is None:
            return self
        try:
            typed: Any = from_json_object(declared, self.plugins.get(name, {}))
        except (TypeError, ValueError) as error:
            raise ValueError(f"malformed {name} settings in the Setup: {error}") from None
        return dataclasses.replace(self, plugins={**self.plugins, name: typed})


def from_json_object(kind: type[T], raw: Any) -> T:
    """Dataclass `kind` from the JSON object `dataclasses.asdict` made of it: the lists
    its fields declare tuples (nested ones too) tuples again. TypeError or ValueError for
    anything else: unknown or missing keys, or a declared tuple that is no such list."""
    if not isinstance(raw, dict):
        raise ValueError(f"expected an object, got {type(raw).__name__}")
    hints = typing.get_type_hints(kind)
    unknown = set(raw) - {f.name for f in dataclasses.fields(kind)}  # type: ignore[arg-type]
    if unknown:
        raise ValueError(f"unknown keys {sorted(unknown)}")
    return kind(**{key: _tuples(hints[key], value) for key, value in raw.items()})


def _tuples(hint: Any, value: Any) -> Any:
    """`value` as JSON decoded it, with the lists that `hint` declares tuples made tuples."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    arms = typing.get_args(hint) if union else (hint,)
    tuples = [arm for arm in arms if arm is tuple or typing.get_origin(arm) is tuple]
    if not tuples or (value is None and type(None) in arms):
        return value
    if not isinstance(value, list):
        raise TypeError(f"expected a list, got {type(value).__name__}")
    items = typing.get_args(tuples[0])
    if not items or items[-1] is Ellipsis:  # tuple[X, ...]: any length
        items = (items[0] if items else Any,) * len(value)
    if len(items) != len(value):
        raise ValueError(f"expected {len(items)} items, got {len(value)}")
    return tuple(_tuples(item, v) for item, v in zip(items, value, strict=True))
