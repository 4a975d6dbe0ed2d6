"""A real GPU's NVML answers, replayed: the calls `nvmlrecord.py` recorded, answered from the file.

`Replay(path).install(setattr)` replaces pynvml's functions (`fakenvml.FUNCTIONS`) with ones that
answer each recorded call (same function, same arguments) with NVML's recorded answer: its
structures as objects with the same fields, its handles as named tokens, its errors as the
NVMLError pynvml raised. A call the recording does not hold fails the test that made it, so the
exporter's NVML path is held to exactly what the real GPU was asked and answered.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

from tests.support.fakenvml import FUNCTIONS


@dataclass(frozen=True)
class Handle:
    name: str  # `gpu0`, `gpu0/mig1`, `gpu0/gi2`, as the recorder named it


def _key(value: Any) -> Any:
    """An argument as the recorder wrote it."""
    if isinstance(value, Handle):
        return {"handle": value.name}
    if isinstance(value, tuple | list):
        return [_key(v) for v in value]
    return value


def _answer(value: Any) -> Any:
    """A recorded answer as pynvml handed it over."""
    if isinstance(value, dict):
        if "handle" in value:
            return Handle(value["handle"])
        if "bytes" in value:
            return value["bytes"].encode()
        return SimpleNamespace(**{k: _answer(v) for k, v in value["fields"].items()})
    if isinstance(value, list):
        return [_answer(v) for v in value]
    return value


class Replay:
    def __init__(self, path: Path) -> None:
        self.document = json.loads(path.read_text())
        self.answers: dict[str, dict[str, Any]] = {}
        for call in self.document["calls"]:
            key = json.dumps([call["args"], call["kwargs"]], sort_keys=True)
            self.answers.setdefault(call["call"], {})[key] = call

    @property
    def hostname(self) -> str:
        return str(self.document["hostname"])

    def install(self, set_attribute: Callable[[Any, str, Any], None] = setattr) -> None:
        for name in FUNCTIONS:
            set_attribute(pynvml, name, self._function(name))

    def _function(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            key = json.dumps([_key(list(args)), {k: _key(v) for k, v in kwargs.items()}],
                             sort_keys=True)  # fmt: skip
            recorded = self.answers.get(name, {}).get(key)
            if recorded is None:
                raise AssertionError(f"the real GPU was not asked {name}{key}")
            if "error" in recorded:
                raise pynvml.NVMLError(recorded["error"])
            return _answer(recorded["result"])

        return call
