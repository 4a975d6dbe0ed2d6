"""What dcgm-exporter writes in `err_msg` for an Xid (its collector's table, updated from the XID
errors of driver R580 in its PR #588): the codes this project serves. Any other code is
"Unknown Error", as there for a code past its table."""

from __future__ import annotations

UNKNOWN = "Unknown Error"
TEXTS = {
    0: "No Error",
    13: "Graphics Engine Exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors -- Most likely to see when running multiple cuda",
    48: "Double Bit ECC Error",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure",
    68: "NVDEC0 Exception",
    74: "NVLINK Error",
    79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate",
    94: "Contained ECC error",
    95: "Uncontained ECC error",
    109: "Context Switch Timeout Error",
    119: "GSP RPC Timeout",
    120: "GSP Error",
}


def xid_text(code: int) -> str:
    return TEXTS.get(code, UNKNOWN)
