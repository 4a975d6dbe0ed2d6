"""docs/upgrade.md, written from the generation table: `python -m exporter.upgrade > docs/upgrade.md`
(`make docs-upgrade`; a test fails when the page and the table disagree)."""

from __future__ import annotations

from exporter import dcgm
from exporter.fields import ALIASES, canonical
from exporter.generations import GENERATIONS, Generation

_ROWS: list[tuple[str, object]] = [
    ("`pci_bus_id` after `UUID`", lambda g: "yes" if g.bus_label else "no"),
    ("hostname label", lambda g: f"`{g.hostname_label}`"),
    ("a device nobody holds", lambda g: "`container`, `namespace`, `pod` empty"
     if g.free_pod_labels else "no pod labels"),
    ("order", lambda g: "families by name, series by label signature" if g.sorted_output
     else "the counters file's, then the GPUs'"),
    ("values", lambda g: "Go's shortest form (`115.325`, `4.335301032e+09`)"
     if g.value_style == "go" else "`%d`, or `%f` for doubles (`115.325000`)"),
    ("`GPU_I_PROFILE`", lambda g: "DCGM's (`7g.79gb`)" if g.profile_names == "dcgm"
     else "NVML's, as NVML returns it (`MIG 7g.80gb`)"),
    ("`DCGM_FI_DEV_XID_ERRORS`", lambda g: "`err_code`, `err_msg`" if g.xid_labels else "value only"),
    ("a GPU without an Xid yet", lambda g: "no `DCGM_FI_DEV_XID_ERRORS` series (blank)"
     if g.xid_blank else "`DCGM_FI_DEV_XID_ERRORS` 0"),
    ("`--kubernetes-enable-dra`", lambda g: "yes" if g.dra else "no"),
    ("`--kubernetes-enable-pod-uid`", lambda g: "no" if not g.pod_uid else
     "`pod_uid` on pods, replicas and DRA copies" if g.dra_pod_uid else
     "`pod_uid` on pods and replicas, not DRA copies"),
    ("`--kubernetes-virtual-gpus`", lambda g: "each holder's own `FB_USED`, `GPU_UTIL` (with "
     "`pod_uid`) beside the device's" if g.per_process else "the device's values on every copy"),
    ("DRA `dra_mig_device_uuid` unknown", lambda g: "-" if not g.dra else "`\"\"`" if g.dra_uuid_always else "left out"),
    ("`--kubernetes-enable-pod-labels`", lambda g: "sanitised, in name order with the label fields"
     if g.pod_labels else "no"),
    ("`--enable-exporter-metrics`", lambda g: f"`go_*` ({g.go}), `process_*`, `promhttp_*`"
     if g.exporter_metrics else "no"),
]  # fmt: skip


def _number(x: float) -> str:
    return "2^20" if x == 1 << 20 else f"{x:,.0f}" if x >= 1 else f"{x:g}"


def _unit(name: str) -> str:
    alias = ALIASES.get(name)
    if alias is None or alias.scale == 1:
        return ""
    return f" (x {_number(alias.scale)})"


def _fields() -> list[str]:
    by_generation = {
        g.name: {canonical(n): n for n in _names(g)} for g in GENERATIONS
    }  # canonical name -> served name
    every = list(dict.fromkeys(k for names in by_generation.values() for k in names))
    header = "| field | " + " | ".join(g.name for g in GENERATIONS) + " |"
    lines = [header, "|" + " --- |" * (len(GENERATIONS) + 1)]
    for field in every:
        cells = []
        for g in GENERATIONS:
            name = by_generation[g.name].get(field)
            cells.append(
                "-" if name is None else "same" if name == field else f"`{name}`{_unit(name)}"
            )
        lines.append(f"| `{field}` | " + " | ".join(cells) + " |")
    return lines


def _names(g: Generation) -> list[str]:
    counters = dcgm.default_counters(g)
    return [c.name for c in counters.metrics] + list(counters.labels)


def _queries() -> list[str]:
    last = GENERATIONS[-1]
    lines = []
    for name in _names(last):
        alias = ALIASES.get(name)
        if alias is None or alias.scale == 1:
            continue
        factor = 1 / alias.scale
        lines.append(f"| `{alias.field}` | `{name} * {factor:g}` |" if factor >= 1
                     else f"| `{alias.field}` | `{name} / {_number(alias.scale)}` |")  # fmt: skip
    return lines


