"""The Grafana dashboard: the committed JSON is the generator's output, and it is what users import."""

from __future__ import annotations

import difflib
import json
import re
from pathlib import Path
from typing import Any

import pytest

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
}
GPU_FILTER = HOST_FILTER + ', gpu=~"$gpu"'
PROFILE_FILTER = 'GPU_I_PROFILE=~"(MIG )?($GPU_I_PROFILE)"'
# What 4.9.0 calls each field the panels read (and the factor back to the old unit).
RENAMED = {
    "DCGM_FI_DEV_FB_USED": "DCGM_FI_DEV_FB_USED_BYTES{%s} / 1048576",
    "DCGM_FI_DEV_FB_FREE": "DCGM_FI_DEV_FB_FREE_BYTES{%s} / 1048576",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO{%s}",
    "DCGM_FI_DEV_POWER_USAGE": "DCGM_FI_DEV_BOARD_POWER_WATTS{%s}",
}
HOSTNAME = 'label_replace(%s, "Hostname", "$1", "hostname", "(.+)")'
PROFILE = 'label_replace(%s, "GPU_I_PROFILE", "$1", "GPU_I_PROFILE", "MIG (.+)")'


@pytest.fixture(scope="module")
def committed() -> dict[str, Any]:
    model: dict[str, Any] = json.loads(COMMITTED.read_text(encoding="utf-8"))
    return model


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
    panels = committed["panels"]
    assert [p["title"] for p in panels] == list(UNITS)
    for panel in panels:
        assert panel["fieldConfig"]["defaults"]["unit"] == UNITS[panel["title"]], panel["title"]
        assert len(panel.get("description", "")) > 20, panel["title"]
    assert len({p["id"] for p in panels}) == len(panels)


def test_every_panel_and_target_uses_the_datasource_variable(committed: dict[str, Any]) -> None:
    for panel in committed["panels"]:
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target.get("datasource", DATASOURCE) == DATASOURCE, panel["title"]
            assert isinstance(target["expr"], str), panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_queries_filter_on_the_variables(committed: dict[str, Any]) -> None:
    by_title = {p["title"]: [t["expr"] for t in p["targets"]] for p in committed["panels"]}
    for title, exprs in by_title.items():
        for expr in exprs:
            # Every selector in the expression carries the filters, not just the first one.
            selectors = re.findall(r"DCGM_FI_\w+\{([^}]*)\}", expr)
            assert selectors, expr
            for selector in selectors:
                assert GPU_FILTER in selector, (title, expr)
                if title != "Power per GPU":
                    assert PROFILE_FILTER in selector, (title, expr)
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
    for expr in dashboard.queries(committed):
        olds = re.findall(r"(DCGM_FI_\w+)\{([^}]*)\} or ", expr)
        assert olds and len(olds) == len(re.findall(r"DCGM_FI_\w+\{", expr)) / 2, expr
        for old, matchers in olds:
            assert f"{old}{{{matchers}}} or {RENAMED[old] % matchers})" in expr, expr
        assert re.match(r"max by \(Hostname, gpu[,)].*label_replace\(", expr), expr
        assert expr.count('"Hostname", "$1", "hostname", "(.+)"') == 1, expr
        if "GPU_I_PROFILE" in expr.split(")")[0]:  # grouped by profile: the prefix taken off
            assert expr.count('"GPU_I_PROFILE", "$1", "GPU_I_PROFILE", "MIG (.+)"') == 1, expr


def test_pod_table(committed: dict[str, Any]) -> None:
    panel = committed["panels"][-1]
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
    exprs = dashboard.queries(committed)
    assert exprs == [t["expr"] for p in committed["panels"] for t in p["targets"]]
    assert len(exprs) == len(UNITS)


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
