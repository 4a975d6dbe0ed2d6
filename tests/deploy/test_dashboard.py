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
VARIABLES = {
    "Hostname": "label_values(DCGM_FI_DEV_FB_USED, Hostname)",
    "gpu": 'label_values(DCGM_FI_DEV_FB_USED{Hostname=~"$Hostname"}, gpu)',
    "GPU_I_PROFILE": (
        'label_values(DCGM_FI_DEV_FB_USED{Hostname=~"$Hostname", gpu=~"$gpu"}, GPU_I_PROFILE)'
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
GPU_FILTER = 'Hostname=~"$Hostname", gpu=~"$gpu"'
PROFILE_FILTER = 'GPU_I_PROFILE=~"$GPU_I_PROFILE"'


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
def test_label_values_variables(committed: dict[str, Any], name: str) -> None:
    variables = {v["name"]: v for v in committed["templating"]["list"]}
    variable = variables[name]
    assert variable["type"] == "query"
    assert variable["query"] == VARIABLES[name]
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
    assert by_title["Power per GPU"] == [
        'max by (Hostname, gpu) (DCGM_FI_DEV_POWER_USAGE{Hostname=~"$Hostname", gpu=~"$gpu"})'
    ]
    ratio = by_title["Memory used per instance (fraction)"][0]
    assert re.fullmatch(
        r"DCGM_FI_DEV_FB_USED\{[^}]*\} / \(DCGM_FI_DEV_FB_USED\{[^}]*\} \+ "
        r"DCGM_FI_DEV_FB_FREE\{[^}]*\}\)",
        ratio,
    ), ratio


def test_pod_table(committed: dict[str, Any]) -> None:
    panel = committed["panels"][-1]
    assert panel["type"] == "table"
    assert panel["gridPos"]["w"] == 24
    (target,) = panel["targets"]
    assert target["instant"] is True
    assert target["format"] == "table"
    assert target["expr"].startswith(
        "max by (Hostname, gpu, GPU_I_PROFILE, GPU_I_ID, exported_namespace, exported_pod, "
        "exported_container) (DCGM_FI_DEV_FB_USED{"
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
        assert "$" not in plain, expr
        assert plain.count("(") == plain.count(")"), expr
        assert plain.count("{") == plain.count("}"), expr
