# day0 image: the engine + stage contract (`python -m day0.stage SPEC RESULT`) on any Python+torch base.
# Layer onto a vendor's stack with: docker build --build-arg BASE_IMAGE=<vendor pytorch image> \
#   --build-arg INSTALL_TORCH=0 -t day0:vendor .   (the vendor's torch is kept, never replaced)
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
ARG INSTALL_TORCH=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY day0 ./day0
COPY flows ./flows
COPY tasks ./tasks
RUN python3 -m venv --system-site-packages /opt/day0 \
 && if [ "$INSTALL_TORCH" = "1" ]; then /opt/day0/bin/pip install --no-cache-dir torch==2.13.0; fi \
 && /opt/day0/bin/pip install --no-cache-dir .

FROM ${BASE_IMAGE}
COPY --from=build /opt/day0 /opt/day0
COPY gates.yaml /etc/day0/gates.yaml
RUN useradd --create-home --uid 10001 day0
USER day0
ENV PATH=/opt/day0/bin:$PATH DAY0_GATES=/etc/day0/gates.yaml HF_HUB_OFFLINE=1
ENTRYPOINT ["python", "-m", "day0.stage"]
