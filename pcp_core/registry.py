"""Named registries of plugin-provided things, with errors a user can act on."""

from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

# Names shipped by the PCP project itself, and the distribution that provides each,
# so that an unknown name can be answered with the right `pip install` line.
FIRST_PARTY: dict[tuple[str, str], str] = {
    ("backend", "cpu"): "pcp-cpu",
    ("backend", "cuda"): "pcp-iree-cuda",
    ("backend", "rocm"): "pcp-iree-rocm",
    ("backend", "metal"): "pcp-iree-metal",
    ("backend", "vulkan"): "pcp-iree-vulkan",
    ("backend", "xla"): "pcp-xla",
    ("optimizer", "adamw"): "pcp-adamw",
    ("optimizer", "nesterov"): "pcp-nesterov",
    ("algorithm", "diloco"): "pcp-diloco",
    ("algorithm", "sparseloco"): "pcp-sparseloco",
    ("codec", "sparse2"): "pcp-sparseloco",
    ("transport", "capnp-tcp"): "pcp-capnp-tcp",
    **{("codec", name): "pcp-codecs" for name in ("bf16", "int8", "fp4", "topk")},
}


class UnknownNameError(LookupError):
    """A name asked for on the command line that no installed plugin registers."""


class DuplicateNameError(LookupError):
    """Two distributions register the same name of the same kind."""


@dataclass
class Entry(Generic[T]):
    value: T
    distribution: str


@dataclass
class Registry(Generic[T]):
    """Things of one kind (backend, optimizer, ...) by name."""

    kind: str
    entries: dict[str, Entry[T]] = field(default_factory=dict)
    conflicts: dict[str, list[str]] = field(default_factory=dict)

    def add(self, name: str, value: T, distribution: str) -> None:
        if name in self.entries:
            owners = self.conflicts.setdefault(name, [self.entries[name].distribution])
            owners.append(distribution)
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered by both {owners[0]!r} and "
                f"{distribution!r}; uninstall one or disable it with PCP_DISABLE_PLUGINS"
            )
        self.entries[name] = Entry(value, distribution)

    def names(self) -> list[str]:
        return sorted(self.entries)

    def get(self, name: str) -> T:
        if name in self.conflicts:
            owners = " and ".join(repr(o) for o in self.conflicts[name])
            raise DuplicateNameError(
                f"{self.kind} {name!r} is registered by both {owners}; "
                "uninstall one or disable it with PCP_DISABLE_PLUGINS"
            )
        if name in self.entries:
            return self.entries[name].value
        installed = ", ".join(self.names()) or "none"
        message = f"unknown {self.kind} {name!r}; installed: {installed}"
        package = FIRST_PARTY.get((self.kind, name))
        if package:
            message += f". Install it with: pip install {package}"
        raise UnknownNameError(message)

    def values(self) -> list[Any]:
        return [self.entries[n].value for n in self.names()]
