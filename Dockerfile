# day0 image: the engine, the Prefect flows and the stage contract (`python -m day0.execution.stage SPEC RESULT`).
#
# Build (what `make images` does, offline, on a Debian base made by debootstrap):
#   scripts/build_images.sh        # -> day0/base:bookworm, build/wheelhouse/*.whl, day0:local
# Build on a machine with registry + PyPI access (torch comes from the PyTorch CPU index):
#   docker build -t day0:local .
# Layer day0 onto a vendor's PyTorch image, keeping the vendor's torch (never replaced):
#   docker build --build-arg BASE_IMAGE=<vendor pytorch image> --build-arg INSTALL_TORCH=0 \
#     [--build-arg WHEELHOUSE=0 when its Python is not 3.11] -t day0:vendor .
#   (the venv is created with --system-site-packages, torch is left out of the dependency list and
#    day0 itself is installed with --no-deps)
#
# No ENTRYPOINT: the Prefect Docker worker and day0's docker runner pass full commands, e.g.
#   docker run --rm day0:local python -m day0.execution.stage SPEC RESULT
#   docker run --rm day0:local prefect flow-run execute
# The venv (/opt/day0/venv) is first on PATH; the app folder /opt/day0/app holds flows/, tasks/,
# deploy/ and gates.yaml and is the working directory ($DAY0_HOME, see deploy/prefect.yaml).
ARG BASE_IMAGE=python:3.11-slim

# ---- build: a venv with day0's dependencies (one layer), then day0 (a later, small layer) ----
FROM ${BASE_IMAGE} AS deps
ARG INSTALL_TORCH=1
# WHEELHOUSE=auto: install offline (--no-index) from build/wheelhouse when it holds wheels
# (scripts/build_images.sh resolves them inside day0/base:bookworm, Python 3.11.2); WHEELHOUSE=0
# ignores it, e.g. for a vendor base with another Python.
ARG WHEELHOUSE=auto
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1
# Only what decides the dependency set: editing day0's code does not invalidate this stage.
# requirements.txt = [project].dependencies of pyproject.toml, less torch when INSTALL_TORCH=0
# (tomllib, or pip's vendored tomli on a vendor image's Python < 3.11).
COPY pyproject.toml /src/pyproject.toml
COPY build/wheelhouse/ /wheels/
RUN set -eu; \
    if [ "$INSTALL_TORCH" = "1" ]; then python3 -m venv /opt/day0/venv; \
    else python3 -m venv --system-site-packages /opt/day0/venv; fi; \
    /opt/day0/venv/bin/python -c "import re, sys; \
t = __import__('tomllib') if sys.version_info >= (3, 11) else __import__('pip._vendor.tomli', fromlist=['load']); \
deps = t.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']; \
[print(d) for d in deps if sys.argv[1] == '1' or re.match(r'[A-Za-z0-9_.-]+', d).group().lower() != 'torch']" \
      "$INSTALL_TORCH" > /src/requirements.txt; \
    cat /src/requirements.txt
# From the wheelhouse, through uv when it holds uv's wheel (scripts/build_images.sh adds it): the
# same wheels, the only ones there, installed and byte-compiled on every core instead of one
# (the dependency layer: ~200 s with pip on 2 cores); uv itself stays out of the image.
RUN set -eu; pip=/opt/day0/venv/bin/pip; \
    if [ "$WHEELHOUSE" != "0" ] && ls /wheels/uv-*.whl >/dev/null 2>&1; then \
      echo "installing from the wheelhouse (no index) with uv"; \
      python3 -m venv /tmp/uv && /tmp/uv/bin/pip install --quiet --no-index --find-links /wheels uv; \
      /tmp/uv/bin/uv pip install --python /opt/day0/venv/bin/python --no-index --find-links /wheels \
        --compile-bytecode --no-cache -r /src/requirements.txt; \
      rm -rf /tmp/uv; \
    elif [ "$WHEELHOUSE" != "0" ] && ls /wheels/*.whl >/dev/null 2>&1; then \
      echo "installing from the wheelhouse (no index)"; \
      $pip install --no-index --find-links /wheels -r /src/requirements.txt; \
    else \
      echo "no wheelhouse: torch from $TORCH_INDEX, the rest from PyPI"; \
      if [ "$INSTALL_TORCH" = "1" ]; then $pip install --index-url "$TORCH_INDEX" torch==2.13.0; fi; \
      $pip install -r /src/requirements.txt; \
    fi; \
    if [ "$INSTALL_TORCH" = "1" ]; then \
      /opt/day0/venv/bin/python -c "import torch, sys; print('torch', torch.__version__); sys.exit(torch.version.cuda is not None and 'CUDA torch installed')"; \
    fi

FROM deps AS app
ARG WHEELHOUSE=auto
COPY README.md /src/README.md
COPY day0 /src/day0
COPY flows /src/flows
COPY tasks /src/tasks
# --root: day0's files land under /stage/opt/day0/venv/..., so the final stage copies only them
# (a small layer) on top of the unchanged dependency layer.
RUN set -eu; pip=/opt/day0/venv/bin/pip; \
    if [ "$WHEELHOUSE" != "0" ] && ls /wheels/*.whl >/dev/null 2>&1; then idx="--no-index --find-links /wheels"; else idx=""; fi; \
    $pip install $idx --no-deps --no-warn-script-location --root /stage /src

# ---- runtime ----
FROM ${BASE_IMAGE}
ARG BASE_IMAGE
LABEL org.opencontainers.image.title="day0" \
      org.opencontainers.image.description="Day-0 validation of open-weight LLM checkpoints: analysis, operator scan, numerical alignment, release gates (Prefect flows + stage runner)." \
      org.opencontainers.image.version="0.1.0"
RUN (getent group 10001 >/dev/null || groupadd --gid 10001 day0) \
 && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/day0 --shell /bin/bash day0
COPY --from=deps /opt/day0/venv /opt/day0/venv
COPY --from=app /stage/opt/day0/venv /opt/day0/venv
COPY gates.yaml /opt/day0/app/gates.yaml
COPY deploy /opt/day0/app/deploy
COPY flows /opt/day0/app/flows
COPY tasks /opt/day0/app/tasks
# Code stays root-owned; out/ (the CLI's default results folder) is the user's.
RUN mkdir -p /opt/day0/app/out && chown 10001:10001 /opt/day0/app/out
ARG VCS_REF=unknown
LABEL org.opencontainers.image.revision="${VCS_REF}" \
      org.opencontainers.image.base.name="${BASE_IMAGE}"
# ${PATH:-...}: an image imported from a rootfs tarball (day0/base:bookworm) may carry no PATH at all.
ENV PATH=/opt/day0/venv/bin:${PATH:-/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin} \
    LANG=${LANG:-C.UTF-8} \
    VIRTUAL_ENV=/opt/day0/venv \
    DAY0_HOME=/opt/day0/app \
    DAY0_GATES=/opt/day0/app/gates.yaml \
    HF_HUB_OFFLINE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /opt/day0/app
USER 10001:10001
CMD ["day0", "--help"]
