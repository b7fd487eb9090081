"""The DAG layout lives in ``spark_backend.analysis.dag_layout`` (shared with the HTML
report); this name stays for the pages."""

from spark_backend.analysis.dag_layout import (  # noqa: F401
    EDGE_KINDS,
    STATUSES,
    edge_segments,
    layout,
    status,
    to_dot,
    to_svg,
)
