"""The project's own namespace for what both daemons share and that has no domain of its own.

`mig_exporter.web` (the HTTP server and its web config), `mig_exporter.kube` (the Kubernetes
plumbing) and `mig_exporter.common` (the ground floor: bounded files and YAML, one-line messages,
self-metrics, process helpers) sit here rather than at the top of site-packages, where names so
generic would shadow, or be shadowed by, other distributions' packages. The daemons
(`exporter`, `status_updater`) and the domain (`topology`) stay top-level. Nothing is imported
here: each subpackage is imported by its own name.
"""
