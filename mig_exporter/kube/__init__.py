"""Kubernetes plumbing both daemons share: client config, backoff, list-then-watch."""
