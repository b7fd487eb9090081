"""The dashboard's figures live in ``spark_backend.analysis.figures`` (shared with the HTML
report); this name stays for the pages."""

from spark_backend.analysis.figures import *  # noqa: F403
from spark_backend.analysis.figures import (  # noqa: F401
    CLICKABLE_BARS,
    EDGE_COLOUR,
    HIGHLIGHT,
    STATUS_COLOUR,
    dag_figure,
    lag_figure,
    lag_over_time_figure,
    txn_count_figure,
    txn_density_figure,
    txn_figure,
)