def page() -> str:
    names = " | ".join(g.name for g in GENERATIONS)
    out = [
        "# Upgrading dcgm-exporter: what each generation serves",
        "",
        "<!-- Written by `make docs-upgrade` from exporter/generations.py and exporter/counters/;",
        "     edit those, not this page. -->",
        "",
        "`--dcgm-exporter-version` (env `DCGM_EXPORTER_VERSION`) chooses which dcgm-exporter the",
        "exporter is, so a dashboard, alert or recording rule can be tried against the release it",
        "will meet, and an upgrade rehearsed before it is made. The default is 2022, the",
        "generation of the run:ai dumps the design card's samples are; `--kubernetes-enable-dra`",
        "without a version is 4.8.3, the first with DRA.",
        "",
        "| generation | also | released | DCGM | facts read from |",
        "| --- | --- | --- | --- | --- |",
        *(f"| {g.name} | {', '.join(g.aliases) or '-'} | {g.released} | {g.dcgm} | {g.source} |"
          for g in GENERATIONS),
        "",
        "## The exposition",
        "",
        f"| | {names} |",
        "|" + " --- |" * (len(GENERATIONS) + 1),
        *(f"| {title} | " + " | ".join(row(g) for g in GENERATIONS) + " |"  # type: ignore[operator]
          for title, row in _ROWS),
        "",
        "Labels come in dcgm-exporter's order: `gpu, UUID, [pci_bus_id,] device, modelName,",
        "[GPU_I_PROFILE, GPU_I_ID,] hostname`, the label fields, then (from 4.8.3 sorted by name)",
        "`container`, the `dra_*` labels, `err_code`, `err_msg`, `namespace`, `pod`, `vgpu`.",
        "",
        "## The default fields, by generation",
        "",
        "Each generation collects its counters file (`exporter/counters/<generation>.csv`). A",
        "file of your own (`-f/--collectors`) may name a field by either name: the name served is",
        "the file's, and a base-unit name serves its unit (x: the factor from the legacy unit).",
        "",
        *_fields(),
        "",
        "## A query across the upgrade to the newest generation",
        "",
        "| 2022 to 4.8.4 | from 4.9.0 |",
        "| --- | --- |",
        *_queries(),
        "| `{Hostname=...}` (2022) | `{hostname=...}` (from 4.8.3) |",
        "| `DCGM_FI_DRIVER_VERSION` label | `DCGM_FI_SYSTEM_DRIVER_VERSION` label |",
        "| a free device: `pod=\"\"` (2022) | no `pod` label (from 4.8.3): `{pod=\"\"}` still selects it |",
        "",
        "To read both sides at once, select both names in the old unit",
        "(`DCGM_FI_DEV_FB_USED or DCGM_FI_DEV_FB_USED_BYTES / 2^20`), match both hostname labels,",
        "and take `MIG ` off `GPU_I_PROFILE`: the shipped dashboard and rules do this, proven",
        "against a real Prometheus scraping every generation",
        "([prometheus-grafana.md](prometheus-grafana.md#every-generation)). A profile DCGM and",
        "NVML name apart (`7g.79gb` and `7g.80gb` on an A100 80GB, most of an H200's) is not",
        "joined across the 4.8.4 upgrade: that would need a table per GPU model.",
        "",
        "## What no code or real output settled",
        "",
        "- **4.9.0**: no 4.9.0 code, counters file or real line could be read. Its names are",
        "  DCGM 4.6's canonical names (`#define OLD NEW` in dcgm_fields.h) and go-dcgm's base-unit",
        "  fields, its unit changes and `DCGM_FI_DEV_FB_CAPACITY_BYTES` its release notes'; its",
        "  help texts are this project's. NVLink's factor (x 1,024,000) is inferred from DCGM's",
        "  legacy formula (KiB/s / 1000); whether energy in J keeps decimals is not known. The",
        "  rest of its output is 4.8.4's.",
        "- **4.8.4**: its counters file was read in part (two help texts changed, opt-in power",
        "  limit and fabric health rows); the other rows are 4.8.3's. `GPU_CI_ID`, on compute",
        "  instance entities only, is not served.",
        "- **`GPU_I_PROFILE` from 4.8.4** is NVML's profile name copied as NVML returns it. NVML",
        "  returns it with a `MIG ` prefix (`MIG 1g.18gb`: tests/reference/nvml/, a real H200);",
        "  no real 4.8.4 line has been quoted to confirm the label.",
        "- **Value form**: Go's `strconv` rule applied by hand; no Go toolchain ran here.",
        "- **`--enable-exporter-metrics`**: `process_*` and `promhttp_*` are this process's own;",
        "  of the Go runtime only `go_info`, `go_goroutines` and `go_threads` are served (its",
        "  memory and garbage-collector series have nothing true to say of a Python process).",
        "  Their values print in Python's form (`4.0`), which Prometheus reads alike.",
        "- **`pod_uid`** is the pod's `metadata.uid` as the updater writes it in the topology",
        "  (`pod-uid`); a pod from a file without one has none. The per-process copies of",
        "  `--kubernetes-virtual-gpus` always carry it, as dcgm-exporter's do.",
        "- **Per-process values** (`--kubernetes-virtual-gpus`, from 4.5.3, its #594): each",
        "  holder's `FB_USED` and `GPU_UTIL` are its simulated usage, shared out so that they",
        "  add up to the device's; dcgm-exporter reads its processes through NVML (`hostPID`",
        "  needed) and a pod without a process reads 0, as the reservation pods of KAI do.",
        "- **Pod labels** come from the topology: the updater copies them with `--pod-labels`",
        "  (as dcgm-exporter reads them from its pod informer). Python's `re` stands for Go's RE2",
        "  in the allowlist (the same for the patterns users write: no look-arounds in RE2).",
        "",
    ]  # fmt: skip
    return "\n".join(out)


if __name__ == "__main__":
    print(page(), end="")
