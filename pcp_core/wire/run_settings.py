"""The settings a Setup carries to a worker (`Setup.settings_json`): the run's, which a
distributed algorithm chooses (`RunSettings`), and the program's shape and where its data
is (`WorkerSettings`), with their JSON form. `pcp_core.wire.messages` exports them with
the messages, where plugins name them (docs/plugins.md).
"""

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

Spec = tuple[str, tuple[int, ...], str]  # a tensor's name, shape and dtype


@dataclass(frozen=True)
class RunSettings:
    """What a distributed algorithm tells every worker about its run: its name (whose
    worker side runs the rounds), the run's id (a saved inner state must match it), how
    many round states to keep, one slot per plugin for what that plugin's worker side
    reads (a dict of its own typed settings, by plugin name), and whether rounds overlap
    the network."""

    algorithm: str
    run_id: str
    inner_states_kept: int
    plugins: dict[str, dict[str, Any]] = field(default_factory=dict)
    # a worker starts each next round while its result travels (pcp_core.worker.overlap)
    overlap: bool = False
    # how a pseudo-gradient crosses the link (pcp_core.codecs): "f32", float32 as it is,
    # or the name of a registered codec, its tensors then bytes (uint8)
    codec: str = "f32"
    # how the global parameters cross to a worker that holds the last ones: as encoded
    # changes to its copy (pcp_core.wire.downlink), or "f32" values as they are
    codec_down: str = "f32"
    # each Delta follows its Result at once instead of waiting for a Fetch: a round trip
    # less a round, for a shepherd that holds one delta per worker at a time
    push_deltas: bool = False
    # an overlapped worker may report up to this many rounds past the last Assignment it
    # has, before their own Assignments arrive (pcp_core.worker.overlap); 0: none
    ahead: int = 0
    # spot checks (`pcp train --spot-check`): each Result commits to the state its round
    # started from, kept until the next round for the shepherd to ask for (Audit)
    audited: bool = False

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
            raw = json.loads(text)
            known = {f.name for f in dataclasses.fields(cls)}
            if not isinstance(raw, dict) or set(raw) - known:
                raise ValueError(f"unknown keys {sorted(set(raw) - known)}")
            specs = {
                key: tuple((n, tuple(shape), d) for n, shape, d in raw.get(key, ()))
                for key in ("param_specs", "opt_specs")
            }
            vocabulary = raw.get("vocabulary")
            if vocabulary is not None:
                specs["vocabulary"] = tuple(vocabulary)
            return cls(**(raw | specs))
        except (TypeError, ValueError) as error:
            raise ValueError(f"malformed settings in the Setup: {error}") from None
