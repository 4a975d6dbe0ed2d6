"""Record what a real GPU's NVML answers the exporter, and what the exporter served from it.

`python -m tests.support.nvmlrecord OUTDIR` on a machine with NVIDIA GPUs wraps exactly the pynvml
functions the exporter calls (`fakenvml.FUNCTIONS`), runs one collection as `--source nvml` does,
and writes to OUTDIR:
- `nvml-calls.json`: every call, its arguments (handles as names: `gpu0`, `gpu0/mig1`,
  `gpu0/gi2`) and NVML's answer (structures as their fields) or its error code;
- `metrics-<generation>.txt`: the exposition rendered from that very collection, per label set.

`tests/support/nvmlreplay.py` answers the same calls from the file, so a test can hold the
exporter's output on that GPU to the one recorded there. The file also keeps the GPU's MIG
profiles as its driver names them (`profiles`), read-only, for the catalog.
"""

from __future__ import annotations

import ctypes
import json
import socket
import sys
from pathlib import Path
from typing import Any

import pynvml

from exporter import dcgm, nvml
from exporter.generations import GENERATIONS
from tests.support.fakenvml import FUNCTIONS


def plain(value: Any, handles: dict[int, str]) -> Any:
    """An NVML answer as JSON: structures and unions by field, handles by name."""
    if isinstance(value, ctypes._Pointer):
        address = ctypes.cast(value, ctypes.c_void_p).value or 0
        return {"handle": handles.get(address, f"unknown-{address:x}")}
    if isinstance(value, ctypes.Structure | ctypes.Union):
        return {"fields": {name: plain(getattr(value, name), handles)
                           for name, *_ in value._fields_}}  # fmt: skip
    if isinstance(value, ctypes.Array):
        return [plain(v, handles) for v in value]
    if isinstance(value, bytes):
        return {"bytes": value.decode(errors="replace")}
    if isinstance(value, tuple | list):
        return [plain(v, handles) for v in value]
    return value


class Recorder:
    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.handles: dict[int, str] = {}  # a handle's address -> its name

    def name_handle(self, handle: Any, name: str) -> None:
        self.handles[ctypes.cast(handle, ctypes.c_void_p).value or 0] = name

    def wrap(self, fname: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            entry: dict[str, Any] = {
                "call": fname,
                "args": [plain(a, self.handles) for a in args],
                "kwargs": {k: plain(v, self.handles) for k, v in kwargs.items()},
            }
            try:
                result = fn(*args, **kwargs)
            except pynvml.NVMLError as e:
                entry["error"] = e.value
                self.calls.append(entry)
                raise
            self._name_result(fname, entry["args"], result)
            entry["result"] = plain(result, self.handles)
            self.calls.append(entry)
            return result

        return call

    def _name_result(self, fname: str, args: list[Any], result: Any) -> None:
        if fname == "nvmlDeviceGetHandleByIndex":
            self.name_handle(result, f"gpu{args[0]}")
        elif fname == "nvmlDeviceGetMigDeviceHandleByIndex":
            self.name_handle(result, f"{args[0]['handle']}/mig{args[1]}")
        elif fname == "nvmlDeviceGetGpuInstanceById":
            self.name_handle(result, f"{args[0]['handle']}/gi{args[1]}")


def profiles(nv: Any) -> list[dict[str, Any]]:
    """Each GPU's GPU instance profiles as NVML describes them (read-only: nothing is created)."""
    out = []
    for index in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(index)
        for pid in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            entry: dict[str, Any] = {"gpu": index, "profile_id": pid}
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, pid, version=2)  # with its name
                entry["info"] = plain(info, {})
            except nv.NVMLError as e:
                entry["error"] = e.value
            except Exception as e:  # an older binding: say so, keep the rest
                entry["error"] = f"{type(e).__name__}: {e}"
            out.append(entry)
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    recorder = Recorder()
    for fname in FUNCTIONS:
        setattr(pynvml, fname, recorder.wrap(fname, getattr(pynvml, fname)))
    nv = nvml.open_nvml()
    sample = nvml.collect(nv)
    calls = list(recorder.calls)
    hostname = socket.gethostname()
    for generation in GENERATIONS:
        options = dcgm.Options(hostname=hostname, generation=generation)
        (out / f"metrics-{generation.name}.txt").write_bytes(nvml.render(sample, options))
    document = {
        "hostname": hostname,
        "pynvml": getattr(pynvml, "__version__", None),
        "calls": calls,
        "profiles": profiles(nv),
    }
    (out / "nvml-calls.json").write_text(json.dumps(document, indent=1) + "\n")
    nv.nvmlShutdown()
    print(f"{len(calls)} NVML calls over {len(sample.gpus)} GPU(s) recorded in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
