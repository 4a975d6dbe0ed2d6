"""Whatever the input, `/metrics` is an exposition Prometheus accepts whole: the HELP of a counters
file's help text, and sample values that could be no float (a 400-digit `gpu-memory`, NaN).

One bad line makes Prometheus drop the whole scrape, so each is checked by both readers a user has:
prometheus_client's parser and promtool's (the Go parser Prometheus itself uses).
"""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter import dcgm
from exporter.fields import FIELDS, GPU, XID_COUNT, Counter, Counters
from exporter.readings import Reading
from tests.exporter.test_exporter import whole_gpu
from tests.support import oracle
from tests.support.base import SAMPLES, examples, run_cli
from tests.support.promtext import parse, promtool_findings

SAMPLE = SAMPLES / "topology" / "a100-40gb-active.yaml"
NODE = "qa-mig-worker-gpu-a100"


def promtool_problem(text: str) -> str | None:
    """What promtool rejects in the exposition, or None (DCGM's own naming is no problem, nor an
    empty help: a counters file may give one)."""
    return "\n".join(promtool_findings(text, allowed=("no help text",))) or None


def docs(text: str) -> dict[str, str]:
    """Each family's HELP as Prometheus' client reads it back (counters lose `_total`)."""
    return {f.name: f.documentation for f in text_string_to_metric_families(text)}


# --- HELP ----------------------------------------------------------------------------------------


def test_a_counters_files_backslash_is_a_help_prometheus_reads(tmp_path: Path) -> None:
    csv = tmp_path / "counters.csv"
    csv.write_text(
        "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C\\F).\n"
        "DCGM_FI_DEV_FB_USED, gauge, Used \\n not a line break \\\\ two.\n"
    )
    out = run_cli("exporter", "--topology-file", str(SAMPLE), "--node-name", NODE, "--once",
                  "-f", str(csv))  # fmt: skip
    assert (out.returncode, out.stderr) == (0, "")
    assert "# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C\\\\F).\n" in out.stdout
    assert docs(out.stdout) == {
        "DCGM_FI_DEV_GPU_TEMP": "GPU temperature (in C\\F).",
        "DCGM_FI_DEV_FB_USED": "Used \\n not a line break \\\\ two.",
    }
    assert promtool_problem(out.stdout) is None


# What a counters file's help can be: any text but a lone surrogate (the file is UTF-8), with no
# blank at either end (a CSV cell is stripped), line breaks included where a caller builds one.
# The pieces the text format gives a meaning to come often, any other text between them.
PIECES = st.sampled_from(["\\", "\n", "\\n", "\\\\", '"', "#", " ", "\t", "\r", "{}"])
HELPS = st.lists(PIECES | st.text(st.characters(blacklist_categories=("Cs",)), max_size=6),
                 max_size=8).map(lambda pieces: "".join(pieces).strip())  # fmt: skip
METRICS = [name for name, f in FIELDS.items() if GPU in f.where]


@settings(derandomize=True, max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.lists(HELPS, min_size=1, max_size=6))
def test_any_help_text_is_valid_exposition_and_reads_back(helps: list[str]) -> None:
    counters = Counters(
        tuple(
            Counter(FIELDS[name], "gauge", h, name) for name, h in zip(METRICS, helps, strict=False)
        ),
        ("DCGM_FI_DRIVER_VERSION",),
    )
    node = whole_gpu(50, 50).nodes["n"]
    text = dcgm.render(node, dcgm.Options("h", counters=counters), 1_790_000_000).decode()
    assert docs(text) == {c.name: c.help for c in counters.metrics}
    assert promtool_problem(text) is None


# --- sample values -------------------------------------------------------------------------------

INTEGERS = st.integers(-(10**400), 10**400) | st.sampled_from([10**308, 2**1024, 10**400])
VALUES = st.none() | INTEGERS | st.floats(allow_nan=True, allow_infinity=True)


def writable(value: float | None) -> bool:
    """A value the exposition can carry: a float within range, finite."""
    try:
        return value is not None and math.isfinite(float(value))
    except OverflowError:
        return False


@settings(derandomize=True, max_examples=examples(60), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
@given(st.fixed_dictionaries({name: VALUES for name in Reading._fields}))
def test_a_value_that_is_no_finite_float_is_left_out_and_the_rest_served(
    values: dict[str, float | None],
) -> None:
    """Every field of every reading, from either source: NaN, infinities, integers past a
    float's range are left out (a series DCGM has no value for); every other value is served."""
    reading = Reading(**values)
    every = Counters(tuple(Counter(f, "gauge", "x", f.name) for f in FIELDS.values()), ())
    options = dcgm.Options(hostname="h", counters=every)
    labels = (("gpu", "0"), ("Hostname", "h"))
    text = dcgm.join([dcgm.subject_fragments([(GPU, labels, reading)], options)], options).decode()
    served = {s.name: s.value for s in parse(text)}
    expected = {
        f.name: f.read(reading) for f in FIELDS.values() if GPU in f.where
        if writable(f.read(reading)) and f.name != XID_COUNT  # Xid counts: tests/exporter/test_faults.py
    }  # fmt: skip
    assert served.keys() == expected.keys()
    for name, value in expected.items():
        assert value is not None
        assert math.isclose(served[name], int(value) if not FIELDS[name].decimal else value,
                            rel_tol=1e-6, abs_tol=1e-6)  # fmt: skip
    assert promtool_problem(text) is None


def test_a_400_digit_gpu_memory_leaves_out_the_memory_it_cannot_write() -> None:
    """A topology the model accepted with a gpu-memory no GPU has (a Python int of 400 digits),
    on a model the catalog does not know: its memory series go, the GPU's others stay."""
    node = whole_gpu(50, 50).nodes["n"]
    from dataclasses import replace

    huge = replace(node, gpu_product="Some-Future-GPU", gpu_memory=10**400)
    text = dcgm.render(huge, dcgm.Options("h"), 1_790_000_000).decode()
    names = {s.name for s in parse(text)}
    assert "DCGM_FI_DEV_FB_FREE" not in names
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED"} <= names
    assert promtool_problem(text) is None
    families = {f.name for f in oracle.families(huge, dcgm.Options("h"), 1_790_000_000)}
    assert families == names
