# syntax=docker/dockerfile:1
# The gpuplane image that deploy/ runs (image `gpuplane`, tag = the package version): every component
# is `gpuplane <command>` in it, under UID 65532 with a read-only root filesystem.
#
#   docker build -t REGISTRY/gpuplane:0.1.0 .      (BuildKit; see docs/deploy.md, "The image")
#
# Stage 1 builds the wheel from this checkout. Stage 2 installs it into a virtual environment with
# the pinned versions of deploy/image/constraints.txt: the versions scripts/check-wheel.sh installs
# the same wheel with and checks, in CI. The base is Python 3.11, the Python those pins were made on.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM ${PYTHON_IMAGE}
ARG UID=65532
# Nothing is written outside /tmp at run time: the manifests mount an emptyDir there. Home, caches
# and matplotlib's configuration point into it, and Python writes no bytecode.
ENV PATH=/opt/gpuplane/bin:${PATH} \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    XDG_CONFIG_HOME=/tmp/.config \
    MPLCONFIGDIR=/tmp/matplotlib \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=wheel,source=/dist,target=/dist \
    --mount=type=bind,source=deploy/image/constraints.txt,target=/constraints.txt \
    python -m venv /opt/gpuplane \
    && /opt/gpuplane/bin/pip install --no-cache-dir --constraint /constraints.txt /dist/gpuplane-*.whl \
    && /opt/gpuplane/bin/gpuplane --version \
    && groupadd --gid "${UID}" gpuplane \
    && useradd --uid "${UID}" --gid "${UID}" --no-create-home --home-dir /tmp --shell /usr/sbin/nologin gpuplane
USER ${UID}:${UID}
WORKDIR /tmp
ENTRYPOINT ["gpuplane"]
CMD ["--help"]
