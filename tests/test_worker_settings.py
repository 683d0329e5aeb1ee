"""The Setup's settings: an algorithm's typed settings cross as JSON once and are decoded
once, at the worker's join, into the type it declares; a malformed slot is one line."""

import json
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pytest

from pcp_core.algorithms import Algorithm
from pcp_core.registry import UnknownNameError
from pcp_core.wire.handshake import JoinRefused
from pcp_core.wire.messages import WorkerSettings
from pcp_core.worker.joining import decode_settings
from pcp_core.worker.session import WorkerSession

MADE: list["Told"] = []  # every Told built, to count the decodings


@dataclass(frozen=True)
class Told:
    names: tuple[str, ...] = ()
    pairs: tuple[tuple[str, int], ...] = ()
    maybe: tuple[int, ...] | None = None
    count: int = 1

    def __post_init__(self) -> None:
        MADE.append(self)


def host(declared: type | None) -> Any:
    """A plugin host whose every algorithm declares `declared`."""

    def algorithm(name: str) -> Algorithm:
        if name != "algo":
            raise UnknownNameError(f"unknown algorithm {name!r}; installed: algo")
        return Algorithm("algo", run=lambda ctx: {}, worker_settings=declared)

    return SimpleNamespace(algorithm=algorithm, codec=lambda name: None)


def setup_json(slot: Any, algorithm: str = "algo") -> str:
    return WorkerSettings(algorithm, "run", 2, plugins={"algo": slot}).to_json()


def test_typed_settings_cross_as_json_and_are_decoded_once_at_the_join() -> None:
    told = Told(("a", "b"), (("x", 1),), (3,), 4)
    text = setup_json(told)
    raw = {"names": ["a", "b"], "pairs": [["x", 1]], "maybe": [3], "count": 4}
    assert json.loads(text)["plugins"] == {"algo": raw}  # as a dict of them crossed
    MADE.clear()
    settings = decode_settings(text, host(Told))
    assert settings.plugins["algo"] == told and len(MADE) == 1  # tuples tuples again
    session = WorkerSession(0, executor=None, corpus=None, settings=settings)  # type: ignore[arg-type]
    for _ in range(3):  # each round reads what the join decoded
        assert session.algorithm_settings is settings.plugins["algo"]
    assert len(MADE) == 1


def test_an_absent_slot_is_the_declared_defaults_and_no_declaration_leaves_it() -> None:
    bare = WorkerSettings("algo", "run", 2).to_json()
    assert decode_settings(bare, host(Told)).plugins == {"algo": Told()}
    assert decode_settings(bare, host(None)).plugins == {}
    assert decode_settings(setup_json({"k": [1]}), host(None)).plugins == {"algo": {"k": [1]}}
    settings = WorkerSettings.from_json(setup_json(Told(maybe=None)))
    assert settings.with_typed("algo", Told).plugins["algo"].maybe is None


@pytest.mark.parametrize(
    ("slot", "why"),
    [
        ({"names": ["a"], "colour": "red"}, "unknown keys ['colour']"),
        ({"names": "ab"}, "expected a list, got str"),
        ({"pairs": [["x", 1, 2]]}, "expected 2 items, got 3"),
        (["a"], "expected an object, got list"),
    ],
)
def test_a_malformed_slot_is_one_line(slot: Any, why: str) -> None:
    settings = WorkerSettings.from_json(setup_json(slot))
    with pytest.raises(ValueError, match=r"^malformed algo settings in the Setup: ") as error:
        settings.with_typed("algo", Told)
    assert why in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(JoinRefused, match="malformed algo settings") as refused:
        decode_settings(setup_json(slot), host(Told))
    assert "\n" not in str(refused.value)


def test_settings_of_an_algorithm_not_here_refuse_the_join() -> None:
    with pytest.raises(JoinRefused, match="need its algorithm: unknown algorithm 'other'"):
        decode_settings(setup_json({}, algorithm="other"), host(Told))


def test_the_specs_come_back_as_tuples() -> None:
    specs = (("w", (2, 3), "float32"),)
    sent = WorkerSettings("algo", "run", 2, param_specs=specs, vocabulary=("a", "b"))
    assert WorkerSettings.from_json(sent.to_json()) == sent
    with pytest.raises(ValueError, match=r"^malformed settings in the Setup: unknown keys"):
        WorkerSettings.from_json(json.dumps(json.loads(sent.to_json()) | {"extra": 1}))
