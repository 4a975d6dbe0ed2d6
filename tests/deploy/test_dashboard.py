"""The Grafana dashboard: the committed JSON is the generator's output, and it is what users import."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import pytest

from exporter.generations import GENERATIONS
from grafana import dashboard
from tests.support.base import ROOT

COMMITTED = ROOT / "grafana" / "mig-dashboard.json"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Each variable reads every dcgm-exporter generation (docs/upgrade.md): either frame buffer name,
# either hostname label, either profile name.
FB_USED = '__name__=~"DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_USED_BYTES"'
HOST_FILTER = 'Hostname=~"$Hostname|", hostname=~"$Hostname|"'
VARIABLES = {
    "Hostname": (
        f"query_result(count by (Hostname, hostname) ({{{FB_USED}}}))",
        '/[Hh]ostname="([^"]+)"/',
    ),
    "gpu": (f"label_values({{{FB_USED}, {HOST_FILTER}}}, gpu)", ""),
    "GPU_I_PROFILE": (
        f'label_values({{{FB_USED}, {HOST_FILTER}, gpu=~"$gpu"}}, GPU_I_PROFILE)',
        "/^(?:MIG )?(.+)$/",
    ),
}
# title -> unit; the panel order is the layout's.
UNITS = {
    "Frame buffer used per instance": "decmbytes",
    "Frame buffer free per instance": "decmbytes",
    "Memory used per instance (fraction)": "percentunit",
    "Graphics engine activity per instance": "percentunit",
    "Power per GPU": "watt",
    "Which pod holds which instance": "decmbytes",
    # The Health row (a row panel, "Health", before them): per physical GPU.
    "Last Xid per GPU": "none",
    "ECC errors per GPU (rate)": "cps",
    "Remapped rows and remap failure per GPU": "none",
    "PCIe replays and NVLink CRC errors per GPU (rate)": "cps",
    "Time throttled per GPU (fraction)": "percentunit",
    "GPUs reporting per node": "none",
}
HEALTH = list(UNITS)[6:]
# Per physical GPU: GPU-level fields, which the profile filter does not apply to.
PER_GPU = {"Power per GPU", *HEALTH}
GPU_FILTER = HOST_FILTER + ', gpu=~"$gpu"'
PROFILE_FILTER = 'GPU_I_PROFILE=~"(MIG )?($GPU_I_PROFILE)"'
# What 4.9.0 calls each field the panels read (and the factor back to the old unit).
RENAMED = {
    "DCGM_FI_DEV_FB_USED": "DCGM_FI_DEV_FB_USED_BYTES{%s} / 1048576",
    "DCGM_FI_DEV_FB_FREE": "DCGM_FI_DEV_FB_FREE_BYTES{%s} / 1048576",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO{%s}",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS{%s}",
    "DCGM_FI_DEV_XID_ERRORS": "DCGM_FI_DEV_XID_ERROR{%s}",
    "DCGM_FI_DEV_GPU_TEMP": "DCGM_FI_DEV_GPU_TEMP_CELSIUS{%s}",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL{%s}",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL{%s}",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": "DCGM_FI_DEV_ROW_REMAP_FAILED{%s}",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": "DCGM_FI_DEV_PCIE_REPLAY_TOTAL{%s}",
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL{%s}",
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL{%s}",
}
# Fields 4.9.0 serves under the same name.
SAME_NAME = {
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_THERMAL_VIOLATION", "DCGM_FI_DEV_POWER_VIOLATION",
}  # fmt: skip
HOSTNAME = 'label_replace(%s, "Hostname", "$1", "hostname", "(.+)")'
PROFILE = 'label_replace(%s, "GPU_I_PROFILE", "$1", "GPU_I_PROFILE", "MIG (.+)")'


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    model: dict[str, Any] = json.loads(COMMITTED.read_text(encoding="utf-8"))
    return model


def panels_of(model: dict[str, Any]) -> list[dict[str, Any]]:
    """The panels with queries: the rows aside."""
    return [p for p in model["panels"] if p["type"] != "row"]


def test_committed_json_is_the_generators_output() -> None:
    expected = dashboard.render(dashboard.build())
    actual = COMMITTED.read_text(encoding="utf-8")
    if actual != expected:
        diff = "".join(
            difflib.unified_diff(
                actual.splitlines(keepends=True),
                expected.splitlines(keepends=True),
                "grafana/mig-dashboard.json (committed)",
                "grafana/dashboard.py build()",
                n=2,
            )
        )
        pytest.fail(
            "grafana/mig-dashboard.json is out of date with grafana/dashboard.py; "
            "regenerate it with `python -m grafana.dashboard` and commit both.\n" + diff[:4000]
        )


def test_main_writes_stable_sorted_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "out.json"
    monkeypatch.setattr(dashboard, "OUTPUT", target)
    assert dashboard.main() == 0
    text = target.read_text(encoding="utf-8")
    assert text.endswith("}\n")
    assert text.startswith('{\n  "')
    model = json.loads(text)
    assert list(model) == sorted(model)
    assert text == dashboard.render(dashboard.build())


def test_identity(committed: dict[str, Any]) -> None:
    assert committed["uid"] == "mig-exporter"
    assert committed["title"] == "MIG instances (dcgm-exporter)"
    assert isinstance(committed["schemaVersion"], int)


def test_datasource_variable(committed: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in committed["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"


@pytest.mark.parametrize("name", VARIABLES)
def test_query_variables(committed: dict[str, Any], name: str) -> None:
    variables = {v["name"]: v for v in committed["templating"]["list"]}
    variable = variables[name]
    assert variable["type"] == "query"
    assert (variable["query"], variable.get("regex", "")) == VARIABLES[name]
    assert variable["datasource"] == DATASOURCE
    assert variable["multi"] is True
    assert variable["includeAll"] is True
    assert variable["allValue"] == ".*"


def test_panels_titles_units_and_descriptions(committed: dict[str, Any]) -> None:
    panels = panels_of(committed)
    assert [p["title"] for p in panels] == list(UNITS)
    rows = [p for p in committed["panels"] if p["type"] == "row"]
    assert [(r["title"], r["collapsed"]) for r in rows] == [("Health", False)]
    titles = [p["title"] for p in committed["panels"]]
    assert titles[titles.index("Health") + 1 :] == HEALTH  # the row holds the health panels
    for panel in panels:
        assert panel["fieldConfig"]["defaults"]["unit"] == UNITS[panel["title"]], panel["title"]
        assert len(panel.get("description", "")) > 20, panel["title"]
    assert len({p["id"] for p in committed["panels"]}) == len(committed["panels"])


def test_every_panel_and_target_uses_the_datasource_variable(committed: dict[str, Any]) -> None:
    for panel in panels_of(committed):
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", DATASOURCE) == DATASOURCE, panel["title"]
            assert isinstance(target["expr"], str), panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_queries_filter_on_the_variables(committed: dict[str, Any]) -> None:
    by_title = {p["title"]: [t["expr"] for t in p["targets"]] for p in panels_of(committed)}
    for title, exprs in by_title.items():
        for expr in exprs:
            # Every selector in the expression carries the filters, not just the first one.
            selectors = re.findall(r"DCGM_FI_\w+\{([^}]*)\}", expr)
            assert selectors, expr
            for selector in selectors:
                assert GPU_FILTER in selector, (title, expr)
                if title not in PER_GPU:
                    assert PROFILE_FILTER in selector, (title, expr)
                else:
                    assert "GPU_I_PROFILE" not in selector, (title, expr)
    power = f"(DCGM_FI_DEV_POWER_USAGE{{{GPU_FILTER}}} or DCGM_FI_DEV_BOARD_POWER_WATTS{{{GPU_FILTER}}})"
    assert by_title["Power per GPU"] == [f"max by (Hostname, gpu) ({HOSTNAME % power})"]
    used, free = (
        f"({old}{{{GPU_FILTER}, {PROFILE_FILTER}}} or "
        f"{RENAMED[old] % (GPU_FILTER + ', ' + PROFILE_FILTER)})"
        for old in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE")
    )
    ratio = PROFILE % (HOSTNAME % f"{used} / ({used} + {free})")
    assert by_title["Memory used per instance (fraction)"] == [
        f"max by (Hostname, gpu, GPU_I_PROFILE, GPU_I_ID) ({ratio})"
    ]


def test_queries_read_every_generation_as_2022s(committed: dict[str, Any]) -> None:
    """Each field under its old name or its 4.9.0 name, in the old unit, with the same
    filters; the result labelled `Hostname` from either label, profiles without `MIG `."""
    renamed_to = {new.split("{")[0] for new in RENAMED.values()}
    for expr in dashboard.queries(committed, opt_in=True):
        selectors = re.findall(r"(DCGM_FI_\w+)\{([^}]*)\}", expr)
        names = [name for name, _ in selectors]
        assert all(n in RENAMED or n in renamed_to or n in SAME_NAME for n in names), expr
        assert sum(n in RENAMED for n in names) == sum(n in renamed_to for n in names), expr
        olds = [(name, m) for name, m in selectors if name in RENAMED]
        for old, matchers in olds:
            new = RENAMED[old] % matchers
            # A gauge, or a counter's rate: either way the two names side by side.
            assert (
                f"{old}{{{matchers}}} or {new})" in expr
                or f"{old}{{{matchers}}}[5m]) or rate({new}[5m]))" in expr
            ), expr
        assert re.match(
            r"(count by \(Hostname\) \()?max by \(Hostname, gpu[,)].*label_replace\(", expr
        ), expr
        assert expr.count('"Hostname", "$1", "hostname", "(.+)"') == 1, expr
        if "GPU_I_PROFILE" in expr.split(")")[0]:  # grouped by profile: the prefix taken off
            assert expr.count('"GPU_I_PROFILE", "$1", "GPU_I_PROFILE", "MIG (.+)"') == 1, expr


def test_pod_table(committed: dict[str, Any]) -> None:
    (panel,) = [p for p in committed["panels"] if p["title"] == "Which pod holds which instance"]
    assert panel["type"] == "table"
    assert panel["gridPos"]["w"] == 24
    (target,) = panel["targets"]
    assert target["instant"] is True
    assert target["format"] == "table"
    assert target["expr"].startswith(
        "max by (Hostname, gpu, GPU_I_PROFILE, GPU_I_ID, exported_namespace, exported_pod, "
        "exported_container) (label_replace(label_replace((DCGM_FI_DEV_FB_USED{"
    )
    assert 'exported_pod!=""' in target["expr"]
    organize = [t for t in panel["transformations"] if t["id"] == "organize"]
    assert organize and organize[0]["options"]["excludeByName"] == {"Time": True}


def test_layout_fits_the_grid_without_overlaps(committed: dict[str, Any]) -> None:
    cells: set[tuple[int, int]] = set()
    for panel in committed["panels"]:
        pos = panel["gridPos"]
        assert pos["w"] in (12, 24), panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        mine = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine


def test_queries_returns_every_panel_expr_in_order(committed: dict[str, Any]) -> None:
    exprs = dashboard.queries(committed, opt_in=True)
    assert exprs == [t["expr"] for p in panels_of(committed) for t in p["targets"]]
    assert len(exprs) == len(UNITS) + 6  # ECC, remapped rows, PCIe/NVLink, throttled: more lines
    # By default, the queries a default exporter has data for: no opt-in field.
    opt_in = {n for f in dashboard.OPT_IN for n in (f.old, f.new) if n}
    assert dashboard.queries(committed) == [
        e for e in exprs if not set(re.findall(r"DCGM_FI_\w+", e)) & opt_in
    ]
    assert len(dashboard.queries(committed)) == len(exprs) - 6


def test_opt_in_fields_are_those_no_default_counters_file_has(committed: dict[str, Any]) -> None:
    """What `queries` leaves out by default is exactly what no generation collects by default:
    every other field the dashboard reads is in every generation's default file, by one of its
    names."""
    defaults = {g.name: g.counters_file.read_text() for g in GENERATIONS}
    read = {
        n for e in dashboard.queries(committed, opt_in=True) for n in re.findall(r"DCGM_FI_\w+", e)
    }
    opt_in = {n for f in dashboard.OPT_IN for n in (f.old, f.new) if n}
    for name in read & opt_in:
        assert not any(re.search(rf"^{name},", text, re.M) for text in defaults.values()), name
    for field in (dashboard.XID, dashboard.GPU_TEMP, dashboard.REMAP_FAILURE, dashboard.PCIE_REPLAY,
                  dashboard.REMAPPED_CORRECTABLE, dashboard.REMAPPED_UNCORRECTABLE):  # fmt: skip
        for generation, text in defaults.items():
            assert re.search(rf"^({field.old}|{field.new}),", text, re.M), (field, generation)


def test_queries_skips_targets_without_expr() -> None:
    model = {
        "panels": [
            {"targets": [{"expr": "up"}, {"refId": "B"}, {"expr": ""}]},
            {"type": "text"},
            {"targets": [{"expr": 'DCGM_FI_DEV_FB_FREE{gpu=~"$gpu"}'}]},
        ]
    }
    assert dashboard.queries(model) == ["up", 'DCGM_FI_DEV_FB_FREE{gpu=~"$gpu"}']


def test_queries_are_plain_promql_once_variables_are_substituted(
    committed: dict[str, Any],
) -> None:
    for expr in dashboard.queries(committed):
        assert "$__" not in expr, expr
        plain = re.sub(r"\$(Hostname|gpu|GPU_I_PROFILE)\b", ".*", expr)
        assert "$" not in plain.replace('"$1"', ""), expr  # label_replace's own $1 aside
        assert plain.count("(") == plain.count(")"), expr
        assert plain.count("{") == plain.count("}"), expr
