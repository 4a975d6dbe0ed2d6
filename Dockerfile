# Image for both daemons:
#   docker run IMAGE                       -> python -m exporter
#   docker run IMAGE status_updater run    -> python -m status_updater run

ARG PYTHON_IMAGE=python:3.12-slim

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
COPY pyproject.toml README.md ./
COPY mig_exporter/ mig_exporter/
COPY topology/ topology/
COPY status_updater/ status_updater/
COPY exporter/ exporter/
# pip byte-compiles everything it installs: the pods run with a read-only root
# filesystem and PYTHONDONTWRITEBYTECODE=1, so the .pyc files must be in the image.
RUN /opt/venv/bin/pip install --no-cache-dir .

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="mig-exporter" \
      org.opencontainers.image.description="DCGM-compatible Prometheus exporter for MIG GPUs, simulated or read from NVML" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/venv /opt/venv
# PYTHONSAFEPATH: `python -m` must not put the working directory on sys.path.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONSAFEPATH=1 \
    PYTHONUNBUFFERED=1
# Numeric uid/gid so that Kubernetes' runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 9400
ENTRYPOINT ["python", "-m"]
CMD ["exporter"]
